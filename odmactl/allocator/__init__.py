"""The KV-cache allocator library: one API, six policies, a virtual or a torch-backed arena.

    alloc = make_allocator("odma", pool_bytes, bytes_per_token, {"gamma": 0.2})
    a = alloc.reserve("req-1", prompt_tokens=512, predicted_output_tokens=300, uncertainty=0.1)
    if a is not None and alloc.extend(a, 900): ...
    alloc.release(a)
"""

from __future__ import annotations

from collections.abc import Mapping

from odmactl.allocator.arena import ARENA_KINDS, Arena, TorchArena, VirtualArena, make_arena
from odmactl.allocator.base import Allocation, Allocator, AllocatorStats, InvariantError
from odmactl.allocator.config import AllocatorConfig
from odmactl.allocator.ellm import EllmAllocator
from odmactl.allocator.odma import OdmaAllocator
from odmactl.allocator.paged import PagedAllocator
from odmactl.allocator.s3 import S3Allocator
from odmactl.allocator.static import StaticAllocator
from odmactl.allocator.unified import UnifiedAllocator
from odmactl.core.errors import ConfigError

ALLOCATORS: dict[str, type] = {
    "static": StaticAllocator,
    "paged": PagedAllocator,
    "s3": S3Allocator,
    "odma": OdmaAllocator,
    "ellm": EllmAllocator,
    "unified": UnifiedAllocator,
}


def make_allocator(name: str, pool_bytes: int, bytes_per_token: int,
                   config: AllocatorConfig | Mapping[str, object] | None = None, *,
                   arena: Arena | str = "virtual", device: str = "auto") -> Allocator:
    """A policy from ALLOCATORS over `pool_bytes`; `arena` is an Arena, "virtual" or "torch"
    (on `device`: auto, cpu, cuda, mlu)."""
    if name not in ALLOCATORS:
        raise ConfigError(f"unknown allocator policy '{name}' (choose from: {', '.join(ALLOCATORS)})")
    if config is None:
        config = AllocatorConfig()
    elif not isinstance(config, AllocatorConfig):
        config = AllocatorConfig.from_mapping(config)
    if isinstance(arena, str):
        arena = make_arena(arena, ALLOCATORS[name].arena_bytes(pool_bytes, config), device)
    return ALLOCATORS[name](pool_bytes, bytes_per_token, config, arena)


__all__ = [
    "ALLOCATORS", "ARENA_KINDS", "Allocation", "Allocator", "AllocatorConfig", "AllocatorStats", "Arena",
    "InvariantError", "TorchArena", "VirtualArena", "make_allocator", "make_arena",
]
