"""The memory designs of the reference documents side by side, eLLM's and ADR-006's among them.

The policies: static, paged, s3, odma, eLLM's elastic pool (`ellm`) and ADR-006's unified paged
pool (`unified`). Run from the repository root (needs ../shared/traces; about ten seconds on 2 CPU
cores):

    python examples/memory_designs.py --work /tmp/odmactl-designs --out examples/memory_designs.md

Two real traces, each on a Cambricon MLU370-X4 and an NVIDIA A100-80GB-SXM, with
DeepSeek-R1-Distill-Qwen-7B in fp16 and oracle lengths (s3 and odma size blocks from them; the
others ignore them), through the same code as `odmactl replay --compare static,paged,s3,odma,ellm,unified`:

- the Azure LLM inference trace 2023, conversation (19,366 requests, prompts of 1,155 tokens on
  average), on one device;
- the Mooncake conversation trace (12,031 requests, prompts of 12,035 tokens on average and up to
  126,195), on four MLU370-X4 (tp 4: one card's pool does not hold the longest prompt) and on one
  A100.

Every row runs under --engine vllm-v0 (whole-prompt prefills, the engine of the ODMA and eLLM papers,
and the only one odmactl replays eLLM's host buffer under: it offloads a prefill's KV, and vLLM v1
has no swap space), on the A100 too, whose profile defaults to vllm-v1. Every policy runs with its
defaults; ellm twice more with a 64 GiB host buffer for offloaded KV, all
of it usable ("ellm+offload") and scaled by eLLM's SLO-aware rule at TTFT 2 s and TPOT 100 ms
("ellm+offload+SLO"). It writes the tables to --out and the full results beside it (.json).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
MODEL = "DeepSeek-R1-Distill-Qwen-7B"
POLICIES = ["static", "paged", "s3", "odma", "ellm", "unified"]
ENGINE = "vllm-v0"  # the schedule every row replays (the module docstring says why)
HOST_BUFFER_BYTES = 64 << 30
SLO = {"ellm_ttft_slo_s": 2.0, "ellm_tpot_slo_s": 0.1}  # the capacity SLO of the tables in docs/capacity.md
VARIANTS = {  # ellm again, with a host buffer: all of it usable, then scaled by its SLO-aware rule
    "ellm+offload": {"ellm_host_buffer_bytes": HOST_BUFFER_BYTES},
    "ellm+offload+SLO": {"ellm_host_buffer_bytes": HOST_BUFFER_BYTES, **SLO},
}
RUNS = [  # (trace, source file, device, tp)
    ("Azure conv 2023", "AzureLLMInferenceTrace_conv.csv.gz", "mlu370-x4", 1),
    ("Azure conv 2023", "AzureLLMInferenceTrace_conv.csv.gz", "a100-80gb-sxm", 1),
    ("Mooncake conversation", "mooncake_conversation_trace.jsonl.gz", "mlu370-x4", 4),
    ("Mooncake conversation", "mooncake_conversation_trace.jsonl.gz", "a100-80gb-sxm", 1),
]
ROWS = (  # metric, label, format
    ("kv_utilization", "KV utilization", "{:.1%}"),
    ("tps", "TPS (tok/s)", "{:,.1f}"),
    ("ttft_p50", "TTFT p50 (s)", "{:,.2f}"),
    ("ttft_p99", "TTFT p99 (s)", "{:,.2f}"),
    ("tpot_p99", "TPOT p99 (ms)", "ms"),
    ("peak_concurrency", "peak batch", "{:,}"),
    ("mean_batch", "mean batch", "{:.1f}"),
    ("kv_runs_per_request", "KV runs / request", "{:,.1f}"),
    ("overflow_rate", "overflow rate", "{:.2%}"),
    ("preemptions", "preemptions", "{:,}"),
    ("peak_borrowed_bytes", "peak borrowed (GiB)", "GiB"),
    ("host_link_bytes", "host link (GiB)", "GiB"),
    ("link_bottleneck_s", "link bottleneck (s)", "{:.3f}"),
)


def _cell(value, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "ms":
        return f"{value * 1000:,.1f}"
    if fmt == "GiB":
        return f"{value / (1 << 30):.2f}"
    return fmt.format(value)


def replay(trace: Path, device: str, tp: int, work: Path) -> dict:
    from odmactl.run.replay import run_policies
    from odmactl.run.spec import ReplaySpec
    from odmactl.trace.schema import read_trace

    frame = read_trace(trace)
    spec = ReplaySpec(device=device, model=MODEL, predictor="oracle", tp=tp, engine=ENGINE)
    doc = run_policies(frame, POLICIES, spec)
    for name, table in VARIANTS.items():
        config = work / "variant.toml"
        config.write_text("[allocator]\n" + "".join(f"{k} = {v}\n" for k, v in table.items()))
        variant = run_policies(frame, ["ellm"], ReplaySpec(device=device, model=MODEL, predictor="oracle", tp=tp,
                                                           config=config, engine=ENGINE))
        doc["results"][name] = variant["results"]["ellm"]
    return doc


def table(doc: dict) -> list[str]:
    names = list(doc["results"])
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key, label, fmt in ROWS:
        cells = []
        for name in names:
            r = doc["results"][name]
            value = r["metrics"].get(key, r["allocator"]["policy_counters"].get(key))
            cells.append(_cell(value, fmt))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/odmactl-designs"))
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "memory_designs.md")
    args = parser.parse_args()
    from odmactl.cli import main as cli

    args.work.mkdir(parents=True, exist_ok=True)
    docs, lines = {}, ["# The memory designs side by side", "",
                       "Made by `python examples/memory_designs.py` (its docstring says what runs). "
                       f"{MODEL}, fp16, oracle lengths, engine {ENGINE} on every device, every policy at its defaults; `ellm+offload` is ellm with a "
                       f"{HOST_BUFFER_BYTES >> 30} GiB host buffer, `ellm+offload+SLO` the same buffer scaled by "
                       "eLLM's SLO-aware rule at TTFT 2 s, TPOT 100 ms. TTFT and TPOT are over the completed requests; "
                       "\"KV runs / request\" is what the cost model charges per KV head, K and V, per layer at a "
                       "request's end; \"peak borrowed\" the activation memory ellm's KV held at its peak.", ""]
    for name, source, device, tp in RUNS:
        parquet = args.work / (Path(source).name.split(".")[0] + ".parquet")
        if not parquet.exists():
            with contextlib.redirect_stdout(io.StringIO()):  # its summary is not this script's output
                code = cli(["ingest", str(SHARED / source), "--out", str(parquet), "--json"])
            if code != 0:
                raise SystemExit(f"ingest {source} failed ({code})")
        doc = replay(parquet, device, tp, args.work)
        key = f"{name} on " + (f"{tp} {doc['device']} (tp {tp})" if tp > 1 else doc["device"])
        docs[key] = doc
        pool = doc["kv_pool_bytes"] / (1 << 30)
        lines += [f"## {key}", "",
                  f"{doc['trace']['requests']:,} requests at their trace timestamps; KV pool {pool:.2f} GiB "
                  f"({doc['kv_pool_bytes'] // doc['kv_bytes_per_token']:,} tokens); max_model_len "
                  f"{doc['max_model_len']:,}.", ""] + table(doc) + [""]
        overloaded = [p for p, r in doc["results"].items() if r["queue"]["overloaded"]]
        if overloaded:
            lines += [f"Overloaded (the queue grew through the run, so TPS is the service rate): "
                      f"{', '.join(overloaded)}.", ""]
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps(
        {k: {"device": d["device"], "tp": d.get("tp"), "kv_pool_bytes": d["kv_pool_bytes"],
             "results": {p: {"metrics": r["metrics"], "policy_counters": r["allocator"]["policy_counters"],
                             "config": r["config"], "queue": r["queue"]} for p, r in d["results"].items()}}
         for k, d in docs.items()}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
