"""From a canonical trace and the replay options to what `Replay` runs: the Workload (load shaping,
predictions) and each policy's AllocatorConfig (boundaries fitted from the trace's start, a large pool
that holds at least one max-length block)."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.allocator import AllocatorConfig
from odmactl.rules.buckets import quantile_boundaries
from odmactl.hw.cost import CostModel
from odmactl.core.errors import ConfigError
from odmactl.device.ondevice import (DecodeProbe, OnDeviceSpec, check_fits, compute_dtype, release_device_memory,
                              scaled_model)
from odmactl.hw.profiles import DeviceProfile, ModelProfile
from odmactl.sim.loop import SchedulerSettings
from odmactl.sim.workload import PS, Workload

PREDICTOR_CHOICES = ("none", "oracle")
CONFIG_TABLES = ("allocator", "scheduler", "thresholds")


@dataclass(frozen=True)
class LoadOptions:
    """`offline`: everything arrives at t=0; `rate_per_s`: timestamps rescaled to this mean rate
    (Poisson arrivals, seeded, for a trace without timestamps); `limit`: the first N requests."""

    rate_per_s: float | None = None
    offline: bool = False
    limit: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate_per_s is not None and not self.rate_per_s > 0:
            raise ConfigError(f"--rate must be > 0 requests/s, got {self.rate_per_s}")
        if self.offline and self.rate_per_s is not None:
            raise ConfigError("--offline and --rate exclude each other")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")


def shape_arrivals(arrival_s: np.ndarray, load: LoadOptions) -> np.ndarray:
    """Arrival times in seconds after --offline / --rate."""
    n = arrival_s.size
    if load.offline:
        return np.zeros(n)
    if load.rate_per_s is None:
        return arrival_s - (arrival_s[0] if n else 0.0)
    span = float(arrival_s[-1] - arrival_s[0]) if n else 0.0
    if span > 0:
        return (arrival_s - arrival_s[0]) * ((n - 1) / span) / load.rate_per_s
    gaps = np.random.default_rng(load.seed).exponential(1.0 / load.rate_per_s, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def predictions(frame: pl.DataFrame, predictor: str) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(L_hat, u, label): `none`, `oracle` (the realized lengths, u = 0) or a `odmactl fit` artifact."""
    if predictor == "none":
        return None, None, "none"
    if predictor == "oracle":
        return frame["output_tokens"].to_numpy().astype(np.float64), np.zeros(frame.height), "oracle"
    from odmactl.predict.predictor import LengthPredictor

    model = LengthPredictor.load(Path(predictor))
    l_hat, u = model.predict(frame)
    return l_hat.astype(np.float64), u.astype(np.float64), str(predictor)


def build_workload(frame: pl.DataFrame, load: LoadOptions, predictor: str) -> tuple[Workload, pl.DataFrame, str]:
    if load.limit is not None:
        frame = frame.head(load.limit)
    arrival_s = shape_arrivals(frame["arrival_s"].to_numpy().astype(np.float64), load)
    l_hat, u, label = predictions(frame, predictor)
    workload = Workload(
        request_ids=frame["request_id"].to_list(),
        arrival_ps=np.round(arrival_s * PS).astype(np.int64),
        prompt_tokens=frame["prompt_tokens"].to_numpy().astype(np.int64),
        output_tokens=frame["output_tokens"].to_numpy().astype(np.int64),
        predicted_output_tokens=l_hat, uncertainty=u)
    return workload, frame, label


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


def read_config(path: Path | None) -> dict[str, dict]:
    """The tables of a config TOML (plan's output): "allocator", "scheduler" and "thresholds" (read
    by check.py), each {} when absent, and "meta" (plan's record: the predictor it chose with, the
    expected metrics); unknown tables refused, and bad allocator and scheduler keys."""
    if path is None:
        return {name: {} for name in CONFIG_TABLES + ("meta",)}
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("no such file", file=path) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not valid TOML ({exc})", file=path) from None
    for key in data:
        if key not in CONFIG_TABLES and not key.startswith("meta"):
            raise ConfigError(f"unknown table '{key}' (known: {', '.join(CONFIG_TABLES)}, meta*)", file=path, key=key)
    for name in CONFIG_TABLES:
        if not isinstance(data.get(name, {}), dict):
            raise ConfigError(f"'{name}' must be a table", file=path, key=name)
    tables = {name: dict(data.get(name, {})) for name in CONFIG_TABLES}
    tables["meta"] = dict(data["meta"]) if isinstance(data.get("meta"), dict) else {}
    if not isinstance(tables["meta"].get("predictor", ""), str):
        raise ConfigError("'predictor' must be a string (an `odmactl fit` artifact folder, oracle or none)",
                          file=path, key="meta.predictor")
    allocator, scheduler = tables["allocator"], tables["scheduler"]
    AllocatorConfig.from_mapping(allocator, source=path)  # reject bad keys now, naming the file
    known = {f.name for f in dataclasses.fields(SchedulerSettings)} - {"fast_forward", "series_points"}
    for key in scheduler:
        if key not in known:
            raise ConfigError(f"unknown scheduler setting '{key}' (known: {', '.join(sorted(known))})", file=path, key=key)
    return tables


def default_max_model_len(frame: pl.DataFrame, model_max_positions: int | None, pool_tokens: int) -> int:
    """The trace's longest request (prompt + output) rounded up to 1,024, within the model and the pool."""
    longest = int((frame["prompt_tokens"].cast(pl.Int64) + frame["output_tokens"].cast(pl.Int64)).max())
    value = -(-longest // 1024) * 1024
    if model_max_positions:
        value = min(value, model_max_positions)
    return max(1, min(value, pool_tokens))


def allocator_config(policy: str, settings: dict, frame: pl.DataFrame, *, max_model_len: int, pool_bytes: int,
                     bytes_per_token: int) -> tuple[AllocatorConfig, dict]:
    """The policy's config and notes on what was filled in. ODMA without boundaries gets quantile
    boundaries of the realized KV lengths of the trace's first `refit_window` requests (a warm
    start, as if that window had been observed before), then refits online; without a large-pool
    size it gets `large_pool_fraction` of the pool, raised to one max-length block when smaller."""
    values = dict(settings)
    values["max_model_len_tokens"] = max_model_len
    notes: dict = {}
    config = AllocatorConfig.from_mapping(values)
    if policy == "odma":
        if not config.boundaries_tokens:
            window = frame.head(config.refit_window)
            kv = np.minimum((window["prompt_tokens"].cast(pl.Int64) + window["output_tokens"].cast(pl.Int64)).to_numpy(),
                            max_model_len)
            bounds = quantile_boundaries(kv, config.num_buckets, granularity_tokens=config.granularity_tokens,
                                         max_tokens=max_model_len, levels=config.quantile_levels)
            config = dataclasses.replace(config, boundaries_tokens=bounds)
            notes["initial_boundaries"] = f"quantiles of the first {window.height} requests' KV lengths"
        block = max_model_len * bytes_per_token
        if config.large_pool_bytes is None and pool_bytes * config.large_pool_fraction < block:
            if block > pool_bytes:
                raise ConfigError(f"one max_model_len block ({max_model_len} tokens) does not fit the KV pool")
            config = dataclasses.replace(config, large_pool_bytes=block)
            notes["large_pool"] = "raised to one max_model_len block"
    return config, notes


@dataclass(frozen=True)
class ReplaySpec:
    """Everything one `odmactl replay` fixes besides the policy."""

    device: str
    model: str
    kv_dtype: str = "fp16"
    predictor: str | None = None  # None: the config's [meta] predictor (what plan chose with), else "none"
    config: Path | None = None
    load: LoadOptions = LoadOptions()
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    fast_forward: bool = True
    kv_pool_bytes: int | None = None  # None: the profile's (capacity * fraction - weights - reserve)
    on_device: OnDeviceSpec | None = None  # run every decode iteration on a torch device too


@dataclass(frozen=True)
class Serving:
    """A model on a device as a replay sees it: the profiles, the cost model and the KV pool.
    `model` is `full_model`, or for an on-device replay `full_model` scaled to a share of its layers
    with the pool rounded to whole tokens and its size in tokens kept. The cost model computes at
    `compute_dtype`, the profile's faster 16-bit rate (equal on every shipped accelerator)."""

    device: DeviceProfile
    full_model: ModelProfile
    model: ModelProfile
    cost: CostModel
    pool_bytes: int
    compute_dtype: str

    @property
    def bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token


def serving(device_ref: str, model_ref: str, kv_dtype: str = "fp16", kv_pool_bytes: int | None = None,
            scale: float | None = None) -> Serving:
    """Load the profiles and size the pool (`kv_pool_bytes`, else what the profile leaves); `scale`
    (on-device replays only) scales the model as the Serving docstring says."""
    from odmactl.hw.profiles import load_device, load_model

    device = load_device(device_ref)
    full_model = load_model(model_ref, kv_dtype=kv_dtype)
    pool_bytes = kv_pool_bytes if kv_pool_bytes is not None else device.kv_pool_bytes(full_model)
    if pool_bytes < full_model.kv_bytes_per_token:
        raise ConfigError(f"{full_model.name} leaves no KV pool on {device.name} "
                          f"(weights {full_model.weight_bytes:,} bytes, usable {int(device.usable_bytes):,})")
    model = full_model
    if scale is not None:  # whole tokens, so every block starts on a token row of the arena
        model = scaled_model(full_model, scale)
        pool_bytes = pool_bytes // full_model.kv_bytes_per_token * model.kv_bytes_per_token
    dtype = compute_dtype(device)
    return Serving(device, full_model, model, CostModel(device, model, compute_dtype=dtype), pool_bytes, dtype)


def run_policies(frame: pl.DataFrame, policies: list[str], spec: ReplaySpec, progress=None,
                 tables: dict[str, dict] | None = None) -> dict:
    """Replay the trace once per policy; returns the JSON-ready document (settings, one result each).
    On device, the model is scaled to `spec.on_device.scale` of its layers with the pool's size in
    tokens kept, each policy gets a torch arena, and each result gains an "on_device" section."""
    from odmactl.allocator import make_allocator
    from odmactl.sim.loop import Replay

    on_device = spec.on_device
    setup = serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes,
                    on_device.scale if on_device is not None else None)
    device, model, cost, pool_bytes = setup.device, setup.model, setup.cost, setup.pool_bytes
    bpt = setup.bytes_per_token
    if tables is None:  # `read_config(spec.config)`, unless the caller has read it already
        tables = read_config(spec.config)
    allocator_settings, scheduler_settings = tables["allocator"], tables["scheduler"]
    predictor = spec.predictor
    if predictor is None:  # what plan chose with, else none
        named = tables["meta"].get("predictor", "none")
        predictor = predictor_from_config(named, spec.config) if spec.config is not None else named
    workload, frame, label = build_workload(frame, spec.load, predictor)
    max_len = spec.max_model_len or allocator_settings.get("max_model_len_tokens") or \
        default_max_model_len(frame, model.max_position_embeddings, pool_bytes // bpt)
    if spec.max_num_seqs is not None:
        scheduler_settings["max_num_seqs"] = spec.max_num_seqs
    fast_forward = spec.fast_forward and on_device is None
    scheduler = SchedulerSettings(fast_forward=fast_forward, **scheduler_settings)
    results = {}
    for policy in policies:
        config, notes = allocator_config(policy, allocator_settings, frame, max_model_len=max_len,
                                         pool_bytes=pool_bytes, bytes_per_token=bpt)
        tick = (lambda label_, done, total, p=policy: progress(f"replay {p}", done, total)) if progress else None
        probe = None
        if on_device is None:
            allocator = make_allocator(policy, pool_bytes, bpt, config)
        else:
            check_fits(on_device.torch_device, pool_bytes, model.weight_bytes, on_device.scale)
            allocator = make_allocator(policy, pool_bytes, bpt, config, arena="torch", device=on_device.torch_device)
            probe = DecodeProbe(allocator.arena, model, allocator.block_size_tokens if policy == "paged" else None,
                                scheduler.max_num_seqs, setup.compute_dtype)
        result = Replay(workload, allocator, cost, max_len, scheduler, progress=tick, probe=probe).run()
        results[policy] = {"metrics": result.metrics, "config": config.to_mapping(), "notes": notes,
                           "allocator": result.allocator, "series": result.series}
        if probe is not None:
            results[policy]["on_device"] = probe.summary(device, model, setup.full_model, on_device.scale)
            del probe, allocator  # free the arena before the next policy takes its own
            release_device_memory(on_device.torch_device)
    return {
        "trace": {"requests": workload.size, "arrivals": "offline" if spec.load.offline else
                  (f"rescaled to {spec.load.rate_per_s} req/s" if spec.load.rate_per_s else "trace timestamps"),
                  "total_output_tokens": int(workload.output_tokens.sum())},
        "device": device.name, "model": model.name, "kv_dtype": spec.kv_dtype,
        "kv_pool_bytes": pool_bytes, "kv_bytes_per_token": bpt, "max_model_len": max_len,
        "predictor": label, "scheduler": {"max_num_seqs": scheduler.max_num_seqs,
                                          "max_prefill_tokens": scheduler.max_prefill_tokens or max_len},
        "time_advance": "closed-form fast-forward" if fast_forward else
                        ("token-by-token stepping, each decode iteration run on " + on_device.torch_device
                         if on_device else "token-by-token stepping"),
        "results": results,
    }
