"""The config TOML `plan` writes and `replay --config`, `check` and `capacity --config` read: its
tables, how it names the predictor it was planned with, and how a run differs from what it was
planned for (`mismatches`).

Tables: [allocator], [scheduler] and [thresholds] are settings the commands apply; [plan] records
what the config was planned for (device, model, kv_dtype, tp, the KV pool, the predictor, the trace,
the expected metrics); [engine.*] restates the settings in serving engines' terms (plan/engine.py)
and is not read back. A config from before [plan] keeps that record in [meta], read the same way.
Every table is checked when the config is read (`config_tables`), whichever command reads it, by
the one class that holds its rules: AllocatorConfig, SchedulerSettings and `Thresholds` (check's
gate, gate/thresholds.py, kept here below it)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from odmactl.allocator import AllocatorConfig
from odmactl.allocator.registry import unknown_policy
from odmactl.core.errors import ConfigError, OdmaError
from odmactl.core.limits import MAX_TOKENS
from odmactl.core.tomltable import TomlTable, load_toml
from odmactl.hw.profiles import kv_dtype_problem
from odmactl.predict.source import PREDICTOR_CHOICES
from odmactl.run.serving import Serving
from odmactl.sim.metrics import LATENCY_LIMIT_SECONDS, LATENCY_METRICS, latency_limit_ok
from odmactl.sim.settings import SchedulerSettings

CONFIG_TABLES = ("allocator", "scheduler", "thresholds")
RECORD_TABLES = ("plan", "engine")  # what plan records and restates; "meta" is [plan]'s older name
# [plan] keys checked where a config is read, and the type each must have; `mismatches` compares the
# deployment's (device, model, kv_dtype, tp, the pool), the predictor names the predictor to use
PLAN_RECORD = {"device": str, "model": str, "kv_dtype": str, "tp": int, "kv_pool_bytes": int, "kv_pool_tokens": int,
               "predictor": str}
RUN_ONLY = ("fast_forward", "series_points")  # SchedulerSettings a command sets, never a config file
# check's latency bounds: a key per latency metric, max_<metric>_s (seconds), the metric it bounds
LATENCY_THRESHOLDS = {f"max_{metric}_s": metric for metric in LATENCY_METRICS}
THRESHOLD_KEYS = ("min_utilization", "max_migration_rate", "max_overflow_rate", "max_rejection_rate", "min_tps_gain",
                  "baseline", *LATENCY_THRESHOLDS)


@dataclass(frozen=True)
class Thresholds:
    """check's gate (gate/thresholds.py): bounds a replay must meet; None leaves that bound
    unchecked. Invariant: rates and utilization in [0, 1], min_tps_gain > -1, latency limits (the
    `LATENCY_THRESHOLDS`, in seconds: `check --slo` sets them as capacity's --slo is written)
    `latency_limit_ok`, baseline a registered policy. Here, below gate/, so that every command
    reading a config checks its [thresholds] with these rules (`config_tables`)."""

    min_utilization: float | None = None
    max_migration_rate: float | None = None
    max_overflow_rate: float | None = None
    max_rejection_rate: float | None = None
    min_tps_gain: float | None = None
    baseline: str = "static"
    max_ttft_p50_s: float | None = None
    max_ttft_p99_s: float | None = None
    max_tpot_p50_s: float | None = None
    max_tpot_p99_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_utilization", "max_migration_rate", "max_overflow_rate", "max_rejection_rate"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ConfigError(f"{name} must be between 0 and 1, got {value}", key=name)
        if self.min_tps_gain is not None and not (math.isfinite(self.min_tps_gain) and self.min_tps_gain > -1.0):
            raise ConfigError(f"min_tps_gain must be > -1 (a fraction: 0.2 is +20%), got {self.min_tps_gain}",
                              key="min_tps_gain")
        for name in LATENCY_THRESHOLDS:
            value = getattr(self, name)
            if value is not None and not latency_limit_ok(value):
                raise ConfigError(f"expected {LATENCY_LIMIT_SECONDS}, got {value}", key=name)
        problem = unknown_policy(self.baseline)
        if problem is not None:
            raise ConfigError(problem, key="baseline")

    @property
    def empty(self) -> bool:
        return all(getattr(self, k) is None for k in THRESHOLD_KEYS if k != "baseline")

    @classmethod
    def from_table(cls, table: dict, source: Path | None) -> Thresholds:
        """A config's [thresholds] table, checked: errors name `source` and the key."""
        return TomlTable(dict(table), source, "thresholds").to_dataclass(cls)

    @classmethod
    def merged(cls, table: dict, flags: dict, source: Path | None) -> Thresholds:
        """The config table's thresholds (`from_table`), then the flags' values where given."""
        from_file = cls.from_table(table, source)
        try:
            return dataclasses.replace(from_file, **{k: v for k, v in flags.items() if v is not None})
        except ConfigError as exc:  # a flag's value: name the flag, not a key
            raise ConfigError(f"--{exc.key.replace('_', '-')}: {exc.message}" if exc.key else exc.message) from None


def predictor_for_config(predictor: str, config_path: Path) -> str:
    """How a config at `config_path` names a predictor: `oracle` and `none` as they are, an artifact
    folder relative to the config's folder, so that the two can move together (a repository, a CI
    job) and `predictor_from_config` finds it from anywhere."""
    if predictor in PREDICTOR_CHOICES:
        return predictor
    return os.path.relpath(Path(predictor).resolve(), config_path.resolve().parent)


def predictor_from_config(named: str, config_path: Path) -> str:
    """The predictor a config's [plan] names (`predictor_for_config`), resolved against its folder."""
    if named in PREDICTOR_CHOICES or Path(named).is_absolute():
        return named
    return str(config_path.parent / named)


def scheduler_settings(table: dict, source: Path | None = None, **overrides) -> SchedulerSettings:
    """SchedulerSettings from a config's [scheduler] table (the keys a file may set:
    engine, prefix_caching, policy, aging_s, max_num_seqs, max_num_batched_tokens, max_new_tokens), then `overrides`
    (a flag's value, fast_forward)."""
    from_file = TomlTable(dict(table), source, "scheduler").to_dataclass(SchedulerSettings, skip=RUN_ONLY)
    return dataclasses.replace(from_file, **overrides)


def scheduler_table(settings: SchedulerSettings, max_len: int, kv_policy: str | None = None) -> dict[str, object]:
    """The [scheduler] table a config records for these settings at this max_model_len: the
    engine version, the scheduler by name (the one `kv_policy` runs when the settings name none; left out when
    neither names one), the task pool's aging bound and the caps."""
    from odmactl.allocator import ALLOCATORS

    policy = settings.policy_for(ALLOCATORS[kv_policy]) if kv_policy else settings.policy
    out = {"engine": settings.engine, "prefix_caching": settings.caches_prefixes,
           **({"policy": policy} if policy else {}), "aging_s": settings.aging_s,
           "max_num_seqs": settings.max_num_seqs, "max_num_batched_tokens": settings.batched_tokens(max_len)}
    if settings.max_new_tokens is not None:
        out["max_new_tokens"] = settings.max_new_tokens
    return out


def scheduler_record(settings: SchedulerSettings, max_len: int) -> dict[str, object]:
    """The "scheduler" section of a command's JSON: the table, with the policy and max_new_tokens
    null when unset (each result names the scheduler it ran)."""
    return {"policy": settings.policy, **scheduler_table(settings, max_len), "max_new_tokens": settings.max_new_tokens}


def read_config(path: Path | None) -> dict[str, dict]:
    """The tables of a config TOML (plan's output), checked (`config_tables`); all empty without one."""
    if path is None:
        return {name: {} for name in CONFIG_TABLES + ("plan",)}
    return config_tables(load_toml(path), path)


def config_tables(data: dict, source: Path | None) -> dict[str, dict]:
    """A parsed config's tables: "allocator", "scheduler" and "thresholds" (read by gate/), each {}
    when absent, and "plan" (plan's record, from [plan] or an older config's [meta]); unknown tables
    refused, and bad allocator, scheduler and threshold settings and record keys, naming `source`
    and the key, whichever command reads the config."""
    top = TomlTable(data, source)
    known = CONFIG_TABLES + RECORD_TABLES + ("meta",)
    for key in top.data:
        if key not in known:
            if not isinstance(top.data[key], dict):
                raise top.error(key, f"a setting outside any table; settings go in a table ({', '.join(known)}), "
                                     f"e.g. [allocator] {key} = ...")
            raise top.error(key, f"unknown table '{key}' (known: {', '.join(known)})")
    tables: dict[str, dict] = {}
    for name in CONFIG_TABLES + RECORD_TABLES:
        table = top.table(name, required=False)
        tables[name] = dict(table.data) if table is not None else {}
    if "plan" in top.data and "meta" in top.data:
        raise top.error("meta", "a config has [plan] or, written by an older plan, [meta]: not both")
    record = "meta" if "meta" in top.data else "plan"
    meta = top.table("meta", required=False)
    if record == "meta":
        tables["plan"] = dict(meta.data)
    for key, kind in PLAN_RECORD.items():
        value = tables["plan"].get(key)
        if value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(f"expected {'a string' if kind is str else 'a whole number'}, got {value!r}",
                              file=source, key=f"{record}.{key}")
        if (kind is int and value < 1) or (kind is str and not value.strip()):
            raise ConfigError(f"expected {'a name' if kind is str else 'a whole number >= 1'}, got {value!r}",
                              file=source, key=f"{record}.{key}")
        problem = kv_dtype_problem(value) if key == "kv_dtype" else None
        if problem is not None:
            raise ConfigError(problem, file=source, key=f"{record}.{key}")
    del tables["engine"]
    # bad keys now; what depends on max_model_len against the config's, else when a run knows its own
    # (run/replay.settings_of names this file then too)
    AllocatorConfig.from_mapping({"max_model_len_tokens": MAX_TOKENS, **tables["allocator"]}, source=source,
                                 prefix="allocator")
    scheduler_settings(tables["scheduler"], source)
    Thresholds.from_table(tables["thresholds"], source)
    return tables


def config_setting_error(exc: OdmaError, config: Path | None, name: str, from_file: Mapping[str, object],
                         ran: Mapping[str, object]) -> OdmaError:
    """`exc`, an error about one setting that names its key alone (what a policy checks as it
    completes its config against the deployment), as the config's own when the config set that key
    of its table `name` (`from_file`) to the value that ran (`ran`): naming the file and the full key,
    `[name] key` as a config error always does. Else `exc` as it is: a flag's value or a default."""
    key = exc.key
    if config is None or exc.file is not None or key is None or key not in from_file or \
            key not in ran or from_file[key] != ran[key]:
        return exc
    return type(exc)(exc.message, file=config, key=f"{name}.{key}", hint=exc.hint)


def mismatches(record: dict, setup: Serving, kv_dtype: str) -> list[str]:
    """How a run's deployment differs from the one a config's [plan] record (`record`) was planned
    for: device, model (names in any case), KV precision, tensor parallelism and KV pool (in tokens,
    or bytes in a record without them), one line each (a key the record lacks, as in an older
    config, is not compared)."""
    ran = {"device": setup.device.name, "model": setup.full_model.name, "kv_dtype": kv_dtype, "tp": setup.tp}
    if "kv_pool_tokens" in record:
        ran["kv_pool_tokens"] = setup.pool_tokens
    else:
        ran["kv_pool_bytes"] = setup.pool_bytes
    out = []
    for key, value in ran.items():
        planned = record.get(key)
        if isinstance(planned, str) and isinstance(value, str) and planned.casefold() == value.casefold():
            continue
        if planned is not None and planned != value:
            out.append(f"{key}: planned for {planned:,}, run with {value:,}" if isinstance(value, int)
                       else f"{key}: planned for {planned}, run with {value}")
    return out
