"""Memory the allocator hands out: a virtual arena (byte offsets only, for fast replay) or a
torch-backed arena (one real buffer on cpu, cuda or mlu; allocations are views into it)."""

from __future__ import annotations

from typing import Protocol

from odmactl.core.errors import ConfigError
from odmactl.core.stops import import_whole

ARENA_KINDS = ("virtual", "torch")


class Arena(Protocol):
    """Bytes [0, pool_bytes). Policies place allocations at offsets in it and call `copy` to
    migrate; `copied_bytes` counts every byte moved, on either kind of arena."""

    kind: str
    device: str
    pool_bytes: int
    copied_bytes: int

    def copy(self, src_offset_bytes: int, dst_offset_bytes: int, nbytes: int) -> None: ...


class VirtualArena:
    """Offsets only: nothing is stored, a copy only counts its bytes."""

    kind = "virtual"
    device = "none"

    def __init__(self, pool_bytes: int) -> None:
        self.pool_bytes = pool_bytes
        self.copied_bytes = 0

    def copy(self, src_offset_bytes: int, dst_offset_bytes: int, nbytes: int) -> None:
        assert 0 <= src_offset_bytes and src_offset_bytes + nbytes <= self.pool_bytes
        assert 0 <= dst_offset_bytes and dst_offset_bytes + nbytes <= self.pool_bytes
        self.copied_bytes += nbytes


def available_devices() -> list[str]:
    """Torch devices this process can allocate on, best first (mlu needs Cambricon's torch_mlu)."""
    torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

    found = []
    if torch.cuda.is_available():
        found.append("cuda")
    mlu = getattr(torch, "mlu", None)
    if mlu is not None and mlu.is_available():
        found.append("mlu")
    found.append("cpu")
    return found


class TorchArena:
    """One uint8 tensor of `pool_bytes` on `device`. `view` returns the bytes of a range (a view,
    not a copy); `copy` moves bytes inside the buffer (source and destination never overlap,
    since a migration copies between two live blocks)."""

    kind = "torch"

    def __init__(self, pool_bytes: int, device: str = "auto") -> None:
        torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

        choices = available_devices()
        if device == "auto":
            device = choices[0]
        if device.split(":")[0] not in choices:
            raise ConfigError(f"torch sees no '{device}' device here (available: {', '.join(choices)})")
        try:
            self.buffer = torch.empty(pool_bytes, dtype=torch.uint8, device=device)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            raise ConfigError(f"cannot allocate a {pool_bytes:,}-byte arena on {device}: {exc}") from exc
        self.device = str(self.buffer.device)
        self.pool_bytes = pool_bytes
        self.copied_bytes = 0

    def view(self, offset_bytes: int, nbytes: int):
        assert 0 <= offset_bytes and offset_bytes + nbytes <= self.pool_bytes
        return self.buffer[offset_bytes:offset_bytes + nbytes]

    def copy(self, src_offset_bytes: int, dst_offset_bytes: int, nbytes: int) -> None:
        assert abs(src_offset_bytes - dst_offset_bytes) >= nbytes, "migration source and destination overlap"
        self.view(dst_offset_bytes, nbytes).copy_(self.view(src_offset_bytes, nbytes))
        self.copied_bytes += nbytes


def make_arena(kind: str, pool_bytes: int, device: str = "auto") -> VirtualArena | TorchArena:
    if kind == "virtual":
        return VirtualArena(pool_bytes)
    if kind == "torch":
        return TorchArena(pool_bytes, device)
    raise ConfigError(f"unknown arena '{kind}' (choose from: {', '.join(ARENA_KINDS)})")
