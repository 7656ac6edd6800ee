"""Plan's cheap bounds: every candidate's overflow rate, KV utilization and capacity index on a
workload, without a replay (ODMA's reservation rule applied to whole arrays, the boundaries refitted
per refresh period); the pruning and ranking that pick which candidates are replayed."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from odmactl.plan.grid import Candidate, workload_lengths
from odmactl.rules.buckets import rounded_quantiles
from odmactl.rules.odma import large_slots, need_tokens_array
from odmactl.run.executors import run_jobs
from odmactl.sim.workload import Workload

PRUNE_SLACK = 1.5  # keep candidates whose estimated overflow rate is within 1.5 x the limit


@dataclass(frozen=True)
class _Periods:
    """The boundaries in force over a workload, one row per refresh period: row 0 is the warm start
    (quantiles of the first window) until the first refresh, row j the quantiles of the
    `refit_window` realized lengths before request j * refit_every. Rows are nondecreasing (merged
    boundaries repeat). `shifted` is the rows raveled with row j offset by j * (max_len + 1), so one
    searchsorted finds every request's bucket within its own period."""

    rows: np.ndarray      # [periods, B]
    period: np.ndarray    # [n]: the period of each request
    shifted: np.ndarray   # [periods * B]

    @classmethod
    def of(cls, kv: np.ndarray, c: Candidate, max_len: int, granularity: int) -> _Periods:
        levels = c.quantile_levels()

        def bounds(values: np.ndarray) -> np.ndarray:
            return rounded_quantiles(values, levels, granularity, max_len)

        rows = [bounds(kv[: c.refit_window])]
        rows += [bounds(kv[max(0, start - c.refit_window):start]) for start in range(c.refit_every, kv.size, c.refit_every)]
        table = np.asarray(rows, dtype=np.int64)
        period = np.arange(kv.size, dtype=np.int64) // c.refit_every
        offsets = np.arange(table.shape[0], dtype=np.int64)[:, None] * (max_len + 1)
        return cls(table, period, (table + offsets).ravel())


def estimate(candidates: list[Candidate], w: Workload, max_len: int, pool_tokens: int,
             granularity: int = 16, progress=None, hedges: dict | None = None, label: str = "plan: bounds",
             max_new_tokens: int | None = None) -> list[dict]:
    """Each candidate's cheap figures on workload `w` (see the module docstring), outputs capped at
    `max_new_tokens` (None: uncapped; a large block holds prompt + the cap, rules/odma.py). The
    boundaries depend on (B, levels, top quantile, refit), the reservations also on gamma (or the
    hedge table), the routing also on tau, and the large pool only scales the capacity: each is
    computed once for the candidates that share it. A hedge candidate reserves by
    `hedges[(groups, limit)]`."""
    assert w.uncertainty is not None, "plan needs predictions"
    prompt, kv, output, l_hat = workload_lengths(w, max_len, max_new_tokens)
    slot = large_slots(prompt, max_new_tokens, max_len)
    largest_slot = int(slot.max()) if slot.size else max_len
    u = w.uncertainty
    total_output = float(output.sum())
    periods: dict[tuple, _Periods] = {}
    reserved_of: dict[tuple, np.ndarray] = {}
    routed: dict[tuple, dict] = {}
    out = []
    for j, c in enumerate(candidates):
        key = c.boundary_key
        if key not in periods:
            periods[key] = _Periods.of(kv, c, max_len, granularity)
        rule = ("hedge", c.hedge_groups, c.hedge_limit) if c.hedge_groups else ("gamma", c.gamma)
        if key + rule not in reserved_of:
            hedge = hedges[(c.hedge_groups, c.hedge_limit)] if c.hedge_groups else None
            need = need_tokens_array(prompt, l_hat, u, c.gamma, hedge)
            bucket, fits = _reserve_rows(need, periods[key], max_len)
            reserved_of[key + rule] = np.minimum(bucket, slot), fits  # a block holds at most what its request can reach
        if key + rule + (c.tau,) not in routed:
            reserved, fits = reserved_of[key + rule]
            large = (u > c.tau) | ~fits
            migrate = ~large & (kv > reserved)
            final = np.where(large | migrate, slot, reserved)
            routed[key + rule + (c.tau,)] = {
                "overflow_rate": float(migrate.mean()) if kv.size else 0.0,
                "kv_utilization": float(kv.sum() / final.sum()) if kv.size else 0.0,
                "routed_large": float(large.mean()) if kv.size else 0.0,
                "main_tt": float(np.sum(np.where(large, 0, reserved * np.where(migrate, np.maximum(reserved - prompt, 1), output)))),
                "large_tt": float(np.sum(np.where(large, slot * output, np.where(migrate, slot * (kv - reserved), 0))))}
        r = routed[key + rule + (c.tau,)]
        large_tokens = max(int(pool_tokens * c.large_pool_fraction), largest_slot)  # >= one block
        main_tokens = pool_tokens - large_tokens
        sustain = min(main_tokens / r["main_tt"] if r["main_tt"] else math.inf,
                      large_tokens / r["large_tt"] if r["large_tt"] else math.inf)
        both = r["main_tt"] + r["large_tt"]
        out.append({"candidate": c, "overflow_rate": r["overflow_rate"], "kv_utilization": r["kv_utilization"],
                    "capacity_index": sustain * total_output, "routed_large": r["routed_large"],
                    "large_share": r["large_tt"] / both if both else 0.0})
        if progress is not None and (j + 1) % 16 == 0:
            progress(label, j + 1, len(candidates))
    return out


def estimate_all(candidates: list[Candidate], w: Workload, max_len: int, pool_tokens: int, workers: int,
                 progress=None, hedges: dict | None = None, label: str = "plan: bounds",
                 max_new_tokens: int | None = None) -> list[dict]:
    """`estimate` of every candidate, in grid order, split over `workers` processes. Candidates that
    share boundaries (B, levels, refit) stay in one job, so each job computes them once."""
    if workers == 1 or not candidates:
        return estimate(candidates, w, max_len, pool_tokens, progress=progress, hedges=hedges, label=label,
                        max_new_tokens=max_new_tokens)
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(candidates):
        groups.setdefault(c.boundary_key, []).append(i)
    chunks: list[list[int]] = [[] for _ in range(min(len(groups), 4 * workers))]  # a few per worker evens the load
    for k, members in enumerate(groups.values()):
        chunks[k % len(chunks)] += members
    jobs = [([candidates[i] for i in chunk], w, max_len, pool_tokens) for chunk in chunks]
    results = run_jobs(jobs, workers, label, progress,
                       fn=functools.partial(estimate, hedges=hedges, max_new_tokens=max_new_tokens))
    out: list = [None] * len(candidates)
    for chunk, rows in zip(chunks, results):
        for i, row in zip(chunk, rows):
            out[i] = row
    return out


def _reserve_rows(need: np.ndarray, periods: _Periods, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """`rules.odma.reserved_kv_tokens` before the tau test, each request with the boundaries of its
    refresh period, vectorised: (the smallest boundary >= need, whether there is one)."""
    b = periods.rows.shape[1]
    fits = need <= periods.rows[periods.period, -1]
    found = np.searchsorted(periods.shifted, np.minimum(need, max_len) + periods.period * (max_len + 1), side="left")
    index = np.minimum(found, periods.period * b + b - 1)  # where nothing fits the slot is not used
    return periods.rows.ravel()[index], fits


def distinct(ranked: list[dict]) -> list[dict]:
    """The ranked candidates less those whose estimates equal a better one's (with exact predictions
    gamma and tau change nothing, for one): replays go to candidates that behave differently."""
    seen, out = set(), []
    for e in ranked:
        key = tuple(round(e[k], 9) for k in ("overflow_rate", "kv_utilization", "capacity_index", "routed_large"))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def rank(estimates: list[dict], objective: str, max_overflow_rate: float) -> tuple[list[dict], int]:
    """Survivors of the pruning, best first by the objective's estimate (those estimated within the
    limit before those only within its slack); and how many were pruned."""
    keep = [e for e in estimates if e["overflow_rate"] <= max_overflow_rate * PRUNE_SLACK + 1e-12]
    key = "kv_utilization" if objective == "utilization" else "capacity_index"  # tps and capacity: the index
    order = sorted(range(len(keep)), key=lambda i: (keep[i]["overflow_rate"] > max_overflow_rate + 1e-12,
                                                    -keep[i][key], -keep[i]["kv_utilization"], i))
    return [keep[i] for i in order], len(estimates) - len(keep)
