"""`odmactl capacity`: for each policy and tensor-parallel size, the rate one engine sustains at
the SLO and the devices a target rate needs (capacity/search.py says how each is found)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.capacity.binds import breaking, floor_cause, headline, memory_binding, near_floor, rates_differ, zero_load
from odmactl.capacity.search import MAX_SCALE_STEPS, CapacityTarget, capacity_job, lowest_scale
from odmactl.capacity.slo import Slo
from odmactl.core.errors import ConfigError, named_twice, not_one_of
from odmactl.core.limits import MAX_TP, MAX_WORKERS, check_seed, check_whole
from odmactl.run.arrivals import label as arrival_label
from odmactl.run.arrivals import canonical, parse_arrivals, with_arrivals
from odmactl.run.config import read_config, scheduler_record
from odmactl.run.executors import EXECUTORS, run_jobs
from odmactl.run.replay import prepare
from odmactl.run.serving import serving, static_baselines
from odmactl.run.spec import ServingSpec
from odmactl.sim.router import DEFAULT_ROUTER, ROUTERS
from odmactl.sim.workload import CLOCK_LIMIT_PS, PS
from odmactl.trace.stats import BUSIEST_WINDOW_S, busiest_rate

PEAK_WINDOW_S = BUSIEST_WINDOW_S  # the default target: the trace's busiest 10 minutes (trace/stats.py's rule)


@dataclass(frozen=True)
class CapacitySpec(ServingSpec):
    """The serving spec (its `tp` unused: `tps` lists the sizes tried), the policies, the SLO, the
    migration limit, the target rate (None: the trace's peak 10-minute rate) and the workers."""

    policies: tuple[str, ...] = ("static", "paged", "s3", "odma")
    tps: tuple[int, ...] = (1,)
    slo: Slo | None = None
    max_migration_rate: float = 0.005
    target_rate_per_s: float | None = None
    config: Path | None = None
    workers: int = 1
    executor: str = "process"
    max_replicas: int = 256
    # how the replicas for the target share its requests (sim/cluster.py); with several, each row's
    # replicas are searched behind each and the fewest kept (capacity/search.capacity_job)
    routers: tuple[str, ...] = (DEFAULT_ROUTER,)
    arrivals: str = "trace"  # --arrivals: trace, poisson or gamma:CV (run/arrivals.py)
    seed: int = 0  # the generated arrivals' seed

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tps:
            raise ConfigError("--tp names no size: give one or more, such as 1,2,4")
        if (twice := named_twice("--tp", self.tps)) is not None:
            raise ConfigError(f"{twice}: give distinct sizes such as 1,2,4")
        for tp in self.tps:
            check_whole(tp, 1, MAX_TP, "--tp")
        if not (0.0 <= self.max_migration_rate <= 1.0):
            raise ConfigError(f"--max-migration-rate must be in [0, 1], got {self.max_migration_rate}")
        if self.target_rate_per_s is not None and not (math.isfinite(self.target_rate_per_s) and self.target_rate_per_s > 0):
            raise ConfigError(f"--target-rate must be > 0 requests/s, got {self.target_rate_per_s}")
        check_whole(self.workers, 1, MAX_WORKERS, "--workers")
        check_whole(self.max_replicas, 1, 4096, "--max-replicas")
        if not self.routers:
            raise ConfigError(f"--router names no router: give one or more of {', '.join(ROUTERS)}, comma-separated")
        for router in self.routers:
            if router not in ROUTERS:
                raise ConfigError(not_one_of("--router", router, ROUTERS))
        if (twice := named_twice("--router", self.routers)) is not None:
            raise ConfigError(twice)
        parse_arrivals(self.arrivals)
        check_seed(self.seed)
        if self.executor not in EXECUTORS:
            raise ConfigError(not_one_of("--executor", self.executor, EXECUTORS))


def trace_rates(arrival_s: np.ndarray) -> tuple[float, float]:
    """(the mean arrival rate, the peak PEAK_WINDOW_S rate) in requests/s: the most requests in
    any window of that length starting at an arrival (sliding, not fixed bins); the mean when the
    trace is shorter than the window."""
    span = float(arrival_s[-1] - arrival_s[0])
    if arrival_s.size < 2 or span <= 0:
        raise ConfigError("capacity scales the trace's arrival times, and all of its requests arrive at once",
                          hint="ingest it with --rate R (Poisson arrivals) instead of --offline")
    return (arrival_s.size - 1) / span, busiest_rate(arrival_s, PEAK_WINDOW_S)


def _replayed_peak(arrival_ps: np.ndarray, scale: float) -> float:
    """The rate, requests/s, at which the busiest PEAK_WINDOW_S of the arrivals replayed (the
    trace's own, or those --arrivals drew) arrive once sped up `scale` times: the target is the
    mean rate, and this is the peak the devices are sized for (over PEAK_WINDOW_S / scale)."""
    return busiest_rate((arrival_ps - arrival_ps[0]) / PS, PEAK_WINDOW_S) * scale


def capacity(frame: pl.DataFrame, spec: CapacitySpec, progress=None) -> dict:
    """The JSON-ready capacity document (one row per policy and tp; static twice, run.serving.static_baselines)."""
    tables = read_config(spec.config)
    arrival_s = frame["arrival_s"].to_numpy().astype(np.float64)
    mean_rate, peak_rate = trace_rates(arrival_s)
    target_rate = spec.target_rate_per_s or peak_rate
    low, high = mean_rate * lowest_scale(arrival_s), mean_rate * 2.0 ** MAX_SCALE_STEPS
    span_s = float(arrival_s[-1] - arrival_s[0])
    if low > high:  # even the fastest replay of the trace (2**20 times its rate) outlasts the replay clock
        raise ConfigError(f"the trace's arrivals span {span_s:.3g} s: replayed even {2 ** MAX_SCALE_STEPS:,} times faster "
                          f"its backlog would not fit the replay clock ({CLOCK_LIMIT_PS / PS / 86400:.0f} days)",
                          hint="check the trace's arrival_s column (seconds since its first request)")
    if not low <= target_rate <= high:
        what = f"--target-rate {target_rate:g} req/s" if spec.target_rate_per_s else \
            f"the target, the trace's busiest 10 minutes ({target_rate:g} req/s),"
        raise ConfigError(f"{what} lies outside the rates this trace can be replayed at "
                          f"({low:.3g} to {high:.3g} req/s: its own {mean_rate:.3g} req/s scaled by 2**-{MAX_SCALE_STEPS} "
                          f"to 2**{MAX_SCALE_STEPS}, within the replay clock)", hint="give a target in that range")
    target = CapacityTarget(spec.slo, spec.max_migration_rate, max_replicas=spec.max_replicas)
    kind, cv = parse_arrivals(spec.arrivals)
    jobs, names, contexts, label, mismatched = [], [], {}, None, []
    for tp in spec.tps:
        setup = serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes, tp=tp)
        ctx, label = prepare(frame, dataclasses.replace(spec, tp=tp), setup, tables=tables, config=spec.config,
                             policies=spec.policies)
        ctx = dataclasses.replace(ctx, workload=with_arrivals(ctx.workload, kind, cv, spec.seed))
        contexts[tp] = ctx
        mismatched += [f"tp {tp}: {line}" for line in ctx.mismatches]
        table = {**tables["allocator"], **spec.allocator_overrides()}
        for policy in spec.policies:  # static twice: at max_model_len and at prompt + max_new_tokens
            runs = [(policy, table)] if policy != "static" else static_baselines(
                spec, ctx.workload, ctx.max_len, ctx.scheduler.max_new_tokens, tables["allocator"])
            names += [name for name, _ in runs]
            jobs += [(ctx, policy, settings, target, target_rate / mean_rate, mean_rate, spec.routers)
                     for _, settings in runs]
    found = run_jobs(jobs, spec.workers, "capacity", progress, fn=capacity_job, executor=spec.executor)
    floors = {tp: zero_load(ctx) for tp, ctx in contexts.items()}
    if all(result["rate_scale"] is None and result["target"]["replicas"] is None for result in found):
        policy, result = names[0], found[0]
        tp = spec.tps[0]
        if result["too_few_served"]:  # not the SLO: too few requests served to judge it (capacity/search.py)
            raise ConfigError(f"no rate is reported for {policy} at tp {tp}: {result['infeasible']}")
        raise ConfigError(f"no policy meets the SLO at any tensor-parallel size tried; {policy} at tp "
                          f"{tp}: {result['infeasible']}; at tp {tp}, "
                          + floor_cause(floors[tp], spec.slo.limits_s, contexts[tp].scheduler.chunked))
    rows = []
    for (ctx, policy_name, settings, *_), policy, result in zip(jobs, names, found):
        tp = ctx.serving.tp
        m = result["metrics"]
        replicas = result["target"]["replicas"]
        scale = result["rate_scale"]
        rows.append({
            "policy": policy, "replayed_as": {"policy": policy_name, "allocator": settings},
            "tp": tp, "max_model_len": ctx.max_len, "kv_pool_tokens": ctx.serving.pool_tokens,
            "rate_scale": scale, "next_rate_scale": result["next_rate_scale"], "infeasible": result["infeasible"],
            "too_few_served": result["too_few_served"],
            "unbounded": scale is not None and result["next_rate_scale"] is None,
            "max_rate_per_replica": None if scale is None else scale * mean_rate,
            # the highest rate as the console writes it at which one engine meets the SLO (search.gate_rate)
            "gate_rate_per_replica": (result["gate"] or {}).get("rate_per_s"),
            "gate_rates_tried": (result["gate"] or {}).get("tried", []),
            # the rate plan's and replay's overload test says one engine keeps up at (no SLO)
            "keeps_up_rate_per_replica": None if (result["keeps_up"] or {}).get("rate_scale") is None
            else result["keeps_up"]["rate_scale"] * mean_rate,
            "max_rate_per_device": None if scale is None else scale * mean_rate / tp,
            # completed output tokens per second of offered load: the rate times the tokens a request
            # yields on average (m["tps"] divides by the makespan, ramp-up and drain included)
            "output_tps_per_replica": None if scale is None else scale * mean_rate * m["generated_tokens"] / m["requests"],
            "output_tps_per_device": None if scale is None else scale * mean_rate * m["generated_tokens"] / m["requests"] / tp,
            "rejected_never_fit": m["rejections"], "metrics_at_capacity": m,
            "monotone": result["monotone"], "failed_below_at_scale": result["failed_below_at_scale"],
            "replicas_for_target": replicas, "devices_for_target": None if replicas is None else replicas * tp,
            # the router the devices are for, and what each router of --router needs (None: none within
            # --max-replicas); the first router where no rate was judged (too_few_served)
            "router": result["target"]["router"],
            "devices_by_router": {router: None if n is None else n * tp
                                  for router, n in result["target"]["replicas_by_router"].items()},
            "metrics_at_target": result["target"]["metrics"], "probes": result["probes"]})
    if all(row["replicas_for_target"] is None for row in rows):
        behind = f"the {spec.routers[0]} router" if len(spec.routers) == 1 else f"any of {', '.join(spec.routers)}"
        raise ConfigError(f"no policy serves {target_rate:,.3f} req/s within the SLO with up to {target.max_replicas} "
                          f"engines behind {behind} at any tensor-parallel size tried", hint="a larger --max-replicas, a lower "
                          "--target-rate, a larger --tp, or a looser --slo")
    for row in rows:  # the saving against static at the same tp, in devices
        static = next((r for r in rows if r["policy"] == "static" and r["tp"] == row["tp"]), None)
        row["devices_saved_vs_static"] = (None if static is None or None in (static["devices_for_target"],
                                                                              row["devices_for_target"])
                                          else static["devices_for_target"] - row["devices_for_target"])
    for row in rows:  # what binds it (capacity/binds.py)
        ctx = contexts[row["tp"]]
        row["breaks_above"] = breaking(row["probes"], row["next_rate_scale"]) if row["rate_scale"] is not None else []
        row["near_floor"] = near_floor(floors[row["tp"]], spec.slo.limits_s)
        row["floor_cause"] = None if row["rate_scale"] is not None or row["too_few_served"] else \
            floor_cause(floors[row["tp"]], spec.slo.limits_s, ctx.scheduler.chunked)
    binds = memory_binding(rows, target.tolerance)
    first = contexts[spec.tps[0]]
    return {
        "headline": headline(rows), "memory_binds": {str(tp): b for tp, b in binds.items()},
        "rates_differ": {str(tp): b for tp, b in rates_differ(rows, target.tolerance).items()},
        "zero_load": {str(tp): floor for tp, floor in floors.items()},
        "trace": {"requests": frame.height, "mean_rate_per_s": mean_rate, "peak_10min_rate_per_s": peak_rate,
                  "span_s": span_s, "prefix_hashes": first.workload.prefix is not None},
        "device": first.serving.device.name, "model": first.serving.full_model.name, "kv_dtype": spec.kv_dtype,
        "predictor": label, "slo": {m: s for m, s in spec.slo.limits_s}, "slo_label": spec.slo.label,
        "max_migration_rate": spec.max_migration_rate, "target_rate_per_s": target_rate, "routers": list(spec.routers),
        "arrivals": {"process": canonical(kind, cv), "seed": None if kind == "trace" else spec.seed,
                     "label": arrival_label(kind, cv, spec.seed)},
        "target_replay_s": span_s * mean_rate / target_rate,
        "target_replay_peak_10min_rate_per_s": _replayed_peak(first.workload.arrival_ps, target_rate / mean_rate),
        "target_is_peak": spec.target_rate_per_s is None, "tolerance": target.tolerance,
        "scheduler": scheduler_record(first.scheduler, first.max_len),
        "mismatches": mismatched, "rows": rows,
    }
