"""Capacity at a latency SLO: the highest request rate one engine (a replica of `tp` devices)
sustains, and the devices a target rate needs.

Every figure comes from replays, none from division:
- `served` replays the trace's requests with their inter-arrival times divided by a rate scale,
  over R replicas (each a full engine with its own pool) behind the target's router (sim/cluster.py:
  round-robin replays each engine's share apart; a router that sees load replays the engines
  together on one clock), and combines the metrics over all requests (latency percentiles over the
  pooled per-request values);
- `find_capacity` brackets the largest scale at which the SLO holds (doubling or halving from the
  trace's own rate), then bisects in log space until the bracket is within `tolerance` (2%):
  at the reported scale the SLO holds, at the next one tried it does not. When even the slowest
  rate tried fails (halving stops before the trace is stretched past a quarter of the replay
  clock's 106 days, leaving room for its backlog), the policy has no capacity at this size, and
  the limit that failed there is reported. Rejections do not count
  against the SLO: the scheduler rejects only requests no empty engine could hold (a prompt at or
  past max_model_len, or a block larger than the pool), whatever the load, and they are reported.
  ODMA and S3 must also keep their migration rate within the limit, and no replay may be
  overloaded (its queue growing through the run, sim/metrics.queue_growth): an SLO on TPOT alone
  would otherwise hold at rates whose queue never drains. `sustainable_scale` finds the highest
  scale at which the queue keeps up by the stricter test (waits within 1% of the span, not 5%):
  the rate an overloaded replay's output reports it keeps up at.
- Monotonicity is checked, not assumed: the SLO must also hold at 1/2 and 1/4 of the reported
  scale; a failure there is reported (`monotone: false`) with the scale that failed.
- `replicas_for` starts from the division's guess and replays: up by doubling steps while the SLO
  fails, then bisects down to the fewest replicas that meet it.
- `gate_rate` replays one engine at the reported rate as the table prints it (three significant
  digits, rounded: core/units.round_sig3) and, where the SLO fails there, 1% lower each time
  (cut to three digits), up to GATE_TRIES rates: the rate a CI gate (`check --rate`) can be
  given as printed. The SLO is not quite monotone at that scale: on the shipped sample odma held
  at 0.34544 req/s per engine and broke at 0.345 (TPOT p99 100.2 ms); paged held at 0.3308 and
  at 0.331 as printed, and broke at 0.330 and 0.326 between them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from odmactl.allocator import ALLOCATORS
from odmactl.capacity.slo import Slo
from odmactl.core.units import floor_sig3, round_sig3
from odmactl.render.metrics import compared
from odmactl.run.replay import ReplayContext, replay_policy, replayed_together
from odmactl.sim.metrics import LATENCY_METRICS, MIN_COMPLETED, p50_p99
from odmactl.sim.workload import CLOCK_LIMIT_PS, PS

MAX_SCALE_STEPS = 20  # doubling or halving from the trace's own rate: scales 2**-20 .. 2**20
# a rate is reported only from enough served requests: at least MIN_COMPLETED (sim/metrics.py),
# and a rate whose requests were mostly rejected describes the few it served, not the traffic
# (`too_few_served`)
MAX_REJECTED_SHARE = 0.10
MONOTONE_FACTORS = (0.5, 0.25)
GATE_STEP = 0.01  # `gate_rate`: each rate tried 1% below the last, written to three significant digits
GATE_TRIES = 5


@dataclass(frozen=True)
class CapacityTarget:
    """What `find_capacity` holds a replay to: the SLO (an empty one holds always), the limit on a
    predicting policy's overflow rate (`max_migration_rate`, --max-migration-rate: migrations plus
    preemptions per request, as plan bounds it), and that the replay's `queue_flag` metric
    (sim/metrics.queue_growth) is false.
    Invariant: 0 < tolerance; max_replicas >= 1."""

    slo: Slo
    max_migration_rate: float
    tolerance: float = 0.02
    max_replicas: int = 256
    queue_flag: str = "overloaded"  # or the stricter "falling_behind"
    router: str = "round-robin"  # how requests reach R > 1 engines (sim/cluster.py ROUTERS)
    served_enough: bool = True  # refuse a rate from too few served requests (`too_few_served`)


# only that the queue keeps up, by the stricter test: `sustainable_scale`
# (the rate a replay's overload warning names, on whatever it replayed: no minimum of requests)
STABLE = CapacityTarget(Slo(()), math.inf, queue_flag="falling_behind", served_enough=False)


TOTALS = ("requests", "completed", "rejections", "rejected_prompt_too_long", "migrations", "preemptions",
          "generated_tokens")  # summed over engines
FLAGS = ("overloaded", "falling_behind")  # any engine's


def _combined(metrics: list[dict], latencies: dict, end_s: float, scale: float) -> dict:
    """`served`'s document from each engine's metrics, the latency percentiles over all their
    requests and the end of the last one."""
    totals = {key: sum(m[key] for m in metrics) for key in TOTALS}
    n = totals["requests"]
    if "prefill_tokens_saved" in metrics[0]:  # a prefix cache (every engine of a run keeps one or none)
        saved, looked_up, evicted = (sum(m[key] for m in metrics) for key in
                                     ("prefill_tokens_saved", "prefix_looked_up_tokens", "prefix_evictions"))
        totals.update(prefill_tokens_saved=saved, prefix_hit_rate=saved / max(looked_up, 1), prefix_evictions=evicted)
    return {**totals, "replicas": len(metrics), "rate_scale": scale,
            **{key: any(bool(m[key]) for m in metrics) for key in FLAGS}, **latencies,
            "migration_rate": totals["migrations"] / n, "overflow_rate": (totals["migrations"] + totals["preemptions"]) / n,
            "tps": totals["generated_tokens"] / max(end_s, 1e-12), "makespan_s": end_s}


def served(ctx: ReplayContext, policy: str, table: dict, scale: float, replicas: int = 1,
           router: str = "round-robin") -> dict:
    """The metrics of the trace at `scale` times its arrival rate over `replicas` engines behind
    `router`, combined over all requests. Round-robin needs no engine's state: each engine's share
    is replayed apart (the same schedule, faster); the other routers replay the engines together
    (sim/cluster.py)."""
    workload = ctx.workload.at_rate_scale(scale)
    ttft, tpot, metrics = [], [], []
    end_s = 0.0
    start_ps = int(workload.arrival_ps[0])
    if replicas > 1 and router != "round-robin":
        results = replayed_together(dataclasses.replace(ctx, workload=workload), policy, table, replicas, router)
    else:
        results = [replay_policy(dataclasses.replace(ctx, workload=workload.replica(r, replicas)), policy, table)[0]
                   for r in range(min(replicas, workload.arrival_ps.size))]  # an engine past the requests gets none
    for result in results:
        if not result.metrics["requests"]:
            continue  # an engine the router sent nothing
        metrics.append(result.metrics)
        ttft.append(result.ttft_s)
        tpot.append(result.tpot_s)
        end_s = max(end_s, (result.first_arrival_ps - start_ps) / PS + result.metrics["makespan_s"])
    ttft_p50, ttft_p99 = p50_p99(np.concatenate(ttft))
    tpot_p50, tpot_p99 = p50_p99(np.concatenate(tpot))
    return _combined(metrics, {"ttft_p50": ttft_p50, "ttft_p99": ttft_p99, "tpot_p50": tpot_p50, "tpot_p99": tpot_p99},
                     end_s, scale)


def served_as_replayed(ctx: ReplayContext, metrics: dict) -> dict | None:
    """`served(ctx, ..., 1.0)` from the metrics of a replay of `ctx` as it is (one engine, the
    trace's own rate, so its latency percentiles are the replay's own), without replaying again;
    None when the rate scale's rounding would move an arrival (a trace longer than 2**53 ps, where
    float64 no longer holds every picosecond)."""
    w = ctx.workload
    if not np.array_equal(w.at_rate_scale(1.0).arrival_ps, w.arrival_ps):
        return None
    return _combined([metrics], {key: metrics[key] for key in LATENCY_METRICS},
                     metrics["makespan_s"], 1.0)


def failures(metrics: dict, policy: str, target: CapacityTarget) -> list[tuple[str, float, float]]:
    """(metric, value, limit) for every limit the metrics break."""
    broken = target.slo.failures(metrics)
    # a policy that sizes blocks from predictions is held to the overflow rate plan holds it to:
    # migrations plus preemptions per request (S3's supervisor preempts where ODMA migrates)
    if ALLOCATORS[policy].uses_predictions and metrics["overflow_rate"] > target.max_migration_rate:
        broken.append(("overflow_rate", metrics["overflow_rate"], target.max_migration_rate))
    if metrics[target.queue_flag]:
        broken.append((target.queue_flag, 1.0, 0.0))
    return broken


def too_few_served(metrics: dict) -> str | None:
    """Why no rate is reported from a replay whose served requests are too few (MIN_COMPLETED,
    MAX_REJECTED_SHARE), or None. Rejections do not depend on the load (the module docstring), so
    the replay at the trace's own rate decides it for every rate."""
    n, done, rejected = metrics["requests"], metrics["completed"], metrics["rejections"]
    if rejected > MAX_REJECTED_SHARE * n:
        too_long = metrics["rejected_prompt_too_long"]
        why = f"{too_long:,} with a prompt at or past max_model_len" if too_long == rejected else \
            f"{too_long:,} with a prompt at or past max_model_len, {rejected - too_long:,} larger than the pool"
        return (f"{rejected:,} of {n:,} requests are rejected at any rate ({why}); a rate is reported only when at "
                f"most {MAX_REJECTED_SHARE:.0%} are: a larger --max-model-len or KV pool serves them")
    if done < MIN_COMPLETED:
        served = f"all {n:,} requests complete" if done == n else f"only {done:,} of {n:,} requests complete"
        return (f"{served}; a rate is reported only from at least {MIN_COMPLETED} "
                "completed requests (a p99 over fewer describes a handful): replay a longer trace")
    return None


def lowest_scale(arrival_s: np.ndarray) -> float:
    """The slowest rate tried: the trace's span stretched to at most a quarter of the replay clock."""
    span_ps = float(arrival_s[-1] - arrival_s[0]) * PS
    return max(2.0 ** -MAX_SCALE_STEPS, 4 * span_ps / CLOCK_LIMIT_PS)


def find_capacity(ctx: ReplayContext, policy: str, table: dict, target: CapacityTarget,
                  memo: dict[float, dict] | None = None, monotone: bool = True) -> dict:
    """The largest rate scale at which the SLO holds (see the module docstring), with every probe.
    `memo`: rate scale -> `served`'s metrics on one engine, read before replaying and filled after
    (a replay depends on nothing else, so two searches of one (ctx, policy, table) can share
    their probes); `monotone` False skips the checks below the scale found."""
    probes: list[dict] = []
    memo = {} if memo is None else memo

    def probe(scale: float) -> bool:
        if scale not in memo:
            memo[scale] = served(ctx, policy, table, scale)
        m = memo[scale]
        broken = failures(m, policy, target)
        probes.append({"rate_scale": scale, "holds": not broken, "failures": [list(f) for f in broken],
                       **{k: m[k] for k in LATENCY_METRICS}, "metrics": m})  # each an SLO may bound
        return not broken

    lo = hi = None
    held = probe(1.0)
    few = too_few_served(probes[0]["metrics"]) if target.served_enough else None
    if few is not None:
        return {"rate_scale": None, "next_rate_scale": None, "metrics": probes[0]["metrics"], "monotone": True,
                "failed_below_at_scale": None, "infeasible": few, "too_few_served": True,
                "probes": [{k: v for k, v in probes[0].items() if k != "metrics"}]}
    if held:
        lo, scale = 1.0, 2.0
        for _ in range(MAX_SCALE_STEPS):
            if not probe(scale):
                hi = scale
                break
            lo, scale = scale, scale * 2
    else:
        hi, scale, lowest = 1.0, 0.5, lowest_scale(ctx.workload.arrival_ps / PS)
        while scale >= lowest:
            if probe(scale):
                lo = scale
                break
            hi, scale = scale, scale / 2
    def without_metrics() -> list[dict]:  # every probe, by rate, for the JSON and the plot
        return sorted(({k: v for k, v in p.items() if k != "metrics"} for p in probes), key=lambda p: p["rate_scale"])

    if lo is None:  # no rate the replay's clock can hold meets it: say which limit fails at the lowest
        last = probes[-1]
        metric, value, limit = last["failures"][0]
        why = "the queue grows through the run" if metric == target.queue_flag else \
            f"{metric} = " + " > ".join(compared(metric, value, limit))
        return {"rate_scale": None, "next_rate_scale": last["rate_scale"], "metrics": last["metrics"], "monotone": True,
                "failed_below_at_scale": None,
                "infeasible": f"{why} even at {last['rate_scale']:.3g}x the trace's rate", "too_few_served": False,
                "probes": without_metrics()}
    while hi is not None and hi / lo > 1 + target.tolerance:
        mid = math.sqrt(lo * hi)
        if probe(mid):
            lo = mid
        else:
            hi = mid
    at = next(p for p in probes if p["rate_scale"] == lo)
    broken_below = next((lo * f for f in MONOTONE_FACTORS if not probe(lo * f)), None) if monotone else None
    return {"rate_scale": lo, "next_rate_scale": hi, "metrics": at["metrics"], "monotone": broken_below is None,
            "failed_below_at_scale": broken_below, "infeasible": None, "too_few_served": False, "probes": without_metrics()}


def replicas_for(ctx: ReplayContext, policy: str, table: dict, target: CapacityTarget, target_scale: float,
                 per_replica_scale: float) -> dict:
    """The fewest replicas (behind the target's router) that serve the trace at `target_scale` within the SLO,
    found by replaying from the division's guess, then bisecting: where the guess holds, one
    fewer is tried first (the guess is usually the answer); where it fails, up by doubling steps
    while the SLO fails; then by bisection between the last count that failed and the first that
    held (never a shortcut there: where one engine more can break the SLO, a tiny trace's
    overload test at 15 engines, say, a first count found below would be missed);
    {"replicas": None} past `max_replicas`. Where one engine more never breaks the SLO this is the
    count a search one engine at a time finds, in a logarithmic number of replays. Never more
    engines than requests (one more would be sent nothing)."""
    target = dataclasses.replace(target, max_replicas=min(target.max_replicas, ctx.workload.arrival_ps.size))
    guess = min(max(1, math.ceil(target_scale / per_replica_scale)), target.max_replicas)
    runs: dict[int, dict] = {}

    def holds(replicas: int) -> bool:
        runs[replicas] = served(ctx, policy, table, target_scale, replicas, target.router)
        return not failures(runs[replicas], policy, target)

    if holds(guess):
        low, high = 0, guess  # low fails (no engine serves nothing), high holds
        if high > 1:  # the guess is usually the answer: one replay says so
            if not holds(high - 1):
                return {"replicas": high, "metrics": runs[high]}
            high -= 1
    else:
        low, step = guess, 1
        while True:
            if low == target.max_replicas:
                return {"replicas": None, "metrics": runs[low]}
            candidate = min(low + step, target.max_replicas)
            if holds(candidate):
                high = candidate
                break
            low, step = candidate, 2 * step
    while high - low > 1:  # low fails, high holds
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle
    return {"replicas": high, "metrics": runs[high]}


def gate_rate(ctx: ReplayContext, policy: str, table: dict, target: CapacityTarget, scale: float, mean_rate: float,
              memo: dict[float, dict]) -> dict:
    """The highest rate written to three significant digits at which one engine meets the SLO,
    tried from `scale` (find_capacity's) times `mean_rate` as the table prints it (`round_sig3`)
    down in GATE_STEP steps, each cut to three digits (`floor_sig3`):
    {"rate_per_s": it, or None when none of the GATE_TRIES rates held, "tried": every rate tried,
    highest first}. `memo` as `find_capacity` takes it."""
    tried: list[float] = []
    rate = round_sig3(scale * mean_rate)
    for _ in range(GATE_TRIES):
        tried.append(rate)
        at = rate / mean_rate
        if at not in memo:
            memo[at] = served(ctx, policy, table, at)
        if not failures(memo[at], policy, target):
            return {"rate_per_s": rate, "tried": tried}
        rate = floor_sig3(rate * (1 - GATE_STEP))
    return {"rate_per_s": None, "tried": tried}


def capacity_job(ctx: ReplayContext, policy: str, table: dict, target: CapacityTarget, target_scale: float,
                 mean_rate: float, routers: tuple[str, ...]) -> dict:
    """One policy at one tensor-parallel size: its capacity, then the replicas the target needs.
    Where one engine meets the SLO at no rate (a burst or a long prefill that one engine cannot
    absorb), the replicas are still searched, from one engine up: R engines behind the router
    split what one engine could not; and `gate_rate` ("gate") at the trace's `mean_rate`.
    The replicas are searched behind each of `routers` (the target's own router is replaced),
    apart (each search as capacity with that router alone makes it), and "target" is the router
    that needs the fewest (`fewest_router`), with "router" and "replicas_by_router" (None: more
    than max_replicas)."""
    memo: dict[float, dict] = {}
    found = find_capacity(ctx, policy, table, target, memo)
    if found["too_few_served"]:  # no count of engines changes which requests are served
        return {**found, "keeps_up": None, "gate": None,
                "target": {"replicas": None, "metrics": found["metrics"], "router": routers[0],
                           "replicas_by_router": dict.fromkeys(routers)}}
    gate = None if found["rate_scale"] is None else \
        gate_rate(ctx, policy, table, target, found["rate_scale"], mean_rate, memo)
    # the rate plan and replay say one engine keeps up at (its queue stops growing), from the same
    # probes where they coincide: where the SLO's rate is lower, the SLO binds, not the queue
    keeps_up = sustainable_scale(ctx, policy, table, memo=memo)
    per_replica = found["rate_scale"] if found["rate_scale"] is not None else target_scale
    needs = {router: replicas_for(ctx, policy, table, dataclasses.replace(target, router=router), target_scale,
                                  per_replica) for router in routers}
    chosen = fewest_router(needs)
    return {**found, "keeps_up": keeps_up, "gate": gate,
            "target": {**needs[chosen], "router": chosen,
                       "replicas_by_router": {router: need["replicas"] for router, need in needs.items()}}}


def latency_order(metrics: dict | None) -> tuple[float, float]:
    """How capacity orders answers that need as many devices (two routers for a row, the
    headline's rows): the lower TTFT p99 at the target, then TPOT p99 (a latency no request had
    counts as 0)."""
    m = metrics or {}
    return m.get("ttft_p99") or 0.0, m.get("tpot_p99") or 0.0


def fewest_router(needs: dict[str, dict]) -> str:
    """The router whose `replicas_for` answer ({"replicas", "metrics"}) needs the fewest replicas
    (None: none within max_replicas, more than any count); among ties, the lower latencies at the
    target (`latency_order`), then the first listed."""
    routers = list(needs)

    def order(router: str) -> tuple:
        replicas = needs[router]["replicas"]
        return (replicas is None, replicas or 0,
                *(latency_order(needs[router]["metrics"]) if replicas is not None else (0.0, 0.0)),
                routers.index(router))

    return min(routers, key=order)


def sustainable_scale(ctx: ReplayContext, policy: str, table: dict, metrics: dict | None = None,
                      memo: dict[float, dict] | None = None) -> dict:
    """The highest rate scale at which the queue stops growing (`find_capacity` with no SLO and no
    migration limit): {"rate_scale": the scale or None, "next_rate_scale": the first scale tried
    above it}. `metrics`: the replay of `ctx` at its own rate, when the caller has it (its probe at
    scale 1 is not replayed again). The monotonicity checks are not run: they do not enter this
    answer. `memo` as `find_capacity` takes it."""
    memo = {} if memo is None else memo
    known = None if metrics is None else served_as_replayed(ctx, metrics)
    if known is not None:
        memo.setdefault(1.0, known)
    found = find_capacity(ctx, policy, table, STABLE, memo, monotone=False)
    return {"rate_scale": found["rate_scale"], "next_rate_scale": found["next_rate_scale"]}


def capacity_scale(ctx: ReplayContext, policy: str, table: dict, target: CapacityTarget) -> tuple[float, str | None]:
    """The rate scale `find_capacity` reports, 0.0 when no rate meets the SLO (plan's capacity
    objective), and why no rate is reported at all where too few requests are served
    (`too_few_served`), else None."""
    found = find_capacity(ctx, policy, table, target)
    return found["rate_scale"] or 0.0, found["infeasible"] if found["too_few_served"] else None

