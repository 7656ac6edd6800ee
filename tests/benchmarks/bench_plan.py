"""Benchmark (issue 7, acceptance 2): `odmactl plan` over a 100k-request trace, by worker count.

Run:  python tests/benchmarks/bench_plan.py [--requests 100000] [--workers 1,2] [--json]

The trace is bench_replay.py's ServeGen reason/deepseek-r1 trace (cached under $TMPDIR). Each run is
the full `odmactl plan` command in a fresh process: DeepSeek-R1-Distill-Qwen-7B on an A100-80GB,
max_model_len 32,768, the oracle predictor. That covers ingest-free loading, the cheap bounds over
all 2,160 candidates, 12 replays on the search part (70%), and 5 validation replays on the rest.
Reported: wall seconds and peak RSS per worker count, and whether the plans are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import trace_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trace = trace_path(args.requests)
    rows, plans = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in [int(w) for w in args.workers.split(",")]:
            out = Path(tmp) / f"plan-{workers}.toml"
            cmd = [str(Path(sys.executable).parent / "odmactl"), "plan", str(trace), "--device", "a100-80gb-sxm",
                   "--model", "DeepSeek-R1-Distill-Qwen-7B", "--max-model-len", "32768", "--predictor", "oracle",
                   "--out", str(out), "--workers", str(workers), "--json"]
            started = time.perf_counter()
            proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True)
            seconds = time.perf_counter() - started
            if proc.returncode not in (0, 1) or not proc.stdout.startswith("{"):  # 1: the pick failed its gate
                sys.exit(f"plan failed: {proc.stderr[-2000:]}")
            doc = json.loads(proc.stdout)
            doc.pop("out")
            plans.append(json.dumps(doc, sort_keys=True))
            rows.append({"workers": workers, "seconds": round(seconds, 1), "candidates": doc["candidates"],
                         "replayed": doc["replayed"], "peak_rss_mib": round(int(proc.stderr.split()[-1]) / 1024),
                         "chosen": doc["chosen"]["label"], "holds": doc["holds"]})
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
              "requests": args.requests, "identical_plans": len(set(plans)) == 1, "runs": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['machine']}; {args.requests:,} requests; identical plans: {result['identical_plans']}")
    for r in rows:
        print(f"  workers {r['workers']}: {r['seconds']:.1f} s, {r['candidates']:,} candidates, {r['replayed']} replayed, "
              f"peak RSS {r['peak_rss_mib']:,} MiB (main process); chose {r['chosen']}"
              + ("" if r["holds"] else " (fails its gate: no config written)"))


if __name__ == "__main__":
    main()
