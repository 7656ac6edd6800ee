"""Benchmark: `odmactl capacity` on a 20,000-request trace, 4 policies x tp 1, 2 and 4.

Issue 27, acceptance 4; issue 36, acceptance 4. Static runs twice (at max_model_len and at prompt +
1,024, the ODMA papers' baseline), so a run has 15 policy x tp rows.

Run:  python tests/benchmarks/bench_capacity.py [--case servegen|azure-conv|both] [--requests 20000]
                                                [--workers 1,2] [--json]

Two cases, each the real command in this process (`odmactl capacity ... --json`) with the oracle
predictor and the SLO TTFT p99 <= 2 s, TPOT p99 <= 100 ms:
- servegen (issue 27): bench_replay.py's ServeGen reason/deepseek-r1 workload cut to `--requests`
  (cached under $TMPDIR), DeepSeek-R1-Distill-Qwen-7B on an A100-80GB: mostly underloaded probes;
- azure-conv (issue 36): the first `--requests` of Azure LLM inference conv 2023
  (../shared/traces), DeepSeek-R1-Distill-Qwen-7B on an MLU370-X4: one card serves a small share of
  the trace's rate, so most probes are overloaded, and static at tp 1 needs dozens of engines for
  the trace's peak rate (the replica search).
The wall time covers reading the trace, every replay of the bisection and of the replica search,
and the JSON. With more than one worker count it also checks that they all give byte-identical
JSON. The traces are cached under $TMPDIR by request count: delete them to regenerate.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import MODEL, SHARED, trace_path  # noqa: E402

AZURE_CONV = SHARED.parent / "AzureLLMInferenceTrace_conv.csv.gz"
CASES = {"servegen": "a100-80gb-sxm", "azure-conv": "mlu370-x4"}


def azure_conv_path(requests: int) -> Path:
    from odmactl.cli import main
    from odmactl.trace.schema import read_trace

    path = Path(tempfile.gettempdir()) / f"odmactl-bench-azure-conv-{requests}.parquet"
    if not path.exists():
        full = path.with_suffix(".full.parquet")
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["ingest", str(AZURE_CONV), "--out", str(full), "--force", "--json"])
        if code != 0:
            sys.exit("ingest failed")
        read_trace(full).head(requests).write_parquet(path)
        full.unlink()
    return path


def run_case(case: str, requests: int, workers_list: list[int], engine: str | None = None,
             router: str | None = None) -> dict:
    from odmactl.cli import main as odmactl

    path = trace_path(requests) if case == "servegen" else azure_conv_path(requests)
    runs, outputs = [], set()
    for workers in workers_list:
        buffer = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(buffer):
            code = odmactl(["capacity", str(path), "--device", CASES[case], "--model", MODEL,
                            "--slo", "ttft_p99=2s,tpot_p99=100ms", "--predictor", "oracle", "--tp", "1,2,4",
                            "--workers", str(workers), "--json", *(["--engine", engine] if engine else []),
                            *(["--router", router] if router else [])])
        seconds = time.perf_counter() - started
        if code != 0:
            sys.exit(f"capacity failed ({code})")
        outputs.add(buffer.getvalue())
        doc = json.loads(buffer.getvalue())
        runs.append({"workers": workers, "seconds": round(seconds, 2), "rows": len(doc["rows"]),
                     "probes": sum(len(r["probes"]) for r in doc["rows"]),
                     "overloaded_probes": sum(any(f[0] == "overloaded" for f in p["failures"])
                                              for r in doc["rows"] for p in r["probes"])})
    return {"trace": str(path), "requests": requests, "device": CASES[case], "engine": engine or "the device's",
            "router": router or "capacity's default",
            "runs": runs,
            "identical_across_workers": len(outputs) == 1 if len(runs) > 1 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=(*CASES, "both"), default="both")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--engine", default=None, help="vllm-v0 or vllm-v1 (default: each device profile's)")
    parser.add_argument("--router", default=None, help="capacity's --router (default: capacity's own)")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "cases": {case: run_case(case, args.requests, workers, args.engine, args.router)
                        for case in (CASES if args.case == "both" else (args.case,))}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for case, r in report["cases"].items():
        for run in r["runs"]:
            print(f"{case} on {r['device']}, workers {run['workers']}: {run['seconds']} s for {run['rows']} policy x tp "
                  f"rows ({run['probes']} probes, {run['overloaded_probes']} of them overloaded)")
        if r["identical_across_workers"] is not None:
            print(f"{case}: byte-identical JSON across worker counts: {r['identical_across_workers']}")
    print(report["machine"])


if __name__ == "__main__":
    main()
