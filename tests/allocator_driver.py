"""Drive an allocator with a list of operations, checking invariants (and, on a torch arena, the
bytes themselves) after every one. Shared by the property tests."""

from __future__ import annotations

import torch

from odmactl.allocator import Allocation

BYTES_PER_TOKEN = 8
MAX_LEN_TOKENS = 256
POOL_BYTES = 16_040  # not a multiple of any block: tails must be accounted for
CONFIG = {
    "max_model_len_tokens": MAX_LEN_TOKENS, "block_size_tokens": 16, "s3_num_buckets": 5,
    "large_pool_fraction": 0.25, "refit_window": 40, "refit_every": 15, "granularity_tokens": 8,
}


def _token_ranges(alloc, a: Allocation, tokens: int) -> list[tuple[int, int]]:
    """Byte ranges holding the first `tokens` KV tokens of `a`."""
    bpt = alloc.bytes_per_token
    if alloc.block_size_tokens is None:  # ranges (one block, or page ranges), in the order the tokens fill them
        out, left = [], tokens * bpt
        for start, n in alloc._ranges(a):
            if left <= 0:
                break
            out.append((start, min(n, left)))
            left -= n
        return out
    if a.block_ids is None:
        return [(a.offset_bytes, tokens * bpt)]
    bs = alloc.block_size_tokens
    out = []
    for j, block in enumerate(a.block_ids):
        n = min(bs, tokens - j * bs)
        if n <= 0:
            break
        out.append((block * alloc.block_bytes, n * bpt))
    return out


class Driver:
    """Applies reserve / extend / release; with a torch arena every request's written tokens hold
    its own byte value, verified after each operation (an overlap or a bad copy changes them)."""

    def __init__(self, alloc) -> None:
        self.alloc = alloc
        self.live: list[Allocation] = []
        self.written: dict[str, int] = {}
        self.ops = 0
        self.next_id = 0
        self.torch = alloc.arena.kind == "torch"

    def value(self, rid: str) -> int:
        return (int(rid[1:]) * 37 + 11) % 251 + 1

    def fill(self, a: Allocation) -> None:
        if self.torch:
            for start, n in _token_ranges(self.alloc, a, a.used_tokens):
                self.alloc.arena.view(start, n).fill_(self.value(a.request_id))
        self.written[a.request_id] = a.used_tokens

    def verify_bytes(self) -> None:
        if not self.torch:
            return
        for a in self.live:
            for start, n in _token_ranges(self.alloc, a, self.written[a.request_id]):
                view = self.alloc.arena.view(start, n)
                assert bool((view == self.value(a.request_id)).all()), f"bytes of {a.request_id} changed"

    def step(self, kind: int, x: int, y: int, u: float) -> None:
        self.ops += 1
        if kind <= 3 or not self.live:
            rid = f"r{self.next_id}"
            self.next_id += 1
            prompt = x % MAX_LEN_TOKENS + 1
            a = self.alloc.reserve(rid, prompt, predicted_output_tokens=y if kind != 3 else None, uncertainty=u)
            if a is not None:
                assert a.request_id == rid and a.used_tokens == prompt and a.capacity_tokens >= prompt
                self.live.append(a)
                self.fill(a)
        elif kind <= 6:
            a = self.live[x % len(self.live)]
            total = a.used_tokens + y % 96 + (0 if kind == 4 else 1)
            before = (a.offset_bytes, a.capacity_tokens)
            ok = self.alloc.extend(a, total)
            if ok:
                assert a.used_tokens == total <= a.capacity_tokens
                self.verify_bytes()  # a migration must have carried the written tokens over
                self.fill(a)
            else:
                assert (a.offset_bytes, a.capacity_tokens) == before and a.used_tokens < total
        else:
            a = self.live.pop(x % len(self.live))
            self.alloc.release(a)
            assert not a.live
            del self.written[a.request_id]
            if getattr(self.alloc, "refit_due", False):  # odma with refit_mode = "deferred"
                self.alloc.flush_refit()
        self.alloc.check_invariants()
        self.verify_bytes()

    def release_all(self) -> None:
        while self.live:
            self.alloc.release(self.live.pop())
            self.alloc.check_invariants()


def expected_free_extents(alloc) -> list[tuple[int, int]]:
    """One fully coalesced free extent per region (the pool itself for single-region policies)."""
    regions = getattr(alloc, "regions", None)
    if regions is None:
        return [(0, alloc.pool_bytes)]
    return [(r.base, r.size_bytes) for r in regions.values() if r.size_bytes]


def torch_arena(pool_bytes: int):
    from odmactl.allocator import TorchArena

    arena = TorchArena(pool_bytes, "cpu")
    arena.buffer.zero_()
    return arena


__all__ = ["BYTES_PER_TOKEN", "CONFIG", "Driver", "MAX_LEN_TOKENS", "POOL_BYTES", "expected_free_extents",
           "torch", "torch_arena"]
