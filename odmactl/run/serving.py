"""A model on a device as a replay sees it: the profiles, the cost model and the KV pool."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_POOL_TOKENS
from odmactl.core.units import format_bytes
from odmactl.hw.cost import PAGED_BLOCK_TOKENS, CostModel
from odmactl.hw.profiles import DeviceProfile, ModelProfile, load_device, load_model
from odmactl.run.spec import ServingSpec, papers_static
from odmactl.sim.workload import Workload


@dataclass(frozen=True)
class Serving:
    """`model` is `full_model`, one device's shard of it when it is split over `tp` devices
    (tensor parallelism, ModelProfile.shard), or for an on-device replay `full_model` scaled to a
    share of its layers with the pool rounded to whole tokens and its size in tokens kept. The pool
    and a token's KV bytes are the group's: `tp` devices' worth. The cost model computes at
    `compute_dtype`, the profile's faster 16-bit rate (equal on every shipped accelerator)."""

    device: DeviceProfile
    full_model: ModelProfile
    model: ModelProfile
    cost: CostModel
    pool_bytes: int
    compute_dtype: str
    tp: int = 1

    @property
    def model_name(self) -> str:
        """The model as reports name it: the whole model's name under tensor parallelism, the
        scaled model's on a device."""
        return self.full_model.name if self.tp > 1 else self.model.name

    @property
    def group_name(self) -> str:
        """The devices the model runs on, as messages name them (`group_name`)."""
        return group_name(self.device.name, self.tp)

    @property
    def bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token * self.tp

    @property
    def pool_tokens(self) -> int:
        return self.pool_bytes // self.bytes_per_token


def serving(device_ref: str, model_ref: str, kv_dtype: str = "fp16", kv_pool_bytes: int | None = None,
            scale: float | None = None, tp: int = 1) -> Serving:
    """Load the profiles and size the pool (`kv_pool_bytes`, else what the profile leaves on each
    of the `tp` devices, summed); `scale` (on-device replays only) scales the model as the Serving
    docstring says."""
    device = load_device(device_ref)
    full_model = load_model(model_ref, kv_dtype=kv_dtype)
    model = full_model.shard(tp)
    device.interconnect_for(tp)  # a profile without a link cannot host a tp group: say so first
    group = group_name(device.name, tp)
    room = device.kv_pool_bytes(model, tp)  # the most a pool may take: what the profile leaves
    bytes_per_token = model.kv_bytes_per_token * tp  # the group's: Serving.bytes_per_token
    if kv_pool_bytes is not None and kv_pool_bytes > room:
        raise ConfigError(f"--kv-pool {format_bytes(kv_pool_bytes)} does not fit {group}: the usable memory "
                          f"({format_bytes(device.usable_bytes * tp)}) less {model.name}'s weights "
                          f"({format_bytes(model.weight_bytes * tp)}) and the activation reserve "
                          f"({format_bytes(device.activation_reserve_bytes * tp)}) leaves {format_bytes(room)}",
                          hint="give a smaller --kv-pool, or a device profile with more memory")
    pool_bytes = kv_pool_bytes if kv_pool_bytes is not None else room
    if pool_bytes < bytes_per_token:
        if kv_pool_bytes is not None:
            raise ConfigError(f"--kv-pool {format_bytes(kv_pool_bytes)} holds no token of {model.name} (a token's KV "
                              f"takes {bytes_per_token:,} bytes)", hint="give a larger --kv-pool")
        raise ConfigError(f"{model.name} leaves no KV pool on {group} "
                          f"(weights {model.weight_bytes:,} bytes a device, usable {int(device.usable_bytes):,})",
                          hint="a larger --tp splits the weights over more devices" if tp == 1 else None)
    if pool_bytes // bytes_per_token > MAX_POOL_TOKENS:
        raise ConfigError(f"the KV pool of {group} holds {pool_bytes // bytes_per_token:,} tokens of "
                          f"{model.name}, more than odmactl replays ({MAX_POOL_TOKENS:,}); a profile's capacity or the "
                          "model's size is likely wrong", hint="check the profiles, or give a smaller --kv-pool")
    if scale is not None:  # whole tokens, so every block starts on a token row of the arena
        scaled = model.scaled(scale)
        pool_bytes = pool_bytes // model.kv_bytes_per_token * scaled.kv_bytes_per_token
        model = scaled
    dtype = device.compute_dtype
    cost = CostModel(device, model, compute_dtype=dtype, tp=tp)
    return Serving(device, full_model, model, cost, pool_bytes, dtype, tp)


def group_name(device_name: str, tp: int) -> str:
    """'DEVICE', or under tensor parallelism 'TP x DEVICE'."""
    return f"{tp} x {device_name}" if tp > 1 else device_name


def default_max_model_len(workload: Workload, model: ModelProfile, pool_tokens: int) -> int:
    """The trace's longest request (prompt + output KV tokens) rounded up to 1,024, within the
    model's positions and the pool in whole blocks of the largest size vLLM's kernels take (a block
    policy refuses a max_model_len its pool cannot hold in whole blocks)."""
    longest = int((workload.prompt_tokens.astype(np.int64) + workload.output_tokens.astype(np.int64)).max())
    value = -(-longest // 1024) * 1024
    if model.max_position_embeddings:
        value = min(value, model.max_position_embeddings)
    whole = pool_tokens - pool_tokens % PAGED_BLOCK_TOKENS[-1]
    return max(1, min(value, whole or pool_tokens))


def default_max_new_tokens(workload: Workload, max_len: int) -> int:
    """vLLM's max_tokens when none is given: the trace's longest output rounded up to a power of
    two, within max_len (so it truncates no request of the trace)."""
    longest = int(workload.output_tokens.max()) if workload.size else 1
    return max(1, min(1 << max(longest - 1, 0).bit_length(), max_len))


def static_legend(names) -> str | None:
    """What the static baselines' names mean, for the tables that show them (None without one)."""
    papers = sorted({n for n in names if n.startswith("static+")})
    if not papers:
        return None
    n = papers[0].removeprefix("static+")
    return (f"static: a slot of max_model_len per request; static+{n}: a slot of prompt + {n} new tokens, "
            "Cambricon-vLLM's pre-allocation (the ODMA papers' baseline; N is --max-new-tokens, else the power of "
            "two that holds the longest output)")


STATIC_KEYS = ("static_slot", "max_new_tokens")  # the [allocator] settings that size static's slot


def static_baselines(spec: ServingSpec, workload: Workload, max_len: int, cap: int | None,
                     allocator: dict | None = None) -> list[tuple[str, dict[str, object]]]:
    """The two static settings plan and capacity compare against, as (name, [allocator] table):
    `allocator` (a config's table) with the command line's settings over it, static's own slot
    settings replaced by "static", a slot of max_model_len per request, and "static+N", a slot of
    prompt + N with N the output cap in force (`cap`: --max-new-tokens, else a config's
    [scheduler] max_new_tokens), else `default_max_new_tokens` (`papers_static`)."""
    n = cap or default_max_new_tokens(workload, max_len)
    base = {**{k: v for k, v in (allocator or {}).items() if k not in STATIC_KEYS}, **spec.allocator_overrides()}
    return [("static", {**base, "static_slot": "max_model_len"}), (f"static+{n}", {**base, **papers_static(n)})]
