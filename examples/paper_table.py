"""The ODMA papers' comparison, replayed: DeepSeek-R1-Distill-Qwen-7B on a Cambricon MLU370-X4.

Run from the repository root (needs ../shared/traces; about 10 minutes on 2 CPU cores, mostly `fit`):

    python examples/paper_table.py --work /tmp/odmactl-paper --out examples/paper_table.md

For each trace it ingests the source, trains the length predictor (`odmactl fit`) on the earlier
requests, and replays the next 5,000 (with their own timestamps, re-based to 0) through static
(max_model_len 32,768 and 8,192), paged, s3 and odma with the fitted predictor, via the same code as
`odmactl replay --compare`. It writes the markdown table to --out and the full results beside it (.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"
TRACES = {
    # name: (ingest arguments, requests to train on, max_model_len of the dynamic policies, fit's split)
    "servegen reason/deepseek-r1": (["servegen/reason/deepseek-r1", "--format", "servegen", "--duration", "21600"],
                                    60_000, 16_384, "time"),
    # offline (no timestamps), and the 805 instructions recur across the 66 generators: split by prompt
    "alpaca_eval": (["alpaca_eval_model_outputs.jsonl.gz", "--offline"], 40_000, 8_192, "prompt"),
}
REPLAY_REQUESTS = 5_000
METRIC_KEYS = ("kv_utilization", "tps", "ttft_p99", "tpot_p99", "migration_rate", "peak_concurrency", "preemptions")


def run(args: list[str]) -> None:
    from odmactl.cli import main

    code = main(args)
    if code != 0:
        raise SystemExit(f"odmactl {' '.join(args)} failed ({code})")


def prepare(work: Path, name: str, ingest_args: list[str], train_rows: int, max_len: int, split: str) -> tuple[Path, Path]:
    from odmactl.trace.schema import read_trace

    slug = name.split()[0].replace("/", "-")
    full, train, test, pred = (work / f"{slug}.parquet", work / f"{slug}-train.parquet", work / f"{slug}-replay.parquet",
                               work / f"{slug}-predictor")
    if not full.exists():
        run(["ingest", str(SHARED / ingest_args[0]), *ingest_args[1:], "--out", str(full), "--seed", "0", "--json"])
    if not test.exists():
        frame = read_trace(full)
        frame.head(train_rows).write_parquet(train)
        part = frame.slice(train_rows, REPLAY_REQUESTS)
        part.with_columns(pl.col("arrival_s") - part["arrival_s"].min()).write_parquet(test)
    if not pred.exists():
        run(["fit", str(train), "--out", str(pred), "--max-model-len", str(max_len), "--split-by", split, "--json"])
    return test, pred


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/odmactl-paper"))
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "paper_table.md")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    from odmactl.render.json import to_json
    from odmactl.render.markdown import markdown_table
    from odmactl.render.metrics import METRICS, format_metric
    from odmactl.run.replay import run_policies
    from odmactl.run.spec import ReplaySpec
    from odmactl.trace.schema import read_trace

    lines = [f"# {MODEL} on {DEVICE}: static, paged, s3 and odma", "",
             "Made by `python examples/paper_table.py` (see its docstring). Each row replays the same "
             f"{REPLAY_REQUESTS:,} requests; odma and s3 use the length predictor fitted on the trace's earlier requests.", ""]
    everything = {}
    for name, (ingest_args, train_rows, max_len, split) in TRACES.items():
        test, pred = prepare(args.work, name, ingest_args, train_rows, max_len, split)
        frame = read_trace(test)
        rows = {}
        for label, policies, length in (("static (32,768)", ["static"], 32_768), ("static (8,192)", ["static"], 8_192),
                                        (f"paged / s3 / odma ({max_len:,})", ["paged", "s3", "odma"], max_len)):
            doc = run_policies(frame, policies, ReplaySpec(device=DEVICE, model=MODEL, predictor=str(pred), max_model_len=length))
            for policy, r in doc["results"].items():
                key = f"static, max_model_len {length:,}" if policy == "static" else f"{policy}, max_model_len {length:,}"
                r.pop("series")
                rows[key] = r
        everything[name] = rows
        table = [[key] + [format_metric(k, r["metrics"][k]) for k in METRIC_KEYS]
                 + [f"{r['metrics'][k]:,}" for k in ("truncated", "completed")] for key, r in rows.items()]
        lines += [f"## {name}", ""] + markdown_table(["policy", *(METRICS[k].header for k in METRIC_KEYS),
                                                      "truncated", "completed"], table)
        lines.append("")
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(to_json(everything) + "\n")
    print("\n".join(lines))
    print(json.dumps({"written": [str(args.out), str(args.out.with_suffix('.json'))]}))


if __name__ == "__main__":
    main()
