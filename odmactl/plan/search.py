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
  hedge table            with a fitted predictor, in place of gamma and tau (odmactl/rules/hedge.py): 8, 16
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
   the chosen one is the best by the objective (tps, kv_utilization, or with `--objective capacity`
   the rate it sustains within `--slo`, found by bisection as `odmactl capacity` finds it) among
   those that keep the overflow rate (migrations plus preemptions, per request: an overflow the large pool cannot take
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
import hashlib
import math

import numpy as np
import polars as pl

from odmactl.capacity.run import trace_rates
from odmactl.capacity.search import CapacityTarget, capacity_scale
from odmactl.core.errors import ConfigError
from odmactl.plan.bounds import distinct, estimate_all, rank
from odmactl.plan.choose import choose
from odmactl.plan.grid import HEDGE_FIT_SHARE, Candidate, candidate_grid, coverage_gamma, fit_hedges, with_hedge
from odmactl.plan.spec import PlanSpec
from odmactl.rules.buckets import quantile_boundaries
from odmactl.run.executors import run_jobs
from odmactl.run.replay import prepare
from odmactl.run.serving import serving
from odmactl.sim.workload import Workload

STATIC_TIGHT_TOKENS = 8192


def trace_digest(frame: pl.DataFrame) -> str:
    cols = frame.select(["arrival_s", "prompt_tokens", "output_tokens"])
    return hashlib.sha256(cols.write_ipc(None).getvalue()).hexdigest()[:16]


def plan(frame: pl.DataFrame, spec: PlanSpec, progress=None) -> dict:
    """Search, replay, choose and validate; returns the JSON-ready plan document."""
    setup = serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes, tp=spec.tp)
    if spec.predictor == "none":
        raise ConfigError("plan sizes ODMA's blocks from predicted lengths: give --predictor P/ (from `odmactl fit`) "
                          "or --predictor oracle (the upper bound)")
    if frame.height < 200:
        raise ConfigError(f"plan needs at least 200 requests to search and validate on, the trace has {frame.height}")
    if spec.objective == "capacity":
        trace_rates(frame["arrival_s"].to_numpy().astype(float))  # the arrivals must spread over time to be scaled
    ctx, label = prepare(frame, spec, setup)
    workload, max_len = ctx.workload, ctx.max_len
    too_long = int((workload.prompt_tokens >= max_len).sum())
    if too_long > workload.size // 2:
        raise ConfigError(f"{too_long:,} of the {workload.size:,} requests have prompts of max_model_len ({max_len:,} "
                          f"tokens) or more and can never be served (KV pool {setup.pool_tokens:,} tokens on "
                          f"{setup.device.name}): nothing worth planning is left", hint="a larger --kv-pool or device, "
                          "or a larger --max-model-len")
    split = int(round(frame.height * (1.0 - spec.holdout)))
    search_w, hold_w = workload.take(0, split), workload.take(split, frame.height)
    pool_tokens = setup.pool_tokens

    grid = candidate_grid(coverage_gamma(spec.predictor), spec.max_overflow_rate)
    # hedge tables: fitted on the earlier part of the search part, measured (bounds and replays) on
    # the rest, so that choosing one sees how it holds up on requests it was not fitted on
    fit_rows = int(split * HEDGE_FIT_SHARE)
    later_w = search_w.take(fit_rows, split)
    hedges = fit_hedges(search_w.take(0, fit_rows), max_len, grid)
    estimates = estimate_all([c for c in grid if not c.hedge_groups], search_w, max_len, pool_tokens,
                             spec.workers, progress=progress)
    estimates += estimate_all([c for c in grid if c.hedge_groups], later_w, max_len, pool_tokens,
                              spec.workers, progress=progress, hedges=hedges, label="plan: bounds of hedge tables")
    ranked, pruned = rank(estimates, spec.objective, spec.max_overflow_rate)
    if not ranked:  # nothing keeps migrations near the limit by the bounds: replay the closest ones
        ranked = sorted(estimates, key=lambda e: (e["overflow_rate"], -e["kv_utilization"]))
    shortlist = distinct(ranked)[: spec.replays]
    search_ctx = dataclasses.replace(ctx, workload=search_w)
    later_ctx = dataclasses.replace(ctx, workload=later_w)
    search_jobs = [(later_ctx, with_hedge(e["candidate"], hedges)) if e["candidate"].hedge_groups
                   else (search_ctx, e["candidate"].allocator_table()) for e in shortlist]
    metrics = run_jobs(search_jobs, spec.workers, "plan: replay candidates", progress, executor=spec.executor)
    if spec.objective == "capacity":  # each candidate's sustainable rate at the SLO, found by replay
        target = CapacityTarget(spec.slo, spec.max_overflow_rate)
        scales = run_jobs([(c, "odma", table, target) for c, table in search_jobs], spec.workers,
                          "plan: capacity of the candidates", progress, fn=capacity_scale, executor=spec.executor)
        metrics = [{**m, "capacity_rate_scale": scale} for m, scale in zip(metrics, scales)]
    replayed = list(zip(shortlist, metrics))
    best, feasible = choose(replayed, spec)
    chosen = shortlist[best]["candidate"]

    # validation on the later part: the recommendation and the baselines
    hold_ctx = dataclasses.replace(ctx, workload=hold_w)
    final_table = {**with_hedge(chosen, fit_hedges(search_w, max_len, [chosen])),
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
        "device": setup.device.name, "tp": setup.tp, "model": setup.model_name, "kv_dtype": spec.kv_dtype,
        "predictor": label,
        "kv_pool_bytes": setup.pool_bytes, "kv_bytes_per_token": setup.bytes_per_token, "max_model_len": max_len,
        "max_num_seqs": ctx.scheduler.max_num_seqs, "max_num_batched_tokens": ctx.scheduler.batched_tokens(max_len),
        "objective": spec.objective, "max_overflow_rate": spec.max_overflow_rate, "ttft_p99_s": spec.ttft_p99_s,
        "slo": None if spec.slo is None else dict(spec.slo.limits_s),
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
