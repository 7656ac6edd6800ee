"""How far could any length predictor take ODMA on a ServeGen trace? A hindsight ceiling per 6 h window.

ServeGen publishes, per client and per 6 h window, only the marginal distributions of input and output
tokens, and `odmactl ingest` samples the two independently (odmactl/readers/servegen.py). Within a
window, a request's output length therefore carries no information beyond its client (the trace's
`tenant`): the prompt is independent of it. Every reservation rule a predictor can drive is then at
best "prompt + r(tenant)". This script finds, per window and in hindsight (on that window's own
lengths), the per-tenant r that maximises kv_utilization while at most `--limit` of the requests
outgrow their reservation (a Lagrangian sweep over each tenant's distinct output lengths; no bucket
rounding), with an upper bound on it from the same sweep (Lagrangian duality), and prints both
beside s3 with the given predictor. When the bound is below s3, no ODMA configuration on that
window can beat s3 on kv_utilization within the migration limit.

Run from the repository root:

    odmactl ingest ../shared/traces/servegen/reason/deepseek-r1 --format servegen --duration 86400 \
        --rate-scale 0.05 --seed 1 --out /tmp/r1-24h.parquet
    python -c "import polars as pl; pl.read_parquet('/tmp/r1-24h.parquet').head(20000).write_parquet('/tmp/r1-train.parquet')"
    odmactl fit /tmp/r1-train.parquet --out /tmp/r1-pred --split-by time --max-model-len 32768
    python examples/servegen_ceiling.py /tmp/r1-24h.parquet --predictor /tmp/r1-pred --max-model-len 32768

(The predictor trains on the first 20,000 requests, all in window 0: s3's figure there is in-sample.)

The two kv_utilization figures of the ceiling count an overflowing request's final reservation as its
own length (no cost at all) and as one max_model_len block (odma's large-pool migration). s3's
figure uses odmactl's s3 rule (`s3_capacities`, the allocator's default 10 equal-width buckets over
output tokens up to max_model_len; the reservation is the prompt plus the predicted output's bucket,
and an outgrown request ends in the smallest bucket that holds its output, whether preempted and
re-admitted one bucket up at a time or migrated) with the predictor's L_hat, without replay.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

WINDOW_S = 21_600.0


def ceiling(prompt: np.ndarray, output: np.ndarray, tenant: np.ndarray, max_len: int, limit: float,
            overflow_to_max: bool) -> tuple[float, float, float]:
    """(overflow rate, kv_utilization) of the best prompt + r(tenant) rule found within `limit`, and
    an upper bound on any such rule's kv_utilization (Lagrangian duality: for every penalty lam >= 0,
    sum over tenants of min_r [reserved + lam * outgrown] - lam * allowed is at most the least total
    reservation within the limit). The sweep is the one `odmactl plan` fits its hedge tables with
    (odmactl/rules/hedge.py), here with each tenant as a group."""
    from odmactl.rules.hedge import group_costs, lagrangian_pick

    kv_total = float(np.minimum(prompt + output, max_len).sum())
    allowed = limit * prompt.size
    costs = [group_costs(prompt[tenant == t], output[tenant == t], max_len, overflow_to_max) for t in np.unique(tenant)]
    picks, dual = lagrangian_pick(costs, allowed)
    reserved = sum(float(c[1][j]) for c, j in zip(costs, picks))
    over = sum(float(c[2][j]) for c, j in zip(costs, picks))
    if over > allowed:
        return 1.0, 0.0, kv_total / dual
    return over / prompt.size, kv_total / reserved, kv_total / dual


def s3_estimate(prompt: np.ndarray, output: np.ndarray, l_hat: np.ndarray, max_len: int) -> tuple[float, float]:
    """(overflow rate, kv_utilization) of s3's rule with the allocator's default buckets: prompt +
    the capacity of the predicted output's bucket (rules/s3.py); an outgrown request ends in the
    smallest bucket that holds its output (preempted and re-admitted one bucket up at a time, or
    migrated: the final reservation is the same)."""
    from odmactl.allocator.config import AllocatorConfig
    from odmactl.rules.s3 import s3_capacities, s3_classes

    capacities = np.asarray(s3_capacities(max_len, AllocatorConfig().s3_num_buckets), dtype=np.float64)
    kv = np.minimum(prompt + output, max_len)
    cap = np.minimum(prompt + capacities[s3_classes(np.maximum(l_hat, 1), tuple(int(c) for c in capacities))], max_len)
    outgrown = kv > cap
    final = np.where(outgrown, np.minimum(prompt + capacities[s3_classes(np.maximum(kv - prompt, 1),
                                                                         tuple(int(c) for c in capacities))], max_len), cap)
    return float(outgrown.mean()), float(kv.sum() / final.sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="canonical parquet of a ServeGen trace (odmactl ingest)")
    ap.add_argument("--predictor", type=Path, required=True, help="predictor directory (odmactl fit), for s3")
    ap.add_argument("--max-model-len", type=int, default=32_768)
    ap.add_argument("--limit", type=float, default=0.005, help="most requests that may outgrow their block")
    args = ap.parse_args(argv)
    from odmactl.predict.artifact import read_artifact
    from odmactl.render.markdown import markdown_table

    frame = pl.read_parquet(args.trace).filter(pl.col("prompt_tokens") <= args.max_model_len)
    l_hat, _ = read_artifact(args.predictor).predict(frame)
    frame = frame.with_columns(pl.Series("l_hat", l_hat), (pl.col("arrival_s") // WINDOW_S).cast(pl.Int64).alias("window"))
    print(f"{args.trace.name}: max_model_len {args.max_model_len:,}, at most {args.limit:.1%} outgrown\n")
    rows = []
    for window in sorted(frame["window"].unique().to_list()):
        part = frame.filter(pl.col("window") == window)
        prompt = part["prompt_tokens"].to_numpy().astype(np.float64)
        output = part["output_tokens"].to_numpy().astype(np.float64)
        tenant = part["tenant"].to_numpy()
        _, free, free_bound = ceiling(prompt, output, tenant, args.max_model_len, args.limit, overflow_to_max=False)
        over, paid, paid_bound = ceiling(prompt, output, tenant, args.max_model_len, args.limit, overflow_to_max=True)
        s3_over, s3_util = s3_estimate(prompt, output, part["l_hat"].to_numpy().astype(np.float64), args.max_model_len)
        rows.append([f"{window} ({window * 6}-{window * 6 + 6} h)", f"{part.height:,}", str(np.unique(tenant).size),
                     f"{free:.1%} (<= {free_bound:.1%})", f"{paid:.1%} (<= {paid_bound:.1%}; {over:.2%} outgrown)",
                     f"{s3_util:.1%} ({s3_over:.1%})"])
    print("\n".join(markdown_table(["window", "requests", "tenants", "best found (bound), no overflow cost",
                                    "best found (bound), overflow to max_model_len", "s3 (overflow rate)"], rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
