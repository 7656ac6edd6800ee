"""Benchmark (issue 27, acceptance 4): `odmactl capacity` on a 20,000-request trace, 4 policies x tp
1, 2 and 4.

Run:  python tests/benchmarks/bench_capacity.py [--requests 20000] [--device a100-80gb-sxm] [--workers 1,2] [--json]

The trace is bench_replay.py's ServeGen reason/deepseek-r1 workload cut to `--requests` (cached
under $TMPDIR). Each run is the real command in this process (`odmactl capacity ... --json`) with
the oracle predictor and the SLO TTFT p99 <= 2 s, TPOT p99 <= 100 ms; the wall time covers reading
the trace, every replay of the bisection and of the replica search, and the JSON. It also checks
that every worker count gives byte-identical JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import trace_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--device", default="a100-80gb-sxm")
    parser.add_argument("--model", default="DeepSeek-R1-Distill-Qwen-7B")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from odmactl.cli import main as odmactl

    path = trace_path(args.requests)
    runs, outputs = [], set()
    for workers in (int(w) for w in args.workers.split(",")):
        buffer = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(buffer):
            code = odmactl(["capacity", str(path), "--device", args.device, "--model", args.model,
                            "--slo", "ttft_p99=2s,tpot_p99=100ms", "--predictor", "oracle", "--tp", "1,2,4",
                            "--workers", str(workers), "--json"])
        seconds = time.perf_counter() - started
        if code != 0:
            sys.exit(f"capacity failed ({code})")
        outputs.add(buffer.getvalue())
        doc = json.loads(buffer.getvalue())
        runs.append({"workers": workers, "seconds": round(seconds, 2), "rows": len(doc["rows"]),
                     "probes": sum(len(r["probes"]) for r in doc["rows"])})
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "trace": str(path), "requests": args.requests, "device": args.device, "runs": runs,
              "identical_across_workers": len(outputs) == 1}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for r in runs:
            print(f"workers {r['workers']}: {r['seconds']} s for {r['rows']} policy x tp rows ({r['probes']} probes)")
        print(f"byte-identical JSON across worker counts: {report['identical_across_workers']} ({report['machine']})")


if __name__ == "__main__":
    main()
