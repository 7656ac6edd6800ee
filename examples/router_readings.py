"""Why odma needs a card more than static+1024 behind least-kv on Azure conv 2023 (issue 37, point 3):
the engines or the routing?

capacity's devices come from replaying the target traffic on R engines behind a router
(docs/capacity.md, "Devices"). This script replays that traffic on R MLU370-X4 engines (tp 1) for
odma (plan's config) and static+1024, and measures pooled TPOT p99, the limit that binds there:

1. **least-kv as shipped**: each policy routed by its own reservations (odma's blocks, static's
   prompt + 1,024 slots), as `odmactl capacity` does;
2. **the other's routing**: each policy replayed with the engine choices least-kv made for the
   other one (the same requests on the same engines, in the same order), so the engines alone differ;
3. **a reading that is the same for both**: the engine with the fewest prompt tokens among the
   requests it runs, plus W tokens per such request, plus the prompts routed to it that have not
   started (least-kv's pending term), for each W of `--weights`.

It runs odmactl in pure Python (ODMACTL_PURE_PYTHON=1, set here) and replaces the routing rule of
sim/cluster.py (`pick`) for steps 2 and 3: an experiment, not a router odmactl offers. The work folder
is `examples/capacity_tables.sh`'s (its rest.parquet, pred/ and c.toml):

    bash examples/capacity_tables.sh /tmp/odmactl-capacity      # once
    python examples/router_readings.py /tmp/odmactl-capacity --replicas 18
    python examples/router_readings.py /tmp/odmactl-capacity --replicas 15 --seed 0   # Poisson gaps

With `--seed S` the requests arrive at Poisson gaps of the trace's mean rate (capacity's
`--arrivals poisson --seed S`); either way the replay is sped up so that its mean is the trace's busiest
10 minutes (7.56 req/s), capacity's target. About 5 s a replay on the 2-vCPU machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

os.environ["ODMACTL_PURE_PYTHON"] = "1"  # before odmactl is imported: the routing rule below replaces a Python function

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

import odmactl.sim.cluster as cluster  # noqa: E402
from odmactl.capacity.run import CapacitySpec, trace_rates  # noqa: E402
from odmactl.capacity.slo import Slo  # noqa: E402
from odmactl.core import native  # noqa: E402
from odmactl.core.errors import OdmaError  # noqa: E402
from odmactl.run.arrivals import with_arrivals  # noqa: E402
from odmactl.run.config import read_config  # noqa: E402
from odmactl.run.replay import prepare, replayed_together  # noqa: E402
from odmactl.run.serving import serving, static_baselines  # noqa: E402
from odmactl.sim.metrics import p50_p99  # noqa: E402

SHIPPED_PICK = cluster.pick
POLICIES = ("odma", "static+1024")
LABEL = 60  # the routing column: the table fits 80 columns


class Routing:
    """The rule `cluster.pick` follows while a replay runs: least-kv as shipped, recording its
    choices (`record`), or the choices recorded for another replay (`replay`), or the prompts + W
    reading (`weight`)."""

    def __init__(self) -> None:
        self.mode, self.choices, self.weight_tokens = "shipped", {}, 0

    def pick(self, rule, j, engines, pending):
        if self.mode == "replay":
            return self.choices[j]
        if self.mode == "weight":
            return self._lightest(j, engines, pending)
        e = SHIPPED_PICK(rule, j, engines, pending)
        if self.mode == "record":
            self.choices[j] = e
        return e

    def _lightest(self, j, engines, pending) -> int:
        """The engine with the least (prompt tokens + W per running request) x bytes per token +
        pending prompt bytes; ties round-robin from j, then the fewer requests, as least-kv breaks them."""
        n, best, best_key = len(engines), -1, None
        for p in range(n):
            e = (j + p) % n
            engine = engines[e]
            b = engine.batch
            tokens = sum(b.prompt[i] for i in b.running) + self.weight_tokens * len(b.running)
            key = (tokens * engine.alloc.bytes_per_token + pending[e], cluster.outstanding(engine))
            if best_key is None or key < best_key:
                best, best_key = e, key
        return best


def row(label: str, odma: float, static: float) -> None:
    print(f"{label:{LABEL}s} {odma:6.1f} {static:11.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path, help="examples/capacity_tables.sh's work folder")
    ap.add_argument("--replicas", type=int, default=18, help="engines replayed together (default 18)")
    ap.add_argument("--seed", type=int, default=None, help="Poisson gaps with this seed (default: the trace's own gaps)")
    ap.add_argument("--weights", default="0,256,1024,4096", help="the W of the same-for-both reading, tokens per request")
    args = ap.parse_args()
    if not args.work.is_dir():
        sys.exit(f"error: {args.work} is not a folder: give examples/capacity_tables.sh's work folder")
    for name in ("rest.parquet", "pred", "c.toml"):
        if not (args.work / name).exists():
            sys.exit(f"error: {args.work / name} is missing: run bash examples/capacity_tables.sh {args.work} first")
    if args.replicas < 1:
        sys.exit("error: --replicas expects at least 1 engine")
    if args.seed is not None and args.seed < 0:
        sys.exit("error: --seed expects a whole number of at least 0")
    try:
        weights = [int(w) for w in args.weights.split(",")]
    except ValueError:
        sys.exit(f"error: --weights expects whole token counts separated by commas, got {args.weights!r}")
    if min(weights) < 0:
        sys.exit("error: --weights expects token counts of at least 0")
    assert not any(s == "compiled" for s in native.status().values()), "the routing rule is compiled: nothing to replace"
    try:
        measure(args, weights)
    except OdmaError as e:  # a bad predictor, config or trace in the work folder
        sys.exit(f"error: {e}")
    return 0


def measure(args: argparse.Namespace, weights: list[int]) -> None:
    """The table (the module docstring)."""
    spec = CapacitySpec(device="mlu370-x4", model="DeepSeek-R1-Distill-Qwen-7B", predictor=str(args.work / "pred"),
                        allow_mismatch=True, policies=("static", "odma"), tps=(1,),
                        slo=Slo.parse("ttft_p99=2s,tpot_p99=100ms"), max_migration_rate=0.01,
                        config=args.work / "c.toml")
    frame = pl.read_parquet(args.work / "rest.parquet")
    tables = read_config(spec.config)
    mean_rate, target_rate = trace_rates(frame["arrival_s"].to_numpy().astype(np.float64))
    ctx, _ = prepare(frame, spec, serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes, tp=1),
                     tables=tables, config=spec.config, policies=spec.policies)
    workload = ctx.workload if args.seed is None else with_arrivals(ctx.workload, "poisson", None, args.seed)
    ctx = dataclasses.replace(ctx, workload=workload.at_rate_scale(target_rate / mean_rate))
    runs = {"odma": ("odma", dict(tables["allocator"]))}
    runs.update((name, ("static", s)) for name, s in
                static_baselines(spec, ctx.workload, ctx.max_len, ctx.scheduler.max_new_tokens, tables["allocator"]))

    routing = Routing()
    cluster.pick = routing.pick

    def tpot_p99_ms(name: str) -> tuple[float, list[int]]:
        policy, table = runs[name]
        results = replayed_together(ctx, policy, table, args.replicas, "least-kv")
        return (p50_p99(np.concatenate([r.tpot_s for r in results]))[1] * 1e3,
                [r.metrics["requests"] for r in results])

    arrivals = "the trace's own gaps" if args.seed is None else f"Poisson gaps, seed {args.seed}"
    print(f"{ctx.workload.size:,} requests at {target_rate:.3g} req/s ({arrivals})\n"
          f"on {args.replicas} MLU370-X4 engines, tp 1: pooled TPOT p99 (ms), limit 100\n")
    print(f"{'routing':{LABEL}s} {'odma':>6s} {'static+1024':>11s}")
    own, counts = {}, {}
    for name in POLICIES:
        routing.mode, routing.choices = "record", {}
        own[name], counts[name] = tpot_p99_ms(name)
        counts[name + " choices"] = routing.choices
    row("least-kv, each by its own reservations", own["odma"], own["static+1024"])
    crossed = {}
    for name, other in zip(POLICIES, POLICIES[::-1]):
        routing.mode, routing.choices = "replay", counts[other + " choices"]
        crossed[name], engine_counts = tpot_p99_ms(name)
        assert engine_counts == counts[other], "the other's routing did not place the same requests"
    row("the choices least-kv makes for odma", own["odma"], crossed["static+1024"])
    row("the choices least-kv makes for static+1024", crossed["odma"], own["static+1024"])
    for w in weights:
        routing.mode, routing.weight_tokens = "weight", w
        row(f"prompts + {w:,} tokens per request, for both", *(tpot_p99_ms(name)[0] for name in POLICIES))



if __name__ == "__main__":
    raise SystemExit(main())
