"""A replay's result: DESIGN.md's metrics from the per-request times and the loop's counters."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from odmactl.sim.series import Series
from odmactl.sim.workload import PS


@dataclass
class ReplayResult:
    """What one replay measured: `metrics` (names of DESIGN.md), per-request arrays, time series."""

    policy: str
    metrics: dict[str, float | int]
    series: dict[str, list]
    allocator: dict[str, object]
    ttft_s: np.ndarray = field(repr=False)
    tpot_s: np.ndarray = field(repr=False)
    queue: dict = field(default_factory=dict)  # `queue_growth`: whether the run was overloaded, and why
    first_arrival_ps: int = 0  # the first request's arrival (the replay's time origin for makespan_s)


@dataclass(frozen=True)
class Timeline:
    """Per request (int64 arrays, row i is request i): arrival, the start of its first prefill, its
    first token and completion in ps (start_ps and first_ps -1 for a request never prefilled,
    done_ps -2 for a rejected one), the output tokens it
    was to generate within max_model_len (`target`), its prompt, and the KV tokens it held at the
    end (`reserved_tokens`)."""

    arrival_ps: np.ndarray
    start_ps: np.ndarray
    first_ps: np.ndarray
    done_ps: np.ndarray
    target: np.ndarray
    prompt: np.ndarray
    reserved_tokens: np.ndarray
    first_arrival_ps: int


def p50_p99(values: np.ndarray) -> tuple[float | None, float | None]:
    """The 50th and 99th percentiles; None for no values (no request completed, or none had a
    second token: a latency that was never observed is not 0); the same values as two
    np.percentile calls."""
    return tuple(float(v) for v in np.percentile(values, [50, 99])) if values.size else (None, None)


OVERLOAD_PARTS = 4  # the run's requests split by arrival into this many equal parts
OVERLOAD_SPAN_SHARE = 0.05  # the last part's median wait must pass this share of the arrival span
KEEP_UP_SPAN_SHARE = 0.01  # the stricter share a rate the server keeps up at must stay under


def queue_growth(timeline: Timeline) -> dict:
    """Whether the queue grew through the run (overload), from the served requests' waits in the
    queue (arrival to the start of their first prefill: their own prefill is service, not
    waiting). They are split by arrival into OVERLOAD_PARTS equal parts, and the run is overloaded
    when the later half's median wait is longer than the earlier half's and the last part's median
    wait is longer than OVERLOAD_SPAN_SHARE of the arrivals' span. A server that keeps up drains
    its bursts, so its waits stay far below the span (seconds against minutes or hours) and do not
    rise from one half to the next; an overloaded one is still behind when the arrivals stop, by a
    wait that grows with the span. Not judged (overloaded False) for fewer than OVERLOAD_PARTS
    served requests or when they all arrive at once (offline). `falling_behind` is the same test at
    KEEP_UP_SPAN_SHARE: the rate a replay keeps up at (capacity/search.sustainable_scale) is one
    without it, so waits there stay within 1% of the span, not just under the alarm's 5%. Also the
    arrival rate of all the requests replayed (rejected ones too): what a rate scale multiplies."""
    ok = timeline.done_ps >= 0
    arrival = timeline.arrival_ps[ok]
    span_s = float(arrival[-1] - arrival[0]) / PS if arrival.size else 0.0
    every = timeline.arrival_ps
    every_span_s = float(every[-1] - every[0]) / PS if every.size else 0.0
    out = {"overloaded": False, "falling_behind": False, "wait_p50_by_part_s": [], "arrival_span_s": span_s,
           "arrival_rate_per_s": (every.size - 1) / every_span_s if every_span_s > 0 else None}
    if arrival.size < OVERLOAD_PARTS or span_s <= 0:
        return out
    waits = (timeline.start_ps[ok] - arrival) / PS
    medians = [float(np.median(part)) for part in np.array_split(waits, OVERLOAD_PARTS)]  # arrival order
    half = arrival.size // 2
    out["wait_p50_by_part_s"] = medians
    growing = bool(np.median(waits[half:]) > np.median(waits[:half]))
    out["overloaded"] = growing and medians[-1] > OVERLOAD_SPAN_SHARE * span_s
    out["falling_behind"] = growing and medians[-1] > KEEP_UP_SPAN_SHARE * span_s
    return out


def kv_runs_per_request(alloc, tl: Timeline, ok: np.ndarray) -> float:
    """The mean KV runs of the completed requests at their end (see replay_result): as the policy
    counts them, else one per contiguous request or per block it held."""
    counted = alloc.mean_released_runs()
    if counted is not None:
        return counted
    if alloc.read_block_tokens is None or not ok.any():
        return 1.0 if ok.any() else 0.0
    return float(np.mean(tl.reserved_tokens[ok] // alloc.read_block_tokens))


# a p99 over fewer completed requests is a statement about a handful (a two-request trace
# "sustained" 243,031 req/s): capacity reports no rate from fewer (capacity/search.py
# `too_few_served`), and check warns when it judges a latency from fewer (render/warnings.py)
MIN_COMPLETED = 50
# the latency metrics a replay reports (`replay_result`), in seconds: capacity's SLO limits them
# (capacity/slo.py) and check's gate bounds them (run/config.py Thresholds)
LATENCY_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")
# the largest limit a latency may be given (31.7 years: `--slo ttft_p99=1e9s` reads as "no limit"); its
# text past it (1e300 s written out, or inf ms) would fill the report
LATENCY_LIMIT_MAX_S = 1e9
# the smallest (1 ms): the reports write TTFT to the millisecond, so a smaller limit read "<= 0.000 s"
LATENCY_LIMIT_MIN_S = 1e-3
# what a limit in seconds is expected to be, as a config key or a flag in seconds says it
LATENCY_LIMIT_SECONDS = f"a time in seconds from {LATENCY_LIMIT_MIN_S:g} to {LATENCY_LIMIT_MAX_S:,.0f}"


def latency_limit_ok(seconds: float) -> bool:
    """Whether `seconds` may bound a latency (capacity's --slo, check's [thresholds]): finite and
    from LATENCY_LIMIT_MIN_S to LATENCY_LIMIT_MAX_S."""
    return math.isfinite(seconds) and LATENCY_LIMIT_MIN_S <= seconds <= LATENCY_LIMIT_MAX_S


def replay_result(alloc, counters: dict, timeline: Timeline, series: Series,
                  boundaries: list[tuple[float, list[int]]]) -> ReplayResult:
    """The metrics, from the per-request timeline and the loop's counters, and the time series."""
    assert not alloc.live_allocations(), "allocations outlived the replay"
    alloc.check_invariants()
    c, tl = counters, timeline
    ok = tl.done_ps >= 0
    kv_final = (tl.prompt + tl.target)[ok]
    kv_reserved = tl.reserved_tokens[ok]
    ttft = (tl.first_ps[ok] - tl.arrival_ps[ok]) / PS
    multi = ok & (tl.target > 1)
    tpot = (tl.done_ps[multi] - tl.first_ps[multi]) / (tl.target[multi] - 1) / PS
    # the span ends at the last completion (or, when none completed, where the replay's clock stopped)
    last_done = int(tl.done_ps[ok].max()) if ok.any() else c["end_ps"]
    span_ps = max(last_done - tl.first_arrival_ps, 1)
    generated = int(tl.target[ok].sum())
    num = int(tl.arrival_ps.size)
    ttft_p50, ttft_p99 = p50_p99(ttft)
    tpot_p50, tpot_p99 = p50_p99(tpot)
    metrics: dict[str, float | int] = {
        "requests": num,
        "completed": int(ok.sum()),
        "rejections": c["rejections"],
        "rejected_prompt_too_long": c["rejected_prompt_too_long"],
        "truncated": c["truncated"],
        "generated_tokens": generated,
        "kv_utilization": float(kv_final.sum() / kv_reserved.sum()) if kv_reserved.size else 0.0,
        "pool_occupancy": c["occupancy_byte_ps"] / (alloc.pool_bytes * span_ps),
        "tps": generated / (span_ps / PS),
        "ttft_p50": ttft_p50, "ttft_p99": ttft_p99,
        "tpot_p50": tpot_p50, "tpot_p99": tpot_p99,
        "migrations": c["migrations"],
        "migration_rate": c["migrations"] / num if num else 0.0,
        # every request that outgrew its memory: moved (migration) or, with no room to move to,
        # preempted; plan's migration-rate limit and check's max_overflow_rate apply to this
        "overflow_rate": (c["migrations"] + c["preemptions"]) / num if num else 0.0,
        "migrated_bytes": c["migrated_bytes"],
        "migration_time_s": c["migration_ps"] / PS,
        "preemptions": c["preemptions"],
        "stalls": c["stalls"],
        "recomputed_tokens": c["recomputed_tokens"],
        "peak_concurrency": c["peak_concurrency"],
        "mean_batch": generated / max(c["decode_iterations"] + c["prefill_iterations"], 1),
        "decode_iterations": c["decode_iterations"],
        "prefill_iterations": c["prefill_iterations"],
        "makespan_s": span_ps / PS,
        # the KV runs a request is read as (per KV head, K and V, per layer), at its end: one for a
        # contiguous request, its blocks when paged, its page ranges where the policy counts them
        "kv_runs_per_request": kv_runs_per_request(alloc, tl, ok),
        # bytes the policy moved between host memory and the devices (adapters loaded, KV offloaded
        # and fetched), the link's time, and the part of it no compute hid
        "host_link_bytes": c["host_link_bytes"],
        # a pool shared with activations (eLLM): the most KV bytes held past the KV pool
        "peak_borrowed_bytes": max(0, alloc.peak_reserved_bytes - c["kv_pool_bytes"]),
        "host_link_time_s": c["host_link_ps"] / PS,
        "link_bottleneck_s": c["link_bottleneck_ps"] / PS,
    }
    if "prefix_looked_up_tokens" in c:  # a replay with a prefix cache (allocator/prefix.py)
        # tokens of the admitted prompts (and recomputed tokens) found cached, over all admissions
        metrics["prefix_hit_rate"] = c["prefix_hit_tokens"] / max(c["prefix_looked_up_tokens"], 1)
        metrics["prefill_tokens_saved"] = c["prefix_hit_tokens"]
        metrics["prefix_looked_up_tokens"] = c["prefix_looked_up_tokens"]  # vLLM's prefix_cache_stats "queries"
        metrics["prefix_evictions"] = c["prefix_evictions"]
    queue = queue_growth(tl)
    metrics["overloaded"] = queue["overloaded"]
    metrics["falling_behind"] = queue["falling_behind"]
    rows = series.rows
    series_out = {
        "time_s": [r[0] / PS for r in rows],
        "pool_occupancy": [r[1] / alloc.pool_bytes for r in rows],

        "batch_size": [r[2] for r in rows],
        "queue_length": [r[3] for r in rows],
        "bucket_boundaries": [{"time_s": ts, "boundaries_tokens": b} for ts, b in boundaries],
    }
    if c["kv_pool_bytes"] < alloc.pool_bytes:  # a pool that holds borrowed memory: the KV past the KV pool
        series_out["borrowed_bytes"] = [max(0, r[1] - c["kv_pool_bytes"]) for r in rows]
    return ReplayResult(alloc.name, metrics, series_out, alloc.stats().to_dict(), ttft, tpot, queue,
                        int(tl.first_arrival_ps))


# Bucket upper bounds (seconds) of the latency histograms a replay exports (replay --metrics-out):
# TTFT from tens of milliseconds to the hours of an overloaded queue, TPOT around a decode step.
LATENCY_BUCKETS_S = {
    "ttft_s": (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0),
    "tpot_s": (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
}


def latency_histograms(result: ReplayResult) -> dict[str, dict]:
    """TTFT and TPOT of the completed requests as cumulative histograms over LATENCY_BUCKETS_S:
    for each bound `le` the requests at or below it (the last bound is +Inf: all of them), their
    sum in seconds and their count (Prometheus' histogram model)."""
    out = {}
    for name, values in (("ttft_s", result.ttft_s), ("tpot_s", result.tpot_s)):
        v = np.sort(np.asarray(values, dtype=np.float64))
        bounds = LATENCY_BUCKETS_S[name]
        cumulative = [int(np.searchsorted(v, b, side="right")) for b in bounds] + [int(v.size)]
        out[name] = {"le": [*bounds, "+Inf"], "cumulative": cumulative, "sum": float(v.sum()), "count": int(v.size)}
    return out
