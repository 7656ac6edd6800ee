"""`odmactl plan`: choose ODMA's settings on the earlier part of a trace and validate the choice on
the later part, against static, paged and s3.

The search space (`candidate_grid`, 2,160 candidates; with a fitted predictor up to 4,320, and 1,728
hedge-table candidates):
  num_buckets B          4, 6, 8, 12, 16, 32, 64, 128, 256 (fine buckets round a well-hedged need up
                         the least)
  quantile levels        "equal": i/B (ODMA eq. 2, equal occupancy); "tail": 1 - (1 - i/B)^2, finer
                         buckets in the long tail, where rounding a request up costs the most
  gamma                  0, 0.25, 0.5, 1, 2 (need = prompt + ceil(L_hat * (1 + gamma * u))), and with
                         a fitted predictor also 0.5, 0.7, 0.85, 1 and 1.2 x its coverage gamma (the
                         gamma at which its headroom u covers 99% of held-back lengths: predictor.py)
  tau                    0.5, 0.8, or never (u > tau sends a request to the large pool)
  large_pool_fraction    0.05, 0.1, 0.2, 0.3 of the KV pool (at least one max_model_len block: without
                         one, a request longer than the last boundary could never be served)
  refit window / every   10,000 / 1,000 (the papers) and 2,000 / 200 (faster drift)
  hedge table            with a fitted predictor, in place of gamma and tau (odmactl/hedge.py): 8, 16
                         or 32 groups of L_hat, each with its own output reservation, fitted to let at
                         most 0.3, 0.5, 0.7 or 1 x the migration-rate limit outgrow. A table is fitted
                         on the first two thirds of the search part, and its bounds and replays are
                         on the last third (out of sample: drift shows); the chosen one is refitted on
                         the whole search part for serving.

1. Cheap bounds, no replay (`estimate`): for every candidate, ODMA's reservation rule applied to the
   search part with vectorised numpy (rules/odma.py's `need_tokens_array`), the boundaries refitted per
   refresh period from the realized lengths before it (arrival order stands in for completion
   order). From it: the overflow rate (a main-pool block the realized length outgrows), the KV
   utilization (realized / reserved at completion), and a capacity index: how much decode time the
   two pools sustain, min(main tokens / main token-time, large tokens / large token-time), where a
   request holds its block for as many steps as it generates. Candidates whose estimated overflow
   rate exceeds 1.5 x the limit are pruned; the rest are ranked by the objective's estimate. The
   bounds run in the worker processes too (`estimate_all`).
2. The best `replays` survivors are replayed on the search part, in worker processes (or on Ray);
   the chosen one is the best by the objective (tps or kv_utilization) among those that keep the
   overflow rate (migrations plus preemptions, per request: an overflow the large pool cannot take
   preempts the request) within the migration-rate limit with a margin for sampling noise (the
   count plus one Poisson standard error, sqrt(count), must keep it: `overflow_bound`), reject
   nothing a policy could serve (a prompt past max_model_len is rejected by all) and, when asked,
   keep TTFT p99 within its bound; when none does, the one closest to doing so.
3. Validation on time: the chosen config, static (at max_model_len, and at 8,192 when that is
   tighter), paged and s3 are replayed on the held-out later part; those are the expected metrics
   written to the config and the report.

Deterministic: candidates are evaluated independently and collected in grid order, so the result
does not depend on the number of workers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import multiprocessing
import shlex
import sys
import tomllib
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import tomli_w

from odmactl.rules.buckets import bucket_levels, quantile_boundaries, rounded_quantiles
from odmactl.core.errors import ConfigError
from odmactl.rules.hedge import HedgeTable, fit_hedge_tables
from odmactl.rules.odma import need_tokens_array
from odmactl.run.config import config_tables
from odmactl.run.replay import ReplayContext, replay_policy
from odmactl.run.serving import default_max_model_len, serving
from odmactl.run.spec import LoadOptions, ServingSpec
from odmactl.run.workload import build_workload
from odmactl.predict.source import PREDICTOR_CHOICES
from odmactl.sim.loop import SchedulerSettings
from odmactl.sim.workload import Workload

BUCKETS = (4, 6, 8, 12, 16, 32, 64, 128, 256)
LEVELS = ("equal", "tail")
GAMMAS = (0.0, 0.25, 0.5, 1.0, 2.0)
COVERAGE_FRACTIONS = (0.5, 0.7, 0.85, 1.0, 1.2)  # of the predictor's coverage gamma
TAUS = (0.5, 0.8, math.inf)
HEDGE_GROUPS = (8, 16, 32)  # hedge tables (odmactl/hedge.py): groups of L_hat
HEDGE_LIMIT_FRACTIONS = (0.3, 0.5, 0.7, 1.0)  # of the migration-rate limit, the share a table may outgrow where fitted
HEDGE_FIT_SHARE = 2 / 3  # a table is fitted on this earlier share of the search part, measured on the rest
LARGE_FRACTIONS = (0.05, 0.1, 0.2, 0.3)
REFITS = ((10_000, 1_000), (2_000, 200))
OBJECTIVES = ("tps", "utilization")
OVERFLOW_MARGIN_SE = 1.0  # choose: a replay's overflow count plus one standard error must keep the limit
PRUNE_SLACK = 1.5  # keep candidates whose estimated overflow rate is within 1.5 x the limit
STATIC_TIGHT_TOKENS = 8192
EXECUTORS = ("process", "ray")


@dataclass(frozen=True)
class Candidate:
    """One point of the search space; `allocator_table()` is its [allocator] settings."""

    num_buckets: int
    levels: str
    gamma: float
    tau: float
    large_pool_fraction: float
    refit_window: int
    refit_every: int
    hedge_groups: int = 0  # > 0: a hedge table over this many groups of L_hat replaces gamma
    hedge_limit: float = 0.0  # the share of requests the table may outgrow where it is fitted

    def quantile_levels(self) -> tuple[float, ...]:
        equal = bucket_levels(self.num_buckets)
        if self.levels == "equal":
            return equal
        return tuple(round(1.0 - (1.0 - level) ** 2, 6) for level in equal)

    @property
    def boundary_key(self) -> tuple[int, str, int, int]:
        """What its boundaries over a workload depend on: candidates that share it share them."""
        return (self.num_buckets, self.levels, self.refit_window, self.refit_every)

    @property
    def config_tau(self) -> float:
        """tau as [allocator] and the plan JSON write it: never is 1e9 (TOML and JSON have no infinity)."""
        return self.tau if math.isfinite(self.tau) else 1.0e9

    def allocator_table(self) -> dict:
        return {"num_buckets": self.num_buckets, "quantile_levels": list(self.quantile_levels()),
                "gamma": self.gamma, "tau": self.config_tau,
                "large_pool_fraction": self.large_pool_fraction, "refit_window": self.refit_window,
                "refit_every": self.refit_every}

    @property
    def label(self) -> str:
        tau = f"{self.tau:g}" if math.isfinite(self.tau) else "never"
        large = f"{self.large_pool_fraction:.0%}"
        hedge = f"hedge={self.hedge_groups}@{self.hedge_limit:.2%}" if self.hedge_groups else f"gamma={self.gamma:g}"
        return (f"B={self.num_buckets} {self.levels} {hedge} tau={tau} "
                f"large={large} refit={self.refit_window}/{self.refit_every}")


def candidate_grid(coverage_gamma: float | None = None, max_overflow_rate: float | None = None) -> list[Candidate]:
    """The gamma candidates, and with a fitted predictor (`coverage_gamma`) and a migration-rate
    limit also the hedge-table candidates (tau never: the table hedges by L_hat instead of u)."""
    gammas = list(GAMMAS)
    if coverage_gamma is not None and coverage_gamma > 0:
        gammas += [g for g in (round(f * coverage_gamma, 3) for f in COVERAGE_FRACTIONS) if g not in gammas]
    grid = [Candidate(b, lv, g, t, f, w, e) for b in BUCKETS for lv in LEVELS for g in gammas for t in TAUS
            for f in LARGE_FRACTIONS for w, e in REFITS]
    if coverage_gamma is not None and max_overflow_rate:
        grid += [Candidate(b, lv, 0.0, math.inf, f, w, e, k, round(share * max_overflow_rate, 6))
                 for b in BUCKETS for lv in LEVELS for k in HEDGE_GROUPS for share in HEDGE_LIMIT_FRACTIONS
                 for f in LARGE_FRACTIONS for w, e in REFITS]
    return grid


def coverage_gamma(predictor: str) -> float | None:
    """The fitted predictor's conformal coverage gamma (None for "oracle", or an s3-mode predictor)."""
    from pathlib import Path

    from odmactl.predict.artifact import read_manifest

    if predictor in PREDICTOR_CHOICES:
        return None

    manifest = read_manifest(Path(predictor))
    if manifest["settings"].get("mode") != "odma":
        return None
    return float(manifest["state"]["coverage_gamma"])


@dataclass(frozen=True)
class PlanSpec(ServingSpec):
    """`odmactl plan`: the serving spec (the predictor is required: a fit artifact or oracle) and
    the search's objective, constraints, split and executors."""

    predictor: str = "oracle"
    objective: str = "tps"
    max_overflow_rate: float = 0.005  # --max-migration-rate: (migrations + preemptions) / requests
    ttft_p99_s: float | None = None
    holdout: float = 0.3
    replays: int = 12
    workers: int = 1
    executor: str = "process"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective expects one of {', '.join(OBJECTIVES)}, got '{self.objective}'")
        if not 0.0 <= self.max_overflow_rate <= 1.0:
            raise ConfigError(f"--max-migration-rate must be in [0, 1], got {self.max_overflow_rate}")
        if self.ttft_p99_s is not None and not self.ttft_p99_s > 0:
            raise ConfigError(f"--ttft-p99 must be > 0 seconds, got {self.ttft_p99_s}")
        if not 0.05 <= self.holdout <= 0.8:
            raise ConfigError(f"--holdout must be between 0.05 and 0.8 (a share of the trace), got {self.holdout}")
        if self.replays < 1:
            raise ConfigError(f"--replays must be >= 1, got {self.replays}")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"--executor expects one of {', '.join(EXECUTORS)}, got '{self.executor}'")


# ------------------------------------------------------------------------------------------ bounds

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


def _lengths(w: Workload, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the bounds and the hedge fits read of a workload: prompt tokens, realized KV tokens
    (capped at max_len), the output tokens generated within max_len, and L_hat (at least 1)."""
    assert w.predicted_output_tokens is not None, "plan needs predictions"
    prompt = w.prompt_tokens.astype(np.int64)
    kv = w.kv_tokens(max_len)
    return prompt, kv, kv - np.minimum(prompt, kv), np.maximum(w.predicted_output_tokens, 1.0)


def estimate(candidates: list[Candidate], w: Workload, max_len: int, pool_tokens: int,
             granularity: int = 16, progress=None, hedges: dict | None = None, label: str = "plan: bounds") -> list[dict]:
    """Each candidate's cheap figures on workload `w` (see the module docstring). The boundaries
    depend on (B, levels, refit), the reservations also on gamma (or the hedge table), the routing
    also on tau, and the large pool only scales the capacity: each is computed once for the
    candidates that share it. A hedge candidate reserves by `hedges[(groups, limit)]`."""
    assert w.uncertainty is not None, "plan needs predictions"
    prompt, kv, output, l_hat = _lengths(w, max_len)
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
            reserved_of[key + rule] = _reserve_rows(need, periods[key], max_len)
        if key + rule + (c.tau,) not in routed:
            reserved, fits = reserved_of[key + rule]
            large = (u > c.tau) | ~fits
            migrate = ~large & (kv > reserved)
            final = np.where(large | migrate, max_len, reserved)
            routed[key + rule + (c.tau,)] = {
                "overflow_rate": float(migrate.mean()) if kv.size else 0.0,
                "kv_utilization": float(kv.sum() / final.sum()) if kv.size else 0.0,
                "routed_large": float(large.mean()) if kv.size else 0.0,
                "main_tt": float(np.sum(np.where(large, 0, reserved * np.where(migrate, np.maximum(reserved - prompt, 1), output)))),
                "large_tt": float(np.sum(np.where(large, max_len * output, np.where(migrate, max_len * (kv - reserved), 0))))}
        r = routed[key + rule + (c.tau,)]
        large_tokens = max(int(pool_tokens * c.large_pool_fraction) // max_len, 1) * max_len  # >= one block
        main_tokens = pool_tokens - large_tokens
        sustain = min(main_tokens / r["main_tt"] if r["main_tt"] else math.inf,
                      large_tokens / r["large_tt"] if r["large_tt"] else math.inf)
        out.append({"candidate": c, "overflow_rate": r["overflow_rate"], "kv_utilization": r["kv_utilization"],
                    "capacity_index": sustain * total_output, "routed_large": r["routed_large"]})
        if progress is not None and (j + 1) % 16 == 0:
            progress(label, j + 1, len(candidates))
    return out


def _reserve_rows(need: np.ndarray, periods: _Periods, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """`rules.odma.reserved_kv_tokens` before the tau test, each request with the boundaries of its
    refresh period, vectorised: (the smallest boundary >= need, whether there is one)."""
    b = periods.rows.shape[1]
    fits = need <= periods.rows[periods.period, -1]
    found = np.searchsorted(periods.shifted, np.minimum(need, max_len) + periods.period * (max_len + 1), side="left")
    index = np.minimum(found, periods.period * b + b - 1)  # where nothing fits the slot is not used
    return periods.rows.ravel()[index], fits


def _distinct(ranked: list[dict]) -> list[dict]:
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
    key = "capacity_index" if objective == "tps" else "kv_utilization"
    order = sorted(range(len(keep)), key=lambda i: (keep[i]["overflow_rate"] > max_overflow_rate + 1e-12,
                                                    -keep[i][key], -keep[i]["kv_utilization"], i))
    return [keep[i] for i in order], len(estimates) - len(keep)


# ------------------------------------------------------------------------------------------ replays

def replay_candidate(ctx: ReplayContext, table: dict, policy: str = "odma", series: bool = False) -> dict:
    """One replay of `policy` with the [allocator] settings `table` on the context's workload: its
    metrics, or (series=True) metrics, time series and the config used."""
    result, config, _, _ = replay_policy(ctx, policy, table)
    if not series:
        return result.metrics
    return {"policy": policy, "max_model_len": ctx.max_len, "metrics": result.metrics, "series": result.series,
            "config": config.to_mapping()}


def run_jobs(jobs: list[tuple], workers: int, label: str, progress=None, fn=None) -> list:
    """`fn(*job)` (default `replay_candidate`) for every job, in `workers` processes; results in the
    jobs' order (whichever finishes first), so the outcome does not depend on the number of workers."""
    fn = fn or replay_candidate
    results: list = [None] * len(jobs)
    if workers == 1 or len(jobs) == 1:
        for i, job in enumerate(jobs):
            results[i] = fn(*job)
            if progress is not None:
                progress(label, i + 1, len(jobs))
        return results
    method = "fork" if sys.platform == "linux" else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        futures = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        for done, future in enumerate(as_completed(futures), start=1):
            results[futures[future]] = future.result()
            if progress is not None:
                progress(label, done, len(jobs))
    return results


def estimate_all(candidates: list[Candidate], w: Workload, max_len: int, pool_tokens: int, workers: int,
                 progress=None, hedges: dict | None = None, label: str = "plan: bounds") -> list[dict]:
    """`estimate` of every candidate, in grid order, split over `workers` processes. Candidates that
    share boundaries (B, levels, refit) stay in one job, so each job computes them once."""
    if workers == 1 or not candidates:
        return estimate(candidates, w, max_len, pool_tokens, progress=progress, hedges=hedges, label=label)
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(candidates):
        groups.setdefault(c.boundary_key, []).append(i)
    chunks: list[list[int]] = [[] for _ in range(min(len(groups), 4 * workers))]  # a few per worker evens the load
    for k, members in enumerate(groups.values()):
        chunks[k % len(chunks)] += members
    jobs = [([candidates[i] for i in chunk], w, max_len, pool_tokens) for chunk in chunks]
    results = run_jobs(jobs, workers, label, progress, fn=functools.partial(estimate, hedges=hedges))
    out: list = [None] * len(candidates)
    for chunk, rows in zip(chunks, results):
        for i, row in zip(chunk, rows):
            out[i] = row
    return out


def _replay_on_ray(jobs: list[tuple[ReplayContext, dict]], progress=None) -> list[dict]:
    """The same replays as Ray tasks (each context is put in the object store once)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray installed", hint="pip install 'odmactl[ray]'") from None
    ray.init(ignore_reinit_error=True)
    remote = ray.remote(replay_candidate)
    shared: dict[int, object] = {}
    refs = []
    for ctx, table in jobs:
        if id(ctx) not in shared:
            shared[id(ctx)] = ray.put(ctx)
        refs.append(remote.remote(shared[id(ctx)], table))
    results = []
    for i, ref in enumerate(refs):
        results.append(ray.get(ref))
        if progress is not None:
            progress("plan: replay candidates", i + 1, len(jobs))
    return results


def _fit_hedges(w: Workload, max_len: int, candidates: list[Candidate]) -> dict[tuple[int, float], HedgeTable]:
    """The hedge tables of the candidates' (groups, limit) pairs, fitted on workload `w`'s
    predictions and realized lengths (one fit per group count serves all its limits)."""
    prompt, _, output, l_hat = _lengths(w, max_len)
    limits: dict[int, dict[float, None]] = {}
    for c in candidates:
        if c.hedge_groups:
            limits.setdefault(c.hedge_groups, {})[c.hedge_limit] = None
    return {(k, limit): table for k, wanted in limits.items()
            for limit, table in fit_hedge_tables(l_hat, prompt, output, max_len=max_len, groups=k,
                                                 limits=tuple(wanted)).items()}


def _with_hedge(c: Candidate, hedges: dict[tuple[int, float], HedgeTable]) -> dict:
    """The candidate's [allocator] settings, with its hedge table when it has one."""
    table = c.allocator_table()
    if c.hedge_groups:
        hedge = hedges[(c.hedge_groups, c.hedge_limit)]
        table.update(hedge_edges=list(hedge.edges), hedge_output_tokens=list(hedge.output_tokens))
    return table


def overflow_bound(m: dict) -> float:
    """A replay's overflow rate plus OVERFLOW_MARGIN_SE Poisson standard errors of its count: what
    `choose` holds to the limit. The search replays see a few thousand requests, so a candidate
    measured at 13 overflows where 15 are allowed is about as likely over the limit as under it on
    the next requests, which are the ones it will serve."""
    requests = max(m["requests"], 1)
    count = m["overflow_rate"] * requests
    return (count + OVERFLOW_MARGIN_SE * math.sqrt(count)) / requests


def choose(replayed: list[tuple[dict, dict]], spec: PlanSpec) -> tuple[int, bool]:
    """Index of the chosen (estimate, metrics) pair and whether it meets every constraint."""
    def violation(m: dict) -> float:
        # rejections the policy caused (a prompt past max_model_len is rejected whatever the policy)
        over = max(0.0, overflow_bound(m) - spec.max_overflow_rate) + \
            (m["rejections"] - m["rejected_prompt_too_long"]) / max(m["requests"], 1)
        if spec.ttft_p99_s is not None:
            over += max(0.0, m["ttft_p99"] / spec.ttft_p99_s - 1.0)
        return over

    key = "tps" if spec.objective == "tps" else "kv_utilization"
    feasible = [i for i, (_, m) in enumerate(replayed) if violation(m) == 0.0]
    if feasible:
        return max(feasible, key=lambda i: (replayed[i][1][key], replayed[i][1]["kv_utilization"], -i)), True
    return min(range(len(replayed)), key=lambda i: (violation(replayed[i][1]), -replayed[i][1][key], i)), False


# ------------------------------------------------------------------------------------------ the plan

def trace_digest(frame: pl.DataFrame) -> str:
    cols = frame.select(["arrival_s", "prompt_tokens", "output_tokens"])
    return hashlib.sha256(cols.write_ipc(None).getvalue()).hexdigest()[:16]


def plan(frame: pl.DataFrame, spec: PlanSpec, progress=None) -> dict:
    """Search, replay, choose and validate; returns the JSON-ready plan document."""
    setup = serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes)
    if spec.predictor == "none":
        raise ConfigError("plan sizes ODMA's blocks from predicted lengths: give --predictor P/ (from `odmactl fit`) "
                          "or --predictor oracle (the upper bound)")
    if frame.height < 200:
        raise ConfigError(f"plan needs at least 200 requests to search and validate on, the trace has {frame.height}")
    workload, frame, label = build_workload(frame, LoadOptions(), spec.predictor)
    max_len = spec.max_model_len or default_max_model_len(workload, setup.model, setup.pool_tokens)
    split = int(round(frame.height * (1.0 - spec.holdout)))
    search_w, hold_w = workload.take(0, split), workload.take(split, frame.height)
    scheduler = SchedulerSettings(**({"max_num_seqs": spec.max_num_seqs} if spec.max_num_seqs else {}))
    pool_tokens = setup.pool_tokens

    grid = candidate_grid(coverage_gamma(spec.predictor), spec.max_overflow_rate)
    # hedge tables: fitted on the earlier part of the search part, measured (bounds and replays) on
    # the rest, so that choosing one sees how it holds up on requests it was not fitted on
    fit_rows = int(split * HEDGE_FIT_SHARE)
    later_w = search_w.take(fit_rows, split)
    hedges = _fit_hedges(search_w.take(0, fit_rows), max_len, grid)
    estimates = estimate_all([c for c in grid if not c.hedge_groups], search_w, max_len, pool_tokens,
                             spec.workers, progress=progress)
    estimates += estimate_all([c for c in grid if c.hedge_groups], later_w, max_len, pool_tokens,
                              spec.workers, progress=progress, hedges=hedges, label="plan: bounds of hedge tables")
    ranked, pruned = rank(estimates, spec.objective, spec.max_overflow_rate)
    if not ranked:  # nothing keeps migrations near the limit by the bounds: replay the closest ones
        ranked = sorted(estimates, key=lambda e: (e["overflow_rate"], -e["kv_utilization"]))
    shortlist = _distinct(ranked)[: spec.replays]
    ctx = ReplayContext(setup, search_w, max_len, scheduler)
    later_ctx = ReplayContext(setup, later_w, max_len, scheduler)
    search_jobs = [(later_ctx, _with_hedge(e["candidate"], hedges)) if e["candidate"].hedge_groups
                   else (ctx, e["candidate"].allocator_table()) for e in shortlist]
    if spec.executor == "ray":
        metrics = _replay_on_ray(search_jobs, progress)
    else:
        metrics = run_jobs(search_jobs, spec.workers, "plan: replay candidates", progress)
    replayed = list(zip(shortlist, metrics))
    best, feasible = choose(replayed, spec)
    chosen = shortlist[best]["candidate"]

    # validation on the later part: the recommendation and the baselines
    hold_ctx = ReplayContext(setup, hold_w, max_len, scheduler)
    final_table = {**_with_hedge(chosen, _fit_hedges(search_w, max_len, [chosen])),
                   "boundaries_tokens": _final_boundaries(search_w, chosen, max_len)}
    runs = [("odma", "odma", final_table, max_len), ("static", "static", {}, max_len)]
    if max_len > STATIC_TIGHT_TOKENS:
        runs.append((f"static@{STATIC_TIGHT_TOKENS}", "static", {}, STATIC_TIGHT_TOKENS))
    runs += [("paged", "paged", {}, max_len), ("s3", "s3", {}, max_len)]
    jobs = [(hold_ctx if length == max_len else dataclasses.replace(hold_ctx, max_len=length), table, policy, True)
            for _, policy, table, length in runs]
    done = run_jobs(jobs, spec.workers, "plan: validate on the later part", progress)
    validation = {name: result for (name, *_), result in zip(runs, done)}
    return {
        "trace": {"requests": frame.height, "search_requests": split, "holdout_requests": frame.height - split,
                  "digest": trace_digest(frame)},
        "device": setup.device.name, "model": setup.model.name, "kv_dtype": spec.kv_dtype, "predictor": label,
        "kv_pool_bytes": setup.pool_bytes, "kv_bytes_per_token": setup.bytes_per_token, "max_model_len": max_len,
        "max_num_seqs": scheduler.max_num_seqs,
        "objective": spec.objective, "max_overflow_rate": spec.max_overflow_rate, "ttft_p99_s": spec.ttft_p99_s,
        "candidates": len(grid), "pruned": pruned, "replayed": len(replayed),
        "constraints_met_on_search": feasible,
        "chosen": {"label": chosen.label, "allocator": final_table},
        "search": {"estimates": [_estimate_row(e) for e in estimates],
                   "replays": [{**_estimate_row(e), "allocator": table, "measured": m}
                               for (e, m), (_, table) in zip(replayed, search_jobs)]},
        "validation": validation,
        "against_baselines": _against(validation),
        "holdout_histogram": _histogram(hold_w, max_len),
    }


def _against(validation: dict) -> dict:
    """On the held-out part: the recommendation's KV-utilization lead in points, its TPS gain and
    its migration rate minus each baseline's."""
    odma = validation["odma"]["metrics"]
    out = {}
    for name, v in validation.items():
        if name == "odma":
            continue
        m = v["metrics"]
        out[name] = {"kv_utilization_points": 100.0 * (odma["kv_utilization"] - m["kv_utilization"]),
                     "tps_gain": odma["tps"] / m["tps"] - 1.0 if m["tps"] > 0 else math.inf,
                     "migration_rate_difference": odma["migration_rate"] - m["migration_rate"]}
    return out


def _histogram(w: Workload, max_len: int, bins: int = 80) -> dict:
    counts, edges = np.histogram(w.kv_tokens(max_len), bins=bins, range=(0, max_len))
    return {"edges_tokens": edges.tolist(), "counts": counts.tolist()}


def _final_boundaries(w: Workload, c: Candidate, max_len: int) -> list[int]:
    """The boundaries the refit would hold at the end of the search part (the start for serving)."""
    return list(quantile_boundaries(w.kv_tokens(max_len)[-c.refit_window:], c.num_buckets, max_tokens=max_len,
                                    levels=c.quantile_levels()))


def _estimate_row(e: dict) -> dict:
    """One candidate's settings (its label's, as numbers: the quantile levels follow from
    num_buckets and levels) and its cheap estimate."""
    c: Candidate = e["candidate"]
    settings = {f.name: getattr(c, f.name) for f in dataclasses.fields(Candidate)}
    settings["tau"] = c.config_tau
    return {"label": c.label, "settings": settings,
            "estimate": {k: e[k] for k in ("overflow_rate", "kv_utilization", "capacity_index", "routed_large")}}


def config_document(doc: dict, command: str, predictor: str) -> dict:
    """The config TOML plan writes: what `replay --config` and `check` read, and the expected metrics.
    `predictor` is how the config names the predictor (`run.config.predictor_for_config`)."""
    odma = doc["validation"]["odma"]["metrics"]
    allocator = {**doc["chosen"]["allocator"], "max_model_len_tokens": doc["max_model_len"]}
    baselines = {name: {k: v["metrics"][k] for k in EXPECTED_KEYS} for name, v in doc["validation"].items()
                 if name != "odma"}
    return {
        "meta": {"generated_by": command, "policy": "odma", "device": doc["device"], "model": doc["model"],
                 "predictor": predictor, "objective": doc["objective"], "trace_digest": doc["trace"]["digest"],
                 "search_requests": doc["trace"]["search_requests"],
                 "holdout_requests": doc["trace"]["holdout_requests"],
                 "candidates": doc["candidates"], "replayed": doc["replayed"], "chosen": doc["chosen"]["label"],
                 "constraints_met_on_search": doc["constraints_met_on_search"],
                 "expected": {k: odma[k] for k in EXPECTED_KEYS}, "baselines": baselines},
        "allocator": allocator,
        "scheduler": {"max_num_seqs": doc["max_num_seqs"]},
        "thresholds": {"min_utilization": math.floor(odma["kv_utilization"] * 0.9 * 1000) / 1000,
                       "max_overflow_rate": doc["max_overflow_rate"], "max_rejection_rate": 0.0},
    }


def plan_command(trace_path: Path, spec: PlanSpec, out_path: Path) -> str:
    """The command line a config records (`[meta] generated_by`): the settings that decided it."""
    args = ["odmactl", "plan", trace_path, "--device", spec.device, "--model", spec.model, "--predictor", spec.predictor,
            "--objective", spec.objective, "--max-migration-rate", spec.max_overflow_rate, "--holdout", spec.holdout,
            "--replays", spec.replays, "--out", out_path]
    if spec.ttft_p99_s is not None:
        args += ["--ttft-p99", spec.ttft_p99_s]
    return " ".join(shlex.quote(str(a)) for a in args)


def config_text(config: dict) -> str:
    """The config as TOML, checked to read back as a valid config."""
    text = "# Written by odmactl plan; [meta] says how and what it expects.\n" + tomli_w.dumps(config)
    config_tables(tomllib.loads(text), None)
    return text


EXPECTED_KEYS = ("kv_utilization", "tps", "migration_rate", "overflow_rate", "rejections", "ttft_p99", "tpot_p99", "peak_concurrency")
