"""One path from a spec, a trace and a policy to a result: `replay_policy` runs one policy on a
prepared part of a trace (`ReplayContext`), and `run_policies` prepares the context from a
ReplaySpec and replays each policy into the JSON-ready document `replay` and `check` print. plan
replays its candidates and baselines through `replay_policy` too, so every replay is built the
same way: the [allocator] table, max_model_len, then what the policy fills in itself
(`complete_config`), then the allocator, then the loop.

An on-device replay (device/replay.py) passes `DeviceHooks`: the arena the allocator places blocks
in, a probe that runs each iteration, and the section its measurements add."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import polars as pl

from odmactl.allocator import ALLOCATORS, AllocatorConfig, make_allocator
from odmactl.allocator.config import Deployment
from odmactl.core.errors import ConfigError
from odmactl.rules.engines import ENGINES, seqs_problem
from odmactl.run.config import (
    config_setting_error,
    mismatches,
    predictor_from_config,
    read_config,
    scheduler_record,
    scheduler_settings,
)
from odmactl.run.serving import Serving, default_max_model_len, serving
from odmactl.run.spec import LoadOptions, ReplaySpec, ServingSpec, papers_static
from odmactl.run.workload import build_workload
from odmactl.sim.cluster import Cluster
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.metrics import ReplayResult, latency_histograms
from odmactl.sim.workload import CLOCK_LIMIT_PS, PS, Workload


@dataclass(frozen=True)
class ReplayContext:
    """One part of a trace ready to replay: what every policy replayed on it shares (picklable: plan
    sends it to worker processes)."""

    serving: Serving
    workload: Workload
    max_len: int
    scheduler: SchedulerSettings
    mismatches: tuple[str, ...] = ()  # how the deployment differs from the config's [plan] (allowed)
    config: Path | None = None  # the config file whose tables apply, and its [allocator] table: what a
    config_allocator: Mapping[str, object] = field(default_factory=dict)  # setting's error names (`settings_of`)


class DeviceHooks(Protocol):
    """What an on-device replay adds to `replay_policy` (device/replay.py implements it)."""

    description: str  # how time advanced, for the document

    def arena(self, ctx: ReplayContext, arena_bytes: int): ...

    def probe(self, allocator, ctx: ReplayContext): ...

    def section(self, probe, ctx: ReplayContext) -> dict: ...

    def release(self) -> None: ...


def deployment_of(cost, **facts) -> Deployment:
    """The deployment facts a cost model gives (its activation demand per token and per sequence
    producing logits), with `facts` besides."""
    return Deployment(activation_bytes_per_token=cost.activation_bytes(1, 0),
                      activation_bytes_per_sequence=cost.activation_bytes(0, 1), **facts)


def deployment(ctx: ReplayContext) -> Deployment:
    """What a policy may need of the deployment (allocator/config.Deployment): the activation
    memory a static engine reserves, modelled at vLLM's profiling shape (the token budget over as
    many sequences as max_num_seqs allows) and at most the profile's activation reserve, and a
    rank-1 LoRA adapter's bytes (each device's shard of it, or the scaled model's on a device, times
    tp), and the output cap (max_new_tokens)."""
    s = ctx.serving
    budget = ctx.scheduler.batched_tokens(ctx.max_len)
    peak = s.cost.activation_bytes(budget, min(ctx.scheduler.max_num_seqs, budget))
    reserve = int(s.device.activation_reserve_bytes * s.tp)
    return deployment_of(s.cost, activation_peak_bytes=int(min(peak, reserve)), activation_reserve_bytes=reserve,
                         lora_bytes_per_rank=s.model.lora_bytes_per_rank * s.tp,
                         adapters=ctx.workload.adapters is not None,
                         max_new_tokens=ctx.scheduler.max_new_tokens or 0)


def policy_config(policy: str, table: dict, ctx: ReplayContext,
                  facts: Deployment | None = None) -> tuple[AllocatorConfig, dict]:
    """The policy's config for this context and notes on what the policy filled in (`facts`: the
    context's deployment, when the caller has it)."""
    s = ctx.serving
    with settings_of(ctx, table):
        config = AllocatorConfig.from_mapping({**table, "max_model_len_tokens": ctx.max_len})
        return ALLOCATORS[policy].complete_config(config, pool_bytes=s.pool_bytes, bytes_per_token=s.bytes_per_token,
                                                  realized_kv_tokens=ctx.workload.kv_tokens(
                                                      ctx.max_len, ctx.scheduler.max_new_tokens),
                                                  deployment=facts or deployment(ctx))


@contextlib.contextmanager
def settings_of(ctx: ReplayContext, table: dict):
    """A policy's check of the [allocator] settings `table` (as it completes its config, or builds
    its allocator) that names a key the context's config set to the value replayed, as the config's
    error: its file and the full key (run/config.config_setting_error)."""
    try:
        yield
    except ConfigError as exc:
        raise config_setting_error(exc, ctx.config, "allocator", ctx.config_allocator,
                                   {**table, "max_model_len_tokens": ctx.max_len}) from None


@contextlib.contextmanager
def clock_limit(ctx: ReplayContext, policy: str):
    """A replay whose 64-bit clock (or a count) ran out, its backlog past 106 days, as a ConfigError."""
    s = ctx.serving
    try:
        yield
    except OverflowError:
        raise ConfigError(f"{policy}: the replay's simulated clock passed its limit of {CLOCK_LIMIT_PS / PS / 86400:.0f} "
                          f"days (2**63 ps): {s.model.name} on {s.device.name} serves these requests far slower than "
                          "they arrive", hint="replay fewer requests (--limit), slow the arrivals (--rate), or choose "
                          "a larger device") from None


def replayed_together(ctx: ReplayContext, policy: str, table: dict, replicas: int, router: str) -> list[ReplayResult]:
    """`replicas` engines of `policy` serving the context's requests on one clock behind `router`
    (sim/cluster.py): one result per engine, over its own requests."""
    facts = deployment(ctx)
    config, _ = policy_config(policy, table, ctx, facts)
    s = ctx.serving

    def engine() -> Replay:
        allocator = make_allocator(policy, s.pool_bytes, s.bytes_per_token, config, deployment=facts)
        return Replay(ctx.workload, allocator, s.cost, ctx.max_len, ctx.scheduler)

    with clock_limit(ctx, policy):
        return Cluster(engine, replicas, router, ctx.workload).run()


def replay_policy(ctx: ReplayContext, policy: str, table: dict, progress=None,
                  device: DeviceHooks | None = None) -> tuple[ReplayResult, AllocatorConfig, dict, dict | None]:
    """Replay `policy` with the [allocator] settings `table` on the context: (the result, the config
    it ran with, notes, the on-device section or None)."""
    facts = deployment(ctx)
    config, notes = policy_config(policy, table, ctx, facts)
    s = ctx.serving
    arena = "virtual" if device is None else device.arena(ctx, ALLOCATORS[policy].arena_bytes(s.pool_bytes, config))
    with settings_of(ctx, table):
        allocator = make_allocator(policy, s.pool_bytes, s.bytes_per_token, config, arena=arena, deployment=facts)
    tier = allocator.host_tier() if allocator.block_size_tokens is not None else None
    moves = "offloads KV to a host buffer" if tier is not None else \
        "loads LoRA adapters from host memory" if ctx.workload.adapters is not None and allocator.adapter_cache() else None
    if moves and s.device.host_link is None:
        raise ConfigError(f"{policy} {moves}, and {s.device.name}'s profile has no [host_link] to charge the transfers at",
                          file=s.device.path, hint="add [host_link] (kind, bandwidth) to the profile"
                          + (", or set ellm_host_buffer_bytes = 0" if tier is not None else ""))
    probe = None if device is None else device.probe(allocator, ctx)
    with clock_limit(ctx, policy):
        result = Replay(ctx.workload, allocator, s.cost, ctx.max_len, ctx.scheduler, progress=progress,
                        probe=probe).run()
    section = None
    if device is not None:
        section = device.section(probe, ctx)
        del probe, allocator, arena  # free the arena before the next policy takes its own
        device.release()
    return result, config, notes, section


def prepare(frame: pl.DataFrame, spec: ServingSpec, setup: Serving, *, load: LoadOptions = LoadOptions(),
            tables: dict[str, dict] | None = None, config: Path | None = None, fast_forward: bool = True,
            policies: tuple[str, ...] = ()) -> tuple[ReplayContext, str]:
    """The context a command replays `policies` on, and the predictor's label: the load shaped, the
    predictor named by the spec, else by the config's [plan] (what plan chose with); a policy that
    sizes blocks from predictions (`uses_predictions`) is refused when neither names one, unless
    the spec says `none`. max_model_len from the spec, the config (`tables`, read from `config`),
    or the trace's longest request; the scheduler from the config's [scheduler] and the spec. A
    config planned for another deployment (run/config.mismatches) is refused unless the spec allows
    it; the context keeps what differs."""
    if tables is None:
        tables = read_config(config)
    predictor = spec.predictor
    found = mismatches(tables["plan"], setup, spec.kv_dtype)
    if found and not spec.allow_mismatch:
        raise ConfigError(f"{config or 'the config'} was planned for another deployment: " + "; ".join(found),
                          file=None, hint="run with the deployment it was planned for (--device, --model, --kv-dtype, "
                          "--tp and --kv-pool as its [plan] table records them), re-plan for this one (`odmactl plan`), "
                          "or pass --allow-mismatch to apply its settings anyway")
    if predictor is None and "predictor" in tables["plan"]:
        named = tables["plan"]["predictor"]
        predictor = predictor_from_config(named, config) if config is not None else named
    if predictor is None:
        needing = [p for p in policies if ALLOCATORS[p].uses_predictions]
        if needing:
            which = f"policy {needing[0]} sizes" if len(needing) == 1 else f"policies {', '.join(needing)} size"
            raise ConfigError(f"{which} each request's memory from a predicted length, and no predictor was given",
                              hint="pass --predictor P/ (an `odmactl fit` artifact), --predictor oracle (the true "
                                   "lengths), or --predictor none to replay without predictions")
        predictor = "none"
    workload, _, label = build_workload(frame, load, predictor)
    given = spec.max_model_len or tables["allocator"].get("max_model_len_tokens")
    positions = setup.full_model.max_position_embeddings
    set_by = _set_by("--max-model-len", spec.max_model_len, config, "allocator", tables["allocator"],
                     "max_model_len_tokens")
    if given and positions and given > positions:
        raise set_by.error(f"{given:,} is past {setup.full_model.name}'s {positions:,} positions, which vLLM refuses "
                           "too", hint=f"a max_model_len up to {positions:,}")
    if given and given > setup.pool_tokens:
        raise set_by.error(f"{given:,} is more than the KV pool holds ({setup.pool_tokens:,} tokens), which vLLM "
                           "refuses at start-up too", hint=f"a max_model_len up to {setup.pool_tokens:,}, or a larger "
                           "--kv-pool, --tp or device")
    max_len = given or default_max_model_len(workload, setup.model, setup.pool_tokens)
    scheduler = engine_scheduler(spec, setup, tables, config, max_len, fast_forward)
    return ReplayContext(setup, workload, max_len, scheduler, tuple(found), config, dict(tables["allocator"])), label


@dataclass(frozen=True)
class _SetBy:
    """Who set a setting whose value is refused: a flag (`flag`, as the message names it), a
    config's key (`file` and the full `key`; `file` None for a table that came from code) or, with
    neither, `default`."""

    flag: str | None = None
    file: Path | None = None
    key: str | None = None
    default: str | None = None

    @property
    def given(self) -> bool:
        """Whether a flag or a config set it (not a default)."""
        return self.flag is not None or self.key is not None

    def error(self, message: str, hint: str | None = None) -> ConfigError:
        """The refusal, naming the flag and its value's problem, the config's file and key, or the default."""
        if self.flag is not None:
            return ConfigError(f"{self.flag}: {message}", hint=hint)
        if self.key is not None:
            return ConfigError(message, file=self.file, key=self.key, hint=hint)
        return ConfigError(f"{message} ({self.default})" if self.default else message, hint=hint)


def _set_by(flag: str, flag_value, config: Path | None, name: str, table: dict, key: str,
            default: str | None = None) -> _SetBy:
    """Who set `key` of the config's table `name` (`table`): the flag when `flag_value` is given,
    else the config when the table has the key, else the default (`default` says which)."""
    if flag_value is not None:
        return _SetBy(flag=flag)
    if key in table:
        return _SetBy(file=config, key=f"{name}.{key}")
    return _SetBy(default=default)


def engine_scheduler(spec: ServingSpec, setup: Serving, tables: dict[str, dict], config: Path | None, max_len: int,
                     fast_forward: bool = True) -> SchedulerSettings:
    """The scheduler settings a command replays: the engine (--engine, else the config's [scheduler]
    engine, else the device profile's), the batch caps from the flags, else the config, else that
    engine's defaults on the device (rules/engines.py), checked as the engine checks them: vLLM
    refuses max_num_seqs above max_num_batched_tokens, a block size its attention kernels do not
    take, and without chunked prefill a budget below max_model_len."""
    table = tables["scheduler"]
    name = spec.engine or table.get("engine") or setup.device.engine
    engine = ENGINES.get(name) if isinstance(name, str) else None  # else scheduler_settings names the bad key
    overrides = {"fast_forward": fast_forward}
    if engine is not None:
        overrides["engine"] = engine.name
        seqs, budget = engine.batch_defaults(setup.device.capacity_bytes, setup.device.name, max_len)
        if "max_num_seqs" not in table:
            overrides["max_num_seqs"] = seqs
        if engine.chunked and "max_num_batched_tokens" not in table:
            overrides["max_num_batched_tokens"] = budget
    if spec.max_num_seqs is not None:
        overrides["max_num_seqs"] = spec.max_num_seqs
    if spec.max_num_batched_tokens is not None:
        overrides["max_num_batched_tokens"] = spec.max_num_batched_tokens
    if spec.max_new_tokens is not None:
        overrides["max_new_tokens"] = spec.max_new_tokens
    if spec.prefix_caching is not None:
        overrides["prefix_caching"] = spec.prefix_caching
    scheduler = scheduler_settings(table, config, **overrides)  # an unknown engine is refused here, naming its key
    engine = ENGINES[scheduler.engine]
    budget = _set_by("--max-num-batched-tokens", spec.max_num_batched_tokens, config, "scheduler", table,
                     "max_num_batched_tokens", f"{engine.name}'s default max_num_batched_tokens")
    settable = "the flags or the config's [scheduler] table" if config is not None else "the flags"
    if not engine.chunked and scheduler.batched_tokens(max_len) < max_len:
        raise budget.error(f"max_num_batched_tokens ({scheduler.max_num_batched_tokens:,}) is smaller than "
                           f"max_model_len ({max_len:,}): a prompt of max_model_len could never be scheduled (vLLM "
                           "refuses it too without chunked prefill)", hint=f"raise max_num_batched_tokens ({settable}), "
                           "lower max_model_len, or --engine vllm-v1 (chunked prefill)")
    problem = seqs_problem(scheduler.max_num_seqs, scheduler.batched_tokens(max_len))
    if problem is not None:  # the budget when it was set, else the cap when that was
        seqs = _set_by("--max-num-seqs", spec.max_num_seqs, config, "scheduler", table, "max_num_seqs")
        raise (budget if budget.given or not seqs.given else seqs).error(
            problem, hint=f"lower max_num_seqs or raise max_num_batched_tokens ({settable})")
    block = spec.block_size_tokens or tables["allocator"].get("block_size_tokens")
    if isinstance(block, int) and not isinstance(block, bool) and engine.block_problem(block) is not None:
        set_by = _set_by(f"--block-size {block}", spec.block_size_tokens, config, "allocator", tables["allocator"],
                         "block_size_tokens")
        raise set_by.error(engine.block_problem(block),
                           hint="another --block-size, or --engine vllm-v0" if engine.chunked else None)
    return scheduler


def _arrivals_label(load: LoadOptions, workload: Workload) -> str:
    if load.offline:
        return "offline"
    if load.rate_per_s:
        return f"rescaled to {load.rate_per_s} req/s"
    if workload.size and not workload.arrival_ps.any():
        return "trace timestamps, all at t=0 (offline)"
    return "trace timestamps"


def run_policies(frame: pl.DataFrame, policies: list[str], spec: ReplaySpec, progress=None,
                 tables: dict[str, dict] | None = None, device: DeviceHooks | None = None,
                 setup: Serving | None = None, sustainable=None) -> dict:
    """Replay the trace once per policy; returns the JSON-ready document (settings, one result each).
    `tables` is `read_config(spec.config)` when the caller has read it already; `setup` the serving
    when the caller has built it (an on-device replay scales the model). A policy whose queue grew
    through the run (sim/metrics.queue_growth) gets `sustainable(ctx, policy, table, metrics)` in
    its "queue" section, when the caller passes that search (capacity/search.sustainable_scale;
    `metrics` the replay's own, its probe at the trace's rate)."""
    if tables is None:
        tables = read_config(spec.config)
    if setup is None:
        setup = serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes, tp=spec.tp)
    ctx, label = prepare(frame, spec, setup, load=spec.load, tables=tables, config=spec.config,
                         fast_forward=spec.fast_forward and device is None, policies=tuple(policies))
    results = {}
    table = {**tables["allocator"], **spec.allocator_overrides()}
    cap = ctx.scheduler.max_new_tokens  # --max-new-tokens, else the config's [scheduler] max_new_tokens
    if cap is not None and (spec.max_new_tokens is not None or "static_slot" not in table):
        # outputs capped at N: static reserves prompt + N (the flag's slot over a config's own)
        table.update(papers_static(cap))
    if "static" in policies and table.get("static_slot") == "prompt_plus_max_new" and \
            (cap is None or cap > table.get("max_new_tokens", 0)):
        raise ConfigError(f"static_slot = 'prompt_plus_max_new' reserves prompt + {table.get('max_new_tokens')} tokens, "
                          f"which holds only when outputs stop there, and they are capped at "
                          f"{'nothing' if cap is None else f'{cap:,}'}", file=spec.config, key="allocator.static_slot",
                          hint="cap them with --max-new-tokens N (or [scheduler] max_new_tokens = N), N at most the "
                               "slot's max_new_tokens")
    for policy in policies:
        tick = (lambda label_, done, total, p=policy: progress(f"replay {p}", done, total)) if progress else None
        result, config, notes, section = replay_policy(ctx, policy, table, tick, device)
        queue = dict(result.queue)
        if queue["overloaded"] and sustainable is not None and device is None:
            label_ = f"replay {policy}: overloaded, the rate it sustains"
            if progress:
                progress(label_, 0, 1)
            queue["sustainable"] = sustainable(ctx, policy, table, result.metrics)
            if progress:
                progress(label_, 1, 1)
        results[policy] = {"metrics": result.metrics, "config": config.to_mapping(),
                           "scheduler": ctx.scheduler.policy_for(ALLOCATORS[policy]), "notes": notes,
                           "allocator": result.allocator, "queue": queue, "series": result.series,
                           "latency_histograms": latency_histograms(result)}
        if section is not None:
            results[policy]["on_device"] = section
    workload, scheduler = ctx.workload, ctx.scheduler
    if device is not None:
        advance = device.description
    else:
        advance = "closed-form fast-forward" if scheduler.fast_forward else "token-by-token stepping"
    return {
        "trace": {"requests": workload.size, "arrivals": _arrivals_label(spec.load, workload),
                  "total_output_tokens": int(workload.output_tokens.sum()), "prefix_hashes": workload.prefix is not None},
        "device": setup.device.name, "tp": setup.tp, "model": setup.model_name, "kv_dtype": spec.kv_dtype,
        "kv_pool_bytes": setup.pool_bytes, "kv_bytes_per_token": setup.bytes_per_token, "max_model_len": ctx.max_len,
        "predictor": label, "scheduler": scheduler_record(scheduler, ctx.max_len),
        "time_advance": advance, "mismatches": list(ctx.mismatches),
        "results": results,
    }
