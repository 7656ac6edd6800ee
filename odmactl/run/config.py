"""The config TOML `plan` writes and `replay --config` and `check` read: its tables, and how it
names the predictor it was planned with."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from odmactl.allocator import AllocatorConfig
from odmactl.core.errors import ConfigError
from odmactl.core.tomltable import TomlTable, load_toml
from odmactl.predict.source import PREDICTOR_CHOICES
from odmactl.sim.loop import SchedulerSettings

CONFIG_TABLES = ("allocator", "scheduler", "thresholds")
RUN_ONLY = ("fast_forward", "series_points")  # SchedulerSettings a command sets, never a config file


def predictor_for_config(predictor: str, config_path: Path) -> str:
    """How a config at `config_path` names a predictor: `oracle` and `none` as they are, an artifact
    folder relative to the config's folder, so that the two can move together (a repository, a CI
    job) and `predictor_from_config` finds it from anywhere."""
    if predictor in PREDICTOR_CHOICES:
        return predictor
    return os.path.relpath(Path(predictor).resolve(), config_path.resolve().parent)


def predictor_from_config(named: str, config_path: Path) -> str:
    """The predictor a config's [meta] names (`predictor_for_config`), resolved against its folder."""
    if named in PREDICTOR_CHOICES or Path(named).is_absolute():
        return named
    return str(config_path.parent / named)


def scheduler_settings(table: dict, source: Path | None = None, **overrides) -> SchedulerSettings:
    """SchedulerSettings from a config's [scheduler] table (the keys a file may set:
    max_num_seqs, max_num_batched_tokens), then `overrides` (a flag's value, fast_forward)."""
    from_file = TomlTable(dict(table), source, "scheduler").to_dataclass(SchedulerSettings, skip=RUN_ONLY)
    return dataclasses.replace(from_file, **overrides)


def read_config(path: Path | None) -> dict[str, dict]:
    """The tables of a config TOML (plan's output), checked (`config_tables`); all empty without one."""
    if path is None:
        return {name: {} for name in CONFIG_TABLES + ("meta",)}
    return config_tables(load_toml(path), path)


def config_tables(data: dict, source: Path | None) -> dict[str, dict]:
    """A parsed config's tables: "allocator", "scheduler" and "thresholds" (read by gate/), each {}
    when absent, and "meta" (plan's record: the predictor it chose with, the expected metrics);
    unknown tables refused, and bad allocator and scheduler settings, naming `source` and the key."""
    top = TomlTable(data, source)
    for key in top.data:
        if key not in CONFIG_TABLES and not key.startswith("meta"):
            raise top.error(key, f"unknown table '{key}' (known: {', '.join(CONFIG_TABLES)}, meta*)")
    tables: dict[str, dict] = {}
    for name in CONFIG_TABLES:
        table = top.table(name, required=False)
        tables[name] = dict(table.data) if table is not None else {}
    meta = top.table("meta", required=False)
    tables["meta"] = dict(meta.data) if meta is not None else {}
    if not isinstance(tables["meta"].get("predictor", ""), str):
        raise ConfigError("'predictor' must be a string (an `odmactl fit` artifact folder, oracle or none)",
                          file=source, key="meta.predictor")
    AllocatorConfig.from_mapping(tables["allocator"], source=source, prefix="allocator")  # bad keys now
    scheduler_settings(tables["scheduler"], source)
    return tables
