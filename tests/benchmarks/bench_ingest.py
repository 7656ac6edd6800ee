"""Benchmark (issue 2, acceptance 5): ingest a generated 2-million-row Azure-format CSV.

Run:  python tests/benchmarks/bench_ingest.py [--rows 2000000] [--repeat 3] [--json]

The CSV resamples the real Azure conv trace's lengths (or the shipped sample when ../shared is absent)
with Poisson arrivals written in Azure's timestamp format (7 fractional digits). Each measurement runs in
its own process so peak RSS (ru_maxrss) is that run's alone; the figure is the median wall time of the
work itself (read + validate + write parquet), imports excluded, for odmactl's ingest path and for
polars' own read_csv + write_parquet of the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import resource, sys, time, json
from pathlib import Path
import polars as pl
mode, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if mode == "odmactl":
    from odmactl.trace.readers import ingest
    from odmactl.trace.readers.options import ReadOptions
    from odmactl.trace.schema import ArrivalOptions, write_trace
    t0 = time.perf_counter()
    trace, _ = ingest([src], "auto", ReadOptions(), ArrivalOptions())
    write_trace(trace, out, force=True)
    rows = trace.frame.height
else:
    t0 = time.perf_counter()
    frame = pl.read_csv(src)
    frame.write_parquet(out)
    rows = frame.height
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "rows": rows, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_csv(path: Path, rows: int, seed: int = 0) -> None:
    import numpy as np
    import polars as pl

    shared = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv.gz"
    src = pl.read_csv(shared if shared.exists() else ROOT / "traces" / "azure_conv_2023_sample.csv.gz")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, src.height, rows)
    start = np.datetime64("2023-11-16T18:15:46.680590")
    offsets_us = (np.cumsum(rng.exponential(0.05, rows)) * 1e6).astype("timedelta64[us]")
    stamps = pl.Series(start + offsets_us).dt.strftime("%Y-%m-%d %H:%M:%S%.6f") + "0"
    pl.DataFrame({
        "TIMESTAMP": stamps,
        "ContextTokens": src["ContextTokens"].gather(idx),
        "GeneratedTokens": src["GeneratedTokens"].gather(idx),
    }).write_csv(path)


def run(mode: str, src: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(out)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "azure_2m.csv"
        make_csv(src, args.rows)
        results = {}
        for mode in ("polars", "odmactl"):
            runs = [run(mode, src, Path(tmp) / f"{mode}.parquet") for _ in range(args.repeat)]
            assert all(r["rows"] == args.rows for r in runs)
            wall = statistics.median(r["wall_s"] for r in runs)
            results[mode] = {"median_wall_s": wall, "rows_per_s": args.rows / wall,
                             "peak_rss_mib": max(r["peak_rss_mib"] for r in runs), "runs_s": [r["wall_s"] for r in runs]}
        summary = {
            "rows": args.rows, "csv_mib": src.stat().st_size / 2**20,
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_implementation()} {platform.python_version()}",
            **results,
            "ratio_odmactl_to_polars": results["odmactl"]["median_wall_s"] / results["polars"]["median_wall_s"],
        }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{args.rows:,} rows, {summary['csv_mib']:.1f} MiB CSV on {summary['machine']}")
    for mode in ("polars", "odmactl"):
        r = results[mode]
        print(f"  {mode:8s} {r['median_wall_s']:.3f} s median  {r['rows_per_s'] / 1e6:.2f} M rows/s  peak RSS {r['peak_rss_mib']:.0f} MiB")
    print(f"  ratio odmactl / polars read_csv+write_parquet: {summary['ratio_odmactl_to_polars']:.2f}")


if __name__ == "__main__":
    main()
