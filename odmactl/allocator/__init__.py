"""The KV-cache allocator library: one API, six policies, a virtual or a torch-backed arena. A
policy of one's own is registered with `register(ThePolicy)` (allocator/registry.py).

    alloc = make_allocator("odma", pool_bytes, bytes_per_token, {"gamma": 0.2})
    a = alloc.reserve("req-1", prompt_tokens=512, predicted_output_tokens=300, uncertainty=0.1)
    if a is not None and alloc.extend(a, 900): ...
    alloc.release(a)
"""

from __future__ import annotations

from collections.abc import Mapping

from odmactl.allocator.arena import ARENA_KINDS, Arena, TorchArena, VirtualArena, make_arena
from odmactl.allocator.base import AdapterCache, Allocation, Allocator, AllocatorStats, HostTier, InvariantError
from odmactl.allocator.config import AllocatorConfig, Deployment
from odmactl.allocator.ellm import EllmAllocator
from odmactl.allocator.odma import OdmaAllocator
from odmactl.allocator.paged import PagedAllocator
from odmactl.allocator.registry import ALLOCATORS, register, unregister
from odmactl.allocator.s3 import S3Allocator
from odmactl.allocator.static import StaticAllocator
from odmactl.allocator.unified import UnifiedAllocator
from odmactl.core.errors import ConfigError

for _policy in (StaticAllocator, PagedAllocator, S3Allocator, OdmaAllocator, EllmAllocator, UnifiedAllocator):
    register(_policy)


def make_allocator(name: str, pool_bytes: int, bytes_per_token: int,
                   config: AllocatorConfig | Mapping[str, object] | None = None, *,
                   arena: Arena | str = "virtual", device: str = "auto", deployment: Deployment | None = None) -> Allocator:
    """A policy from ALLOCATORS over `pool_bytes`; `arena` is an Arena, "virtual" or "torch"
    (on `device`: auto, cpu, cuda, mlu); `deployment` the device and model facts a policy may
    need during a replay (eLLM's activation model)."""
    if name not in ALLOCATORS:
        raise ConfigError(f"unknown allocator policy '{name}' (choose from: {', '.join(ALLOCATORS)})")
    if config is None:
        config = AllocatorConfig()
    elif not isinstance(config, AllocatorConfig):
        config = AllocatorConfig.from_mapping(config)
    if isinstance(arena, str):
        arena = make_arena(arena, ALLOCATORS[name].arena_bytes(pool_bytes, config), device)
    return ALLOCATORS[name](pool_bytes, bytes_per_token, config, arena, deployment=deployment)


__all__ = [
    "ALLOCATORS", "ARENA_KINDS", "AdapterCache", "Allocation", "Allocator", "AllocatorConfig", "AllocatorStats", "Arena",
    "Deployment", "HostTier", "InvariantError", "TorchArena", "VirtualArena", "make_allocator", "make_arena", "register",
    "unregister",
]
