"""`odmactl plan`: choose ODMA's settings on the earlier part of a trace and validate the choice on
the later part, against static, paged and s3.

The search space (`candidate_grid`, 4,860 candidates; with a fitted predictor up to 9,720, and 3,888
hedge-table candidates; all of them at each max_model_len searched):
  num_buckets B          4, 6, 8, 12, 16, 32, 64, 128, 256 (fine buckets round a well-hedged need up
                         the least)
  quantile levels        "equal": i/B (ODMA eq. 2, equal occupancy); "tail": 1 - (1 - i/B)^2, finer
                         buckets in the long tail, where rounding a request up costs the most;
                         both below a top quantile of 0.95, 0.99 or 1 (the tail past it takes the
                         large pool)
  gamma                  0, 0.25, 0.5, 1, 2 (need = prompt + ceil(L_hat * (1 + gamma * u))), and with
                         a fitted predictor also 0.5, 0.7, 0.85, 1 and 1.2 x its coverage gamma (the
                         gamma at which its headroom u covers 99% of held-back lengths: predictor.py)
  tau                    0.5, 0.8, or never (u > tau sends a request to the large pool)
  large_pool_fraction    0.05, 0.1, 0.2 of the KV pool for the bounds and the replays (at least one
                         largest large block: without one, a request longer than the last boundary
                         could never be served; never more than half the pool, as max_model_len is
                         at most half of it); the config's large pool is sized by `_tune` from a replay
                         of the chosen candidate (its peak, or under a backlog its share of
                         block-token-time in large blocks)
  scheduler, large_spill the task pool or fcfs, each with a full large pool's block waiting or spilling
                         to the main pool: whichever serves the objective better, a tie to the lower
                         TTFT p99 (`_tune`)
  max_model_len          --max-model-len; else plan's default (`plan_max_model_len`) and, with
                         --max-rejection-rate > 0, caps below it (grid.model_len_caps)
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
   no more than --max-rejection-rate (the gate's rejection limit) and, when asked, keep TTFT p99
   within its bound; when none does, the one closest to doing so.
3. Validation on time: the chosen config, static (at max_model_len, and at 8,192 when that is
   tighter), paged and s3 are replayed on the held-out later part; those are the expected metrics
   written to the config and the report. The chosen config is replayed as `check` replays it
   (`_validate`), and judged by the [thresholds] plan writes with check's evaluation (`_gate`):
   plan writes the config only when that gate passes (`holds`). `verdict` says which policy wins
   by the objective; `pool_fit` which requests the deployment cannot serve whole.

Deterministic: candidates are evaluated independently and collected in grid order, so the result
does not depend on the number of workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tomllib

import numpy as np
import polars as pl

from odmactl.allocator import AllocatorConfig
from odmactl.capacity.run import trace_rates
from odmactl.capacity.search import MIN_COMPLETED, CapacityTarget, capacity_scale, sustainable_scale
from odmactl.capacity.slo import Slo
from odmactl.core.errors import ConfigError, OdmaError
from odmactl.gate.thresholds import evaluate
from odmactl.plan.bounds import distinct, estimate_all, rank
from odmactl.plan.choose import OBJECTIVE_METRIC, choose, unmet, violation
from odmactl.plan.config import allocator_table, config_text, thresholds
from odmactl.plan.engine import odma_settings
from odmactl.plan.grid import (
    HEDGE_FIT_SHARE,
    MAX_UNSERVED_SHARE,
    Candidate,
    candidate_grid,
    coverage_gamma,
    fit_hedges,
    model_len_caps,
    tau_setting,
    with_hedge,
)
from odmactl.plan.spec import PlanSpec
from odmactl.render.plan_text import tp_advice
from odmactl.rules.buckets import quantile_boundaries
from odmactl.rules.odma import large_slot_tokens
from odmactl.run.config import config_tables, scheduler_table
from odmactl.run.executors import run_jobs
from odmactl.run.replay import ReplayContext, prepare, replay_policy, run_policies
from odmactl.run.serving import Serving, serving, static_baselines
from odmactl.run.spec import LoadOptions, ReplaySpec
from odmactl.sim.workload import Workload

STATIC_TIGHT_TOKENS = 8192


def trace_digest(frame: pl.DataFrame) -> str:
    cols = frame.select(["arrival_s", "prompt_tokens", "output_tokens"])
    return hashlib.sha256(cols.write_ipc(None).getvalue()).hexdigest()[:16]


def plan(frame: pl.DataFrame, spec: PlanSpec, progress=None) -> tuple[dict, Serving]:
    """Search, replay, choose, validate and gate: the JSON-ready plan document, and the serving
    setup it planned for (the config's engine settings derive from it)."""
    setup = serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes, tp=spec.tp)
    if spec.predictor == "none":
        raise ConfigError("plan sizes ODMA's blocks from predicted lengths: give --predictor P/ (from `odmactl fit`) "
                          "or --predictor oracle (the upper bound)")
    if frame.height < 200:
        raise ConfigError(f"plan needs at least 200 requests to search and validate on, the trace has {frame.height}")
    if spec.objective == "capacity":
        trace_rates(frame["arrival_s"].to_numpy().astype(float))  # the arrivals must spread over time to be scaled
    half_pool = half_pool_tokens(setup.pool_tokens)
    if half_pool < MIN_MODEL_LEN_TOKENS:
        raise ConfigError(f"the KV pool of {setup.group_name} holds {setup.pool_tokens:,} tokens; plan needs "
                          f"half of it to hold a request of {MIN_MODEL_LEN_TOKENS} tokens at least",
                          hint="a larger --kv-pool, --tp or device")
    if spec.max_model_len is not None and spec.max_model_len > half_pool:
        raise ConfigError(f"--max-model-len {spec.max_model_len:,} is more than half the KV pool ({setup.pool_tokens:,} "
                          f"tokens on {setup.group_name}): ODMA's large pool holds at least one max_model_len "
                          f"block and may take at most half the pool ({half_pool:,} tokens)",
                          hint=f"a --max-model-len up to {half_pool:,}, or more memory: a larger --tp or device")
    kv = frame["prompt_tokens"].cast(pl.Int64) + frame["output_tokens"].cast(pl.Int64)
    chosen_len = spec.max_model_len or plan_max_model_len(int(kv.max()), setup)
    ctx, label = prepare(frame, dataclasses.replace(spec, max_model_len=chosen_len), setup)
    workload, max_len = ctx.workload, ctx.max_len
    too_long = int((workload.prompt_tokens >= max_len).sum())
    if too_long > workload.size * MAX_UNSERVED_SHARE:
        raise ConfigError(f"{too_long:,} of the {workload.size:,} requests have prompts of max_model_len ({max_len:,} "
                          f"tokens) or more and can never be served (KV pool {setup.pool_tokens:,} tokens on "
                          f"{setup.group_name}): nothing worth planning is left",
                          hint=tp_advice(pool_fit(workload, setup, spec, max_len))
                          or "a larger --kv-pool or device, or a larger --max-model-len")
    split = int(round(frame.height * (1.0 - spec.holdout)))
    search_w, hold_w = workload.take(0, split), workload.take(split, frame.height)
    pool_tokens = setup.pool_tokens
    new_tokens = ctx.scheduler.max_new_tokens  # the output cap every policy runs under (None: none)

    base = candidate_grid(coverage_gamma(spec.predictor), spec.max_overflow_rate)
    caps = [max_len] if spec.max_model_len is not None else \
        model_len_caps(search_w.kv_tokens(max_len), max_len, spec.max_rejection_rate)
    # hedge tables: fitted on the earlier part of the search part, measured (bounds and replays) on
    # the rest, so that choosing one sees how it holds up on requests it was not fitted on
    fit_rows = int(split * HEDGE_FIT_SHARE)
    later_w = search_w.take(fit_rows, split)
    grid, estimates, hedges = [], [], {}
    for cap in caps:  # every candidate at every max_model_len searched
        part = [c if cap == max_len else dataclasses.replace(c, max_model_len_tokens=cap) for c in base]
        grid += part
        hedges[cap] = fit_hedges(search_w.take(0, fit_rows), cap, part, new_tokens)
        task = "plan: bounds" if len(caps) == 1 else f"plan: bounds at max_model_len {cap:,}"
        estimates += estimate_all([c for c in part if not c.hedge_groups], search_w, cap, pool_tokens,
                                  spec.workers, progress=progress, label=task, max_new_tokens=new_tokens)
        estimates += estimate_all([c for c in part if c.hedge_groups], later_w, cap, pool_tokens,
                                  spec.workers, progress=progress, hedges=hedges[cap], label=task + " (hedge tables)",
                                  max_new_tokens=new_tokens)
    ranked, pruned = rank(estimates, spec.objective, spec.max_overflow_rate)
    all_pruned = not ranked
    if all_pruned:  # nothing keeps migrations near the limit by the bounds: replay the closest ones
        ranked = sorted(estimates, key=lambda e: (e["overflow_rate"], -e["kv_utilization"]))
    different = distinct(ranked)
    shortlist = different[: spec.replays]

    def job(c: Candidate) -> tuple:
        cap = c.max_model_len_tokens or max_len
        if c.hedge_groups:
            return dataclasses.replace(ctx, workload=later_w, max_len=cap), with_hedge(c, hedges[cap])
        return dataclasses.replace(ctx, workload=search_w, max_len=cap), c.allocator_table()

    search_jobs = [job(e["candidate"]) for e in shortlist]
    metrics = run_jobs(search_jobs, spec.workers, "plan: replay candidates", progress, executor=spec.executor)
    target = CapacityTarget(spec.slo, spec.max_overflow_rate) if spec.objective == "capacity" else None
    if target is not None:  # each candidate's sustainable rate at the SLO, found by replay
        scales = run_jobs([(c, "odma", table, target) for c, table in search_jobs], spec.workers,
                          "plan: capacity of the candidates", progress, fn=capacity_scale, executor=spec.executor)
        if all(few for _, few in scales):  # no candidate could be judged (one on a shorter part alone counts as none)
            raise ConfigError(f"--objective capacity finds each candidate's sustainable rate by replaying the search "
                              f"part (the first {split:,} of {frame.height:,} requests), and no candidate gets one: "
                              f"{scales[0][1]}", hint=f"a smaller --holdout: capacity needs at least {MIN_COMPLETED} "
                              "completed requests")
        metrics = [{**m, "capacity_rate_scale": scale} for m, (scale, _) in zip(metrics, scales)]
    replayed = list(zip(shortlist, metrics))
    best, feasible = choose(replayed, spec)
    chosen = shortlist[best]["candidate"]
    max_len = chosen.max_model_len_tokens or max_len
    ctx = dataclasses.replace(ctx, max_len=max_len)
    fit = pool_fit(workload, setup, spec, max_len, capped=bool(chosen.max_model_len_tokens))
    final_table = {**with_hedge(chosen, fit_hedges(search_w, max_len, [chosen], new_tokens)),
                   "boundaries_tokens": _final_boundaries(search_w, chosen, max_len, new_tokens)}
    search_ctx, search_table = search_jobs[best]
    tuned = _tune(search_ctx, search_table, spec, progress, shortlist[best]["large_share"])
    # written as a share of the pool, so that a config applied to another pool (--allow-mismatch, or
    # capacity's other tensor-parallel sizes) keeps the proportion it was planned with; at least one
    # largest block, as the allocator raises it (allocator/odma.py complete_config)
    final_table["large_pool_fraction"] = math.ceil(tuned["large_pool_bytes"] / ctx.serving.pool_bytes * 1e6) / 1e6
    if tuned["large_spill"]:  # written only where it is on (off is the default)
        final_table["large_spill"] = True
    ctx = dataclasses.replace(ctx, scheduler=dataclasses.replace(ctx.scheduler, policy=tuned["scheduler"]))
    validation = _validate(frame, spec, dataclasses.replace(ctx, workload=hold_w), split, final_table, target, progress)
    gate = _gate(validation["odma"], spec)
    doc = {
        "trace": {"requests": frame.height, "search_requests": split, "holdout_requests": frame.height - split,
                  "digest": trace_digest(frame)},
        "device": setup.device.name, "tp": setup.tp, "model": setup.model_name, "kv_dtype": spec.kv_dtype,
        "predictor": label,
        "kv_pool_bytes": setup.pool_bytes, "kv_bytes_per_token": setup.bytes_per_token, "max_model_len": max_len,
        "engine": ctx.scheduler.engine,
        "prefix_caching": ctx.scheduler.caches_prefixes,
        "max_num_seqs": ctx.scheduler.max_num_seqs, "max_num_batched_tokens": ctx.scheduler.batched_tokens(max_len),
        "max_new_tokens": ctx.scheduler.max_new_tokens,
        "block_size_tokens": spec.block_size_tokens or AllocatorConfig().block_size_tokens,
        "block_size_given": spec.block_size_tokens is not None,  # then [allocator] records it for replay --config
        "objective": spec.objective, "max_overflow_rate": spec.max_overflow_rate,
        "max_rejection_rate": spec.max_rejection_rate, "ttft_p99_s": spec.ttft_p99_s,
        "slo": None if spec.slo is None else dict(spec.slo.limits_s),
        "pool_fit": fit, "max_model_lens_searched": caps,
        "candidates": len(grid), "pruned": pruned, "replayed": len(replayed),
        "distinct": len(different), "all_pruned": all_pruned,  # what was replayed from (render/plan_text.search_counts)
        "constraints_met_on_search": feasible, "tuning": tuned, "scheduler": tuned["scheduler"],
        "chosen": {"label": chosen.label, "allocator": final_table,
                   **{k: v for k, v in odma_settings(setup, AllocatorConfig.from_mapping(validation["odma"]["config"]),
                                                     new_tokens, int(workload.prompt_tokens.max())).items()
                      if k in ("large_pool_bytes", "large_pool_blocks", "large_block_tokens")}},
        "gate": gate,
        # written only when the gate passes on the held-out part and the pick met every constraint on
        # the search part, but for the margin for sampling noise
        "holds": gate["passed"] and (feasible or violation(metrics[best], spec, margin=False) == 0.0),
        "unmet_on_search": unmet(metrics[best], spec, margin=False),
        "verdict": verdict(validation, spec.objective),
        "search": {"estimates": [_estimate_row(e) for e in estimates],
                   "replays": [{**_estimate_row(e), "allocator": table, "measured": m}
                               for (e, m), (_, table) in zip(replayed, search_jobs)]},
        "validation": validation,
        "holdout_histogram": _histogram(hold_w, max_len),
    }
    return doc, setup


def plan_max_model_len(longest_tokens: int, setup) -> int:
    """plan's max_model_len when --max-model-len is not given: the trace's longest request (prompt +
    output KV tokens) rounded up to a power of two, headroom for the longer requests of the traffic
    the plan will serve (engines are commonly set so), within the model's positions and half the KV
    pool (`half_pool_tokens`)."""
    value = 1 << max(0, longest_tokens - 1).bit_length()
    positions = setup.full_model.max_position_embeddings
    if positions:
        value = min(value, positions)
    return min(value, half_pool_tokens(setup.pool_tokens))


MIN_MODEL_LEN_TOKENS = 64  # plan refuses a pool whose half holds fewer KV tokens


def half_pool_tokens(pool_tokens: int) -> int:
    """The longest max_model_len plan allows: half the KV pool, rounded down to ODMA's granularity
    (its large pool holds at least one max_model_len block and may take at most half the pool)."""
    granularity_tokens = AllocatorConfig().granularity_tokens
    return pool_tokens // 2 // granularity_tokens * granularity_tokens


TP_OPTIONS = (2, 4, 8)  # the tensor-parallel sizes pool_fit suggests, when the profile has a link


def pool_fit(w: Workload, setup, spec: PlanSpec, max_len: int, capped: bool = False) -> dict:
    """Which requests the plan cannot serve whole: KV (prompt + output) past max_model_len (a prompt
    at or past it is rejected, a longer output truncated there), and past the whole pool, and why
    max_model_len is what it is ("limit": given, a cap searched, half the pool, the model's
    positions, the trace's longest); when
    half the pool limits it, the pool and the share past half of it (the longest max_model_len
    plan allows) at larger tensor-parallel sizes of the same device."""
    kv = w.prompt_tokens.astype(np.int64) + w.output_tokens.astype(np.int64)
    n = max(w.size, 1)
    half = half_pool_tokens(setup.pool_tokens)
    if spec.max_model_len is not None:
        limit = "the --max-model-len given"
    elif capped:
        limit = "a cap searched within --max-rejection-rate"
    elif max_len == half and half < out_longest(kv, setup):
        limit = f"half the KV pool of {setup.pool_tokens:,} tokens, the most ODMA's large pool may take"
    elif max_len == setup.full_model.max_position_embeddings:
        limit = "the model's positions"
    else:
        limit = "the trace's longest request, rounded up to a power of two"
    out = {"pool_tokens": setup.pool_tokens, "half_pool_tokens": half, "limit": limit,
           "max_model_len": max_len, "longest_tokens": int(kv.max()) if kv.size else 0,
           "longest_prompt_tokens": int(w.prompt_tokens.max()) if w.size else 0,
           "over_max_model_len": float((kv > max_len).sum() / n),
           "rejected_prompt": float((w.prompt_tokens >= max_len).sum() / n),
           "over_pool": float((kv > setup.pool_tokens).sum() / n),
           "limited_by_pool": limit.startswith("half"), "options": []}
    if out["over_max_model_len"] > 0 and out["limited_by_pool"] and spec.kv_pool_bytes is None:
        for tp in (t for t in TP_OPTIONS if t > setup.tp):
            try:
                bigger = serving(spec.device, spec.model, spec.kv_dtype, None, tp=tp)
            except OdmaError:  # no link for this size, heads it cannot split, or no pool: not an option
                continue
            half = half_pool_tokens(bigger.pool_tokens)
            out["options"].append({"tp": tp, "pool_tokens": bigger.pool_tokens,
                                   "over_half_pool": float((kv > half).sum() / n)})
    return out


def out_longest(kv: np.ndarray, setup) -> int:
    """The max_model_len the trace asks for: its longest request, within the model's positions."""
    longest = int(kv.max()) if kv.size else 0
    positions = setup.full_model.max_position_embeddings
    return min(longest, positions) if positions else longest


def _validate(frame: pl.DataFrame, spec: PlanSpec, hold_ctx, split: int, final_table: dict,
              target: CapacityTarget | None, progress) -> dict:
    """The recommendation and the baselines on the held-out part. The recommendation is replayed
    as `check` replays a config: its [allocator] and [scheduler] as the config writes them, read
    back, on the trace from request `split` on (`--skip`), through run_policies; the baselines as
    `replay_candidate` jobs on the same requests. An overloaded run gets the rate it sustains; with the capacity
    objective every run gets its rate at the SLO."""
    tables = config_tables(tomllib.loads(config_text({
        "allocator": allocator_table(final_table, hold_ctx.max_len),
        "scheduler": scheduler_table(hold_ctx.scheduler, hold_ctx.max_len, "odma")}, "")), None)
    check_spec = ReplaySpec(device=spec.device, model=spec.model, kv_dtype=spec.kv_dtype, predictor=spec.predictor,
                            kv_pool_bytes=spec.kv_pool_bytes, tp=spec.tp, load=LoadOptions(skip=split))
    held = run_policies(frame, ["odma"], check_spec, tables=tables, sustainable=sustainable_scale)["results"]["odma"]
    base = spec.allocator_overrides()
    statics = static_baselines(spec, hold_ctx.workload, hold_ctx.max_len, hold_ctx.scheduler.max_new_tokens)
    runs = [(name, "static", table, hold_ctx.max_len) for name, table in statics]
    if hold_ctx.max_len > STATIC_TIGHT_TOKENS:
        runs.append((f"static@{STATIC_TIGHT_TOKENS}", "static", statics[0][1], STATIC_TIGHT_TOKENS))
    runs += [(name, name, base, hold_ctx.max_len) for name in spec.baselines]
    contexts = [hold_ctx if length == hold_ctx.max_len else dataclasses.replace(hold_ctx, max_len=length)
                for *_, length in runs]
    done = run_jobs([(c, table, policy, True) for c, (_, policy, table, _) in zip(contexts, runs)], spec.workers,
                    "plan: validate on the later part", progress, executor=spec.executor)
    validation = {"odma": {"policy": "odma", "max_model_len": hold_ctx.max_len, "metrics": held["metrics"],
                           "series": held["series"], "config": held["config"], "queue": held["queue"]}}
    validation.update({name: result for (name, *_), result in zip(runs, done)})
    jobs = [(name, c, policy, table) for c, (name, policy, table, _) in zip(contexts, runs)
            if validation[name]["queue"]["overloaded"]]
    found = run_jobs([(c, policy, table, validation[name]["metrics"]) for name, c, policy, table in jobs], spec.workers,
                     "plan: rates the overloaded sustain", progress, fn=sustainable_scale, executor=spec.executor)
    for (name, *_), scale in zip(jobs, found):
        validation[name]["queue"]["sustainable"] = scale
    if target is not None:
        every = [(hold_ctx, "odma", tables["allocator"])] + [(c, policy, table)
                                                              for c, (_, policy, table, _) in zip(contexts, runs)]
        scales = run_jobs([(c, policy, table, target) for c, policy, table in every], spec.workers,
                          "plan: capacity on the later part", progress, fn=capacity_scale, executor=spec.executor)
        if scales[0][1]:  # the pick's rate on the held-out part cannot be judged: neither can the plan
            raise ConfigError(f"--objective capacity validates the pick's sustainable rate on the held-out part (the "
                              f"last {hold_ctx.workload.size:,} requests), and gets none: {scales[0][1]}",
                              hint=f"a larger --holdout: capacity needs at least {MIN_COMPLETED} completed requests")
        for name, (scale, _) in zip(validation, scales):
            validation[name]["metrics"] = {**validation[name]["metrics"], "capacity_rate_scale": scale}
    return validation


def _gate(odma: dict, spec: PlanSpec) -> dict:
    """The recommendation's held-out replay against the [thresholds] plan writes, judged by
    gate.thresholds.evaluate, the evaluation `check` runs. Its utilization floor is a share of this
    very replay's, so within plan only the overflow and rejection limits can fail; `check` on
    later traffic holds the config to all three."""
    limits = thresholds(spec, odma["metrics"]["kv_utilization"])
    verdicts = evaluate({"results": {"odma": odma}}, "odma", limits)
    return {"passed": all(v.passed for v in verdicts), "thresholds": dataclasses.asdict(limits),
            "verdicts": [dataclasses.asdict(v) | {"text": v.text} for v in verdicts]}


REGRESSION_SHARE = 0.10  # a latency p99 this much above static's is flagged as a regression
# policies within this share of the best value tie with it: TPS and utilization move by a fraction of
# a percent with the end of a finite trace; a rate at the SLO is bracketed to the bisection's 2%
TIE_SHARE = {"tps": 0.005, "utilization": 0.005, "capacity": CapacityTarget(Slo(()), 0.0).tolerance}


def verdict(validation: dict, objective: str) -> dict:
    """What wins on the held-out part: the best policy by the objective's metric (the recommendation
    among them, first when it ties) of those that serve at least the requests it serves (no more
    rejected or truncated), those within TIE_SHARE of it,
    how the recommendation compares with each, and its latency regressions against static (p99
    TTFT or TPOT more than REGRESSION_SHARE above static's)."""
    key = OBJECTIVE_METRIC[objective]
    values = {name: v["metrics"][key] for name, v in validation.items()}
    unserved = {name: v["metrics"]["rejections"] + v["metrics"]["truncated"] for name, v in validation.items()}
    # a policy that rejects or truncates more requests than the recommendation serves other work: no contest
    comparable = [name for name in values if unserved[name] <= unserved["odma"]]
    top = max(values[name] for name in comparable)
    leaders = [name for name in comparable if values[name] >= top * (1.0 - TIE_SHARE[objective])]
    best = "odma" if "odma" in leaders else max(leaders, key=lambda name: values[name])
    tied = [name for name in leaders if name != best]
    odma = values["odma"]
    compared = {name: {"value": value, "odma_change": odma / value - 1.0 if value > 0 else None,
                       "comparable": name in comparable, "unserved": unserved[name]}
                for name, value in values.items() if name != "odma"}
    static = validation["static"]["metrics"]
    mine = validation["odma"]["metrics"]
    regressions = [{"metric": m, "odma": mine[m], "static": static[m]} for m in ("ttft_p99", "tpot_p99")
                   if None not in (mine[m], static[m]) and mine[m] > static[m] * (1.0 + REGRESSION_SHARE)]
    return {"metric": key, "best": best, "tied_with": tied, "odma_is_best": best == "odma", "odma_value": odma,
            "best_value": values[best],
            "against": compared, "regressions_vs_static": regressions}


def _histogram(w: Workload, max_len: int, bins: int = 80) -> dict:
    counts, edges = np.histogram(w.kv_tokens(max_len), bins=bins, range=(0, max_len))
    return {"edges_tokens": edges.tolist(), "counts": counts.tolist()}


SCHEDULERS_COMPARED = ("task_pool", "fcfs")  # the papers' Task Pool, and vLLM's scheduler unchanged (seeds/000)
# [allocator] large_spill: spill to the main pool, or wait for a large block (the papers' reading);
# in this order, so that a tie goes to the spill (`_tune`)
SPILL_COMPARED = (True, False)
# each option is also replayed with the large pool at this share of the planned one (in whole
# largest blocks, at least one), as if twice the large-tag demand the search part showed came; the
# pick is the option with the best worse objective of the two (`_tune`)
LARGE_STRESS = 0.5
# `_tune`'s objective values this close to the best tie (a share of it): where the engine keeps up,
# every option serves the same tokens, and their TPS differ in the last completion's time only
# (by 5e-7 of it on the 24 h ServeGen A100 plan, docs/plan.md), not in what they serve
OBJECTIVE_TIE = 0.001
LARGE_HEADROOM_BLOCKS = 1  # the large pool plan writes holds at least this many largest blocks
TUNING_KEYS = ("tps", "kv_utilization", "ttft_p99", "overflow_rate", "stalls")  # what `_tune` keeps of a replay


def table_without_fraction(table: dict) -> dict:
    """An [allocator] table whose large pool is set in bytes after this (large_pool_fraction dropped)."""
    return {k: v for k, v in table.items() if k != "large_pool_fraction"}


def _tune(ctx: ReplayContext, table: dict, spec: PlanSpec, progress, large_share: float) -> dict:
    """The chosen candidate's large pool and scheduler, from replays on the search part (its
    hedge-table part, for a hedge candidate).

    The large pool holds the large blocks the traffic keeps at once. A replay with a large pool of
    half the pool (the most plan allows, so that it does not cap what it measures) shows them:
    where that pool kept room for one more largest block (prompt + the cap, or max_model_len) at
    its peak (`peak_large_bytes`), the pool is that peak plus LARGE_HEADROOM_BLOCKS of them. Where
    it filled, large blocks are backlogged and would fill any pool, so it is `large_share` of the
    KV pool instead: the share of the block-token-time that large blocks hold by the cheap bounds,
    where both pools sustain the same rate (Little's law), at least one largest block. Either way
    at most half the pool, in whole tokens.

    The scheduler and `large_spill` (what a large-tag request does when the large pool is full at
    its admission): each of SCHEDULERS_COMPARED, with each of SPILL_COMPARED, replayed with that
    pool and again with a pool of LARGE_STRESS of it in whole largest blocks (at least one; not
    replayed again where that is the planned pool, a pool of one block). An option's score is the
    worse of its two replays: its objective (TTFT p99 for the capacity objective) and its TTFT p99.
    The best worse objective wins, a tie (within OBJECTIVE_TIE) to the lower worse TTFT p99, then
    to the earlier in that order (the task pool, with spill).

    Why the worse of two pools: the pool is sized from the search part, and traffic that brings
    more large-tag requests than it showed (a refit that lowers the top boundary, longer prompts)
    fills it. Waiting for a large block then starts them one at a time while the main pool has
    room, and spilling does not: on alpaca_eval (examples/paper_table.py's plan) waiting and
    spilling serve 1,006 and 1,002 tok/s on the search part with the planned pool, 338 and 1,012
    with one of its two largest blocks, and 328 and 984 on the requests replayed after it. Why a
    tie goes to the spill: where the replays are alike (the engine overloaded, its main pool full as well, as plan
    replays at the trace's own rate) they show nothing between the two, and at lower rates the
    main pool has room that spilling uses (Azure conv 2023 on one MLU370-X4, docs/policies.md:
    0.257 req/s within the SLO spilling, 0.115 waiting)."""
    bpt = ctx.serving.bytes_per_token
    pool_bytes = ctx.serving.pool_bytes
    prompt = ctx.workload.prompt_tokens
    largest = large_slot_tokens(int(prompt.max()) if prompt.size else ctx.max_len, ctx.scheduler.max_new_tokens,
                                ctx.max_len) * bpt
    base = table_without_fraction(table)  # every replay here sets the large pool in bytes
    roomy = {**base, "large_pool_bytes": pool_bytes // 2 // bpt * bpt}
    measured = replay_policy(ctx, "odma", roomy)[0]
    peak = measured.allocator["policy_counters"]["peak_large_bytes"]
    backlog = peak + largest > roomy["large_pool_bytes"]  # large blocks waited for room even there
    wanted = int(pool_bytes * large_share) if backlog else peak + LARGE_HEADROOM_BLOCKS * largest
    size = min(max(wanted, LARGE_HEADROOM_BLOCKS * largest), pool_bytes // 2) // bpt * bpt
    # the smaller pool: LARGE_STRESS of the planned one in whole largest blocks (what a pool of
    # uncapped blocks holds), at least one; none where that is the planned pool (one block)
    stressed_size = max(largest, int(size * LARGE_STRESS) // largest * largest)
    pools = (size,) if stressed_size >= size else (size, stressed_size)
    options = [(name, spill) for name in SCHEDULERS_COMPARED for spill in SPILL_COMPARED]
    runs: list[list[dict]] = []  # per option, per pool: metrics with the allocator's counters
    for k, (name, spill) in enumerate(options):
        run_ctx = dataclasses.replace(ctx, scheduler=dataclasses.replace(ctx.scheduler, policy=name))
        runs.append([])
        for n, pool in enumerate(pools):
            result = replay_policy(run_ctx, "odma", {**base, "large_pool_bytes": pool, "large_spill": spill})[0]
            counters = result.allocator["policy_counters"]
            runs[k].append({**{key: result.metrics[key] for key in TUNING_KEYS},
                            "peak_large_bytes": counters["peak_large_bytes"], "large_spills": counters["large_spills"]})
            if progress is not None:
                progress("plan: large pool, scheduler and spill", k * len(pools) + n + 1, len(options) * len(pools))

    def ttft(k: int) -> float:  # the worse TTFT p99 of the option's replays
        return max(math.inf if r["ttft_p99"] is None else r["ttft_p99"] for r in runs[k])

    near = range(len(options))
    if spec.objective != "capacity":  # the options within OBJECTIVE_TIE of the best worse objective
        key = OBJECTIVE_METRIC[spec.objective]
        score = [min(r[key] for r in runs[k]) for k in near]
        near = [k for k in near if score[k] >= max(score) * (1.0 - OBJECTIVE_TIE)]
    best = min(near, key=lambda k: (ttft(k), k))
    return {"large_pool_bytes": size, "sized_by": "large_share" if backlog else "peak",
            "large_share": large_share, "peak_large_bytes": peak, "largest_large_block_tokens": largest // bpt,
            "stressed_large_pool_bytes": pools[1] if len(pools) > 1 else None, "large_stress": LARGE_STRESS,
            "scheduler": options[best][0], "large_spill": options[best][1], "objective_tie": OBJECTIVE_TIE,
            "objective_metric": None if spec.objective == "capacity" else OBJECTIVE_METRIC[spec.objective],
            "options": [{"scheduler": name, "large_spill": spill, "chosen": k == best, **runs[k][0],
                         "stressed": runs[k][1] if len(pools) > 1 else None} for k, (name, spill) in enumerate(options)]}


def _final_boundaries(w: Workload, c: Candidate, max_len: int, max_new_tokens: int | None = None) -> list[int]:
    """The boundaries the refit would hold at the end of the search part (the start for serving)."""
    kv = w.kv_tokens(max_len, max_new_tokens)
    return list(quantile_boundaries(kv[-c.refit_window:], c.num_buckets, max_tokens=max_len, levels=c.quantile_levels()))


def _estimate_row(e: dict) -> dict:
    """One candidate's settings (its label's, as numbers: the quantile levels follow from
    num_buckets and levels) and its cheap estimate."""
    c: Candidate = e["candidate"]
    settings = {f.name: getattr(c, f.name) for f in dataclasses.fields(Candidate)}
    settings["tau"] = tau_setting(c.tau)
    return {"label": c.label, "settings": settings,
            "estimate": {k: e[k] for k in ("overflow_rate", "kv_utilization", "capacity_index", "routed_large")}}
