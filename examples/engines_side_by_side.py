"""vLLM 0.6's schedule against vLLM v1's on the same requests (issue 38's side-by-side).

Llama-3-8B on H100-SXM, 1,500 Poisson requests of 1,000 prompt and 256 output tokens, paged KV in
16-token blocks, batch cap 256, token budget 2,048, at 5, 20, 28 and 40 req/s; TTFT and TPOT mean
and p99 under --engine vllm-v0 and vllm-v1, and the highest rate at TTFT p99 <= 2 s and TPOT
p99 <= 100 ms under each, at tp 1 and 2 (bisection on the rate, the arrivals' gaps scaled). Run
from the repository root (about two seconds on 2 CPU cores; max_model_len 2,048, so vllm-v0's
default budget, max(max_model_len, 2048), is the same 2,048):

    python examples/engines_side_by_side.py --out examples/engines_side_by_side.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

DEVICE, MODEL = "h100-sxm", "Llama-3-8B"
REQUESTS, PROMPT, OUTPUT, SEED = 1_500, 1_000, 256, 0
RATES = (5, 20, 28, 40)
MAX_NUM_SEQS, BUDGET, MAX_LEN = 256, 2_048, 2_048
SLO_TTFT_S, SLO_TPOT_S = 2.0, 0.100
ENGINES = ("vllm-v0", "vllm-v1")


def workload(rate: float):
    from odmactl.sim.workload import PS, Workload

    gaps = np.random.default_rng(SEED).exponential(1.0, REQUESTS)  # one draw, scaled to each rate
    arrival = np.round(np.cumsum(gaps) / rate * PS).astype(np.int64)
    arrival -= arrival[0]
    return Workload([f"r{i}" for i in range(REQUESTS)], arrival, np.full(REQUESTS, PROMPT, dtype=np.int64),
                    np.full(REQUESTS, OUTPUT, dtype=np.int64))


def replay(engine: str, rate: float, tp: int) -> dict:
    from odmactl.allocator import make_allocator
    from odmactl.run.replay import deployment_of
    from odmactl.run.serving import serving
    from odmactl.sim.engine import Replay
    from odmactl.sim.settings import SchedulerSettings

    setup = serving(DEVICE, MODEL, tp=tp)
    alloc = make_allocator("paged", setup.pool_bytes, setup.bytes_per_token,
                           {"max_model_len_tokens": MAX_LEN, "block_size_tokens": 16},
                           deployment=deployment_of(setup.cost))
    settings = SchedulerSettings(engine=engine, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=BUDGET)
    r = Replay(workload(rate), alloc, setup.cost, MAX_LEN, settings).run()
    m = r.metrics
    return {"ttft_mean_s": float(np.mean(r.ttft_s)), "ttft_p99_s": m["ttft_p99"],
            "tpot_mean_s": float(np.mean(r.tpot_s)), "tpot_p99_s": m["tpot_p99"], "completed": m["completed"],
            "preemptions": m["preemptions"], "overloaded": bool(m["overloaded"])}


def meets(row: dict) -> bool:
    return row["ttft_p99_s"] <= SLO_TTFT_S and row["tpot_p99_s"] <= SLO_TPOT_S


def capacity(engine: str, tp: int) -> float:
    """The highest rate (req/s, to 0.1) at which the replay meets the SLO: bisection between a rate
    that meets it and one that does not."""
    low, high = 1.0, 8.0
    while meets(replay(engine, high, tp)):
        low, high = high, high * 2
    while high - low > 0.1:
        mid = (low + high) / 2
        low, high = (mid, high) if meets(replay(engine, mid, tp)) else (low, mid)
    return round(low, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here (and .json beside)")
    args = parser.parse_args()
    rows = {engine: {rate: replay(engine, rate, 1) for rate in RATES} for engine in ENGINES}
    caps = {engine: {tp: capacity(engine, tp) for tp in (1, 2)} for engine in ENGINES}
    lines = ["| req/s | engine | TTFT mean (s) | TTFT p99 (s) | TPOT mean (ms) | TPOT p99 (ms) | preemptions | "
             "queue grows |", "|---:|---|---:|---:|---:|---:|---:|---|"]
    for rate in RATES:
        for engine in ENGINES:
            r = rows[engine][rate]
            lines.append(f"| {rate} | {engine} | {r['ttft_mean_s']:.3f} | {r['ttft_p99_s']:.3f} | "
                         f"{r['tpot_mean_s'] * 1e3:.1f} | {r['tpot_p99_s'] * 1e3:.1f} | {r['preemptions']} | "
                         f"{'yes' if r['overloaded'] else 'no'} |")
    lines += ["", "| engine | req/s at TTFT p99 <= 2 s, TPOT p99 <= 100 ms, tp 1 | tp 2 (one engine of 2 GPUs) |",
              "|---|---:|---:|"]
    for engine in ENGINES:
        lines.append(f"| {engine} | {caps[engine][1]:.1f} | {caps[engine][2]:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"rates": {e: {str(k): v for k, v in r.items()}
                                                                       for e, r in rows.items()},
                                                             "capacity_req_s": {e: {str(k): v for k, v in c.items()}
                                                                                for e, c in caps.items()}},
                                                            indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
