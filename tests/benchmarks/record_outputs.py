"""Record every command's machine-readable output on real traces, and compare two recordings.

A restructure of the package must not change a result. This script runs a fixed list of commands
(`cases()`: ingest of every real trace format, stats, fit, replay --compare with the oracle and with
a fitted predictor, plan, check and profiles, on the shipped sample and on Azure conv 2023) with
one Python and package, and keeps each command's exit code, its stdout (the --json document) and
every file it wrote. Record once before a change and once after, then compare:

    python tests/benchmarks/record_outputs.py record /tmp/before --pythonpath /path/to/old/checkout
    python tests/benchmarks/record_outputs.py record /tmp/after
    python tests/benchmarks/record_outputs.py compare /tmp/before /tmp/after

`--pythonpath` runs the package of another checkout (an old build, compiled in place with
`python setup.py build_ext --inplace`) with this interpreter. Every command runs in
RECORDING/work with relative output paths, so the documents of two recordings name the same
paths (the shipped samples are copied there); the checkout's own path, in profile file names, is
written as $CHECKOUT. Progress bars are off (stdout is a pipe). The comparison lists every case
whose exit code, stdout or written files differ, with the first differing line of each; exit 1
when any does. Takes about 2 minutes on a 2-vCPU machine.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("ODMACTL_SHARED_TRACES", ROOT.parent / "shared" / "traces")).resolve()
SAMPLES = ROOT / "traces"
DEVICE = ["--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B"]
COMPARE = ["--compare", "static,paged,s3,odma"]
ALL = ["--compare", "static,paged,s3,odma,ellm,unified"]
# eLLM with a host buffer and its SLO-aware scaling, unified with a small hot tier of adapters
ELLM_HOST_TOML = ("[allocator]\nellm_borrow_bytes = 0\nellm_host_buffer_bytes = 4294967296\nellm_ttft_slo_s = 2.0\n"
                  "ellm_tpot_slo_s = 0.2\nunified_hot_adapters = 2\n")

CANONICAL_CSV = "request_id,arrival_s,prompt_tokens,output_tokens,tenant\n" + "".join(
    f"r{i},{i * 0.37:.3f},{50 + (i * 37) % 900},{1 + (i * 53) % 400},{'ab'[i % 2]}\n" for i in range(400))
MAPPED_JSONL = "".join(
    json.dumps({"t": i * 0.5, "in": 10 + (i * 7) % 300, "out": 1 + (i * 11) % 200, "who": f"c{i % 3}"}) + "\n"
    for i in range(300))


def cases() -> list[tuple[str, list[str]]]:
    """(name, odmactl arguments) in order: later cases read what earlier ones wrote."""
    s = str(SHARED)
    return [
        # ingest: every real format, and the generic readers
        ("ingest_sample", ["ingest", "azure_conv_2023_sample.csv.gz", "--out", "sample.parquet"]),
        ("ingest_conv", ["ingest", f"{s}/AzureLLMInferenceTrace_conv.csv.gz", "--out", "conv.parquet"]),
        ("ingest_code_conv", ["ingest", f"{s}/AzureLLMInferenceTrace_code.csv.gz",
                              f"{s}/AzureLLMInferenceTrace_conv.csv.gz", "--out", "code_conv.parquet"]),
        ("ingest_mooncake", ["ingest", f"{s}/mooncake_conversation_trace.jsonl.gz", "--out", "mooncake.parquet"]),
        ("ingest_mooncake_synthetic", ["ingest", f"{s}/mooncake_synthetic_trace.jsonl.gz", "--format", "mooncake",
                                       "--out", "mooncake_synthetic.parquet"]),
        ("ingest_mooncake_sample", ["ingest", "mooncake_conversation_sample.jsonl.gz",
                                    "--out", "mooncake_sample.parquet"]),
        ("ingest_vidur", ["ingest", f"{s}/vidur_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv.gz",
                          "--rate", "4", "--seed", "3", "--out", "vidur.parquet"]),
        ("ingest_alpaca", ["ingest", f"{s}/alpaca_small_2000.json.gz", "--offline", "--out", "alpaca.parquet"]),
        ("ingest_alpaca_eval", ["ingest", f"{s}/alpaca_eval_model_outputs.jsonl.gz", "--rate", "20", "--seed", "1",
                                "--out", "alpaca_eval.parquet"]),
        ("ingest_arena_hard", ["ingest", f"{s}/arena_hard_v2.0_question.jsonl.gz",
                               f"{s}/arena_hard_v2.0_model_answers.jsonl.gz", "--offline", "--out", "arena.parquet"]),
        ("ingest_servegen", ["ingest", f"{s}/servegen/reason/deepseek-r1", "--format", "servegen", "--duration", "3600",
                             "--rate-scale", "0.2", "--seed", "1", "--out", "servegen.parquet"]),
        ("ingest_csv", ["ingest", "canonical.csv", "--out", "csv.parquet"]),
        ("ingest_jsonl_map", ["ingest", "mapped.jsonl", "--format", "jsonl", "--map", "arrival_s=t",
                              "--map", "prompt_tokens=in", "--map", "output_tokens=out", "--map", "tenant=who",
                              "--out", "jsonl.parquet"]),
        ("ingest_parquet", ["ingest", "sample.parquet", "--format", "parquet", "--out", "reparquet.parquet"]),
        # stats
        ("stats_sample", ["stats", "sample.parquet"]),
        ("stats_conv", ["stats", "conv.parquet", "--window", "300"]),
        ("stats_alpaca_eval", ["stats", "alpaca_eval.parquet"]),
        # fit: the embedded family on text, the time split on Azure conv, the S3 baseline
        ("fit_sample", ["fit", "sample.parquet", "--out", "pred_sample", "--split-by", "time",
                        "--max-model-len", "8192", "--epochs", "8"]),
        ("fit_conv", ["fit", "conv.parquet", "--out", "pred_conv", "--split-by", "time", "--holdout", "0.3",
                      "--max-model-len", "8192", "--epochs", "8"]),
        ("fit_alpaca_s3", ["fit", "alpaca.parquet", "--out", "pred_alpaca_s3", "--s3", "--max-model-len", "2048",
                           "--epochs", "4"]),
        # replay
        ("replay_sample_oracle", ["replay", "sample.parquet", *DEVICE, *COMPARE, "--predictor", "oracle"]),
        ("replay_sample_fitted", ["replay", "sample.parquet", *DEVICE, *COMPARE, "--predictor", "pred_sample"]),
        ("replay_conv_oracle", ["replay", "conv.parquet", *DEVICE, *COMPARE, "--predictor", "oracle"]),
        ("replay_conv_fitted", ["replay", "conv.parquet", *DEVICE, *COMPARE, "--predictor", "pred_conv"]),
        ("replay_conv_a100_s3pred", ["replay", "conv.parquet", "--device", "a100-80gb-sxm", "--model", "Llama-3-8B",
                                     "--compare", "s3,odma", "--predictor", "pred_alpaca_s3", "--limit", "3000"]),
        ("replay_sample_stepping", ["replay", "sample.parquet", *DEVICE, *COMPARE, "--predictor", "oracle",
                                    "--limit", "400", "--stepping", "--max-num-seqs", "32"]),
        ("replay_mooncake_offline", ["replay", "mooncake_sample.parquet", "--device", "a100-80gb-sxm",
                                     "--model", "Llama-3-8B", *COMPARE, "--predictor", "oracle", "--offline"]),
        # every policy (eLLM's borrowing and host buffer, unified's page ranges and adapters), under
        # overload, with a binding token budget, at tp 2, token by token, and under an output cap
        ("replay_conv_all_overloaded", ["replay", "conv.parquet", *DEVICE, *ALL, "--predictor", "oracle",
                                        "--rate", "40", "--limit", "4000"]),
        ("replay_sample_all_budget_tp2", ["replay", "sample.parquet", *DEVICE, *ALL, "--predictor", "pred_sample",
                                          "--tp", "2", "--max-num-batched-tokens", "16384", "--max-num-seqs", "64"]),
        ("replay_sample_all_stepping", ["replay", "sample.parquet", *DEVICE, *ALL, "--predictor", "oracle",
                                        "--limit", "500", "--stepping", "--rate", "30", "--max-new-tokens", "512"]),
        ("replay_sample_ellm_host", ["replay", "sample.parquet", *DEVICE, "--compare", "ellm,unified",
                                     "--config", "ellm_host.toml", "--rate", "20"]),
        ("capacity_sample", ["capacity", "sample.parquet", *DEVICE, "--slo", "ttft_p99=2s,tpot_p99=100ms",
                             "--predictor", "oracle", "--policies", "static,paged,s3,odma,ellm,unified",
                             "--tp", "1,2"]),
        # plan, then check and replay of what it wrote
        ("plan_sample", ["plan", "sample.parquet", *DEVICE, "--predictor", "oracle", "--out", "odma_sample.toml"]),
        ("plan_conv", ["plan", "conv.parquet", *DEVICE, "--predictor", "pred_conv", "--max-model-len", "8192",
                       "--workers", "2", "--out", "odma_conv.toml"]),
        ("check_sample", ["check", "sample.parquet", "--config", "odma_sample.toml", *DEVICE]),
        ("check_conv", ["check", "conv.parquet", "--config", "odma_conv.toml", *DEVICE, "--min-tps-gain", "0.1"]),
        ("replay_conv_config", ["replay", "conv.parquet", *DEVICE, "--config", "odma_conv.toml", "--compare", "odma,s3"]),
        # profiles
        ("profiles_list", ["profiles", "list"]),
        ("profiles_show_device", ["profiles", "show", "mlu370-x4"]),
        ("profiles_show_model", ["profiles", "show", "Llama-3-8B"]),
    ]


def record(out: Path, pythonpath: str | None) -> None:
    if out.exists():
        sys.exit(f"{out} exists; choose a new folder")
    work = out / "work"
    work.mkdir(parents=True)
    (work / "canonical.csv").write_text(CANONICAL_CSV)
    (work / "mapped.jsonl").write_text(MAPPED_JSONL)
    (work / "ellm_host.toml").write_text(ELLM_HOST_TOML)
    for sample in ("azure_conv_2023_sample.csv.gz", "mooncake_conversation_sample.jsonl.gz"):
        (work / sample).write_bytes((SAMPLES / sample).read_bytes())  # named relatively, as outputs are
    env = {k: v for k, v in os.environ.items() if k not in ("ODMACTL_PURE_PYTHON", "ODMACTL_DEBUG")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    checkout = str(Path(pythonpath).resolve()) if pythonpath else str(ROOT)
    summary = {}
    for name, args in cases():
        before = {p for p in work.rglob("*")}
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "odmactl", *args, "--json"], cwd=work, env=env,
                             capture_output=True, text=True)
        seconds = time.perf_counter() - started
        written = sorted(str(p.relative_to(work)) for p in set(work.rglob("*")) - before if p.is_file())
        # profile files are named by absolute path: the checkout's root is the one part that differs
        (out / f"{name}.stdout").write_text(run.stdout.replace(checkout, "$CHECKOUT"))
        (out / f"{name}.stderr").write_text(run.stderr)
        summary[name] = {"args": args, "code": run.returncode, "files": written, "seconds": round(seconds, 2)}
        print(f"{name}: exit {run.returncode}, {seconds:.1f} s, {len(written)} files", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _first_difference(a: str, b: str) -> str:
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith(("-", "+")) and not line.startswith(("---", "+++")):
            return line[:200]
    return "(whitespace)"


def compare(a: Path, b: Path) -> int:
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    differing = 0
    for name in sa:
        problems = []
        if name not in sb:
            problems.append("missing from the second recording")
        else:
            if sa[name]["code"] != sb[name]["code"]:
                problems.append(f"exit {sa[name]['code']} vs {sb[name]['code']}")
            out_a, out_b = (a / f"{name}.stdout").read_text(), (b / f"{name}.stdout").read_text()
            if out_a != out_b:
                problems.append(f"stdout differs: {_first_difference(out_a, out_b)}")
            if sa[name]["files"] != sb[name]["files"]:
                problems.append(f"files {sa[name]['files']} vs {sb[name]['files']}")
            for rel in sa[name]["files"]:
                fa, fb = a / "work" / rel, b / "work" / rel
                if fb.is_file() and fa.read_bytes() != fb.read_bytes():
                    problems.append(f"{rel} differs")
        status = "identical" if not problems else "DIFFERS"
        print(f"{name}: {status}")
        for p in problems:
            print(f"    {p}")
        differing += bool(problems)
    print(f"{len(sa) - differing} of {len(sa)} cases identical")
    return 1 if differing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="run every case and keep its outputs in a new folder")
    rec.add_argument("out", type=Path)
    rec.add_argument("--pythonpath", help="run the odmactl package of this checkout (PYTHONPATH)")
    cmp_ = sub.add_parser("compare", help="compare two recordings")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.verb == "record":
        if not SHARED.is_dir():
            sys.exit(f"the real traces are not at {SHARED} (set ODMACTL_SHARED_TRACES)")
        record(args.out, args.pythonpath)
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
