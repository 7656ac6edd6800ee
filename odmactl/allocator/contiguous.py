"""Policies that give each request one contiguous block (static, s3, odma): placement from
regions of free extents, release with coalescing, and migration by allocate-copy-release."""

from __future__ import annotations

from array import array

from odmactl.allocator.base import Allocation, AllocatorBase, RegionStats
from odmactl.allocator.extents import FreeExtents


class ContiguousAllocator(AllocatorBase):
    """Blocks of `capacity_tokens * bytes_per_token` bytes placed best-fit in named regions.

    Invariant: the regions partition [0, pool_bytes) in address order, and every live allocation
    lies inside the region it names; each region's FreeExtents holds exactly its free bytes;
    `kv_runs` is the number of live allocations (each is read as one run).
    """

    def _init_regions(self, sizes_bytes: dict[str, int]) -> None:
        self.regions: dict[str, FreeExtents] = {}
        base = 0
        for name, size in sizes_bytes.items():
            self.regions[name] = FreeExtents(base, size)
            base += size
        assert base == self.pool_bytes
        self._main = self.regions["main"]
        self._realized: array | None = None  # see _consume_realized
        self._realized_batch = 0

    def room_for(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> bool:
        """One contiguous free piece of the main region holds the request's block (static's and
        s3's `reserve` place it there; odma overrides this with its regions)."""
        return self._main.can_take(self.reservation_tokens(prompt_tokens, predicted_output_tokens, uncertainty)
                                   * self.bytes_per_token)

    def _place(self, region: str, request_id: str, capacity_tokens: int, used_tokens: int,
               bucket: int | str | None) -> Allocation | None:
        nbytes = capacity_tokens * self.bytes_per_token
        start = self.regions[region].take(nbytes)
        if start is None:
            return None
        return Allocation(request_id, start, nbytes, capacity_tokens, used_tokens, bucket, region)

    def _reserve_in(self, extents: FreeExtents, region: str, request_id: str, capacity_tokens: int,
                    prompt_tokens: int, bucket: int | str | None) -> Allocation | None:
        """Place a new block in `extents` (region `region`) and admit it (AllocatorBase._admitted
        written out: this is the hot path)."""
        nbytes = capacity_tokens * self.bytes_per_token
        start = extents.take(nbytes)
        if start is None:
            self.failed_reserves += 1
            return None
        a = Allocation(request_id, start, nbytes, capacity_tokens, prompt_tokens, bucket, region)
        self._live[request_id] = a
        a.owner = self
        self.kv_runs += 1
        reserved = self.reserved_bytes = self.reserved_bytes + nbytes
        if reserved > self.peak_reserved_bytes:
            self.peak_reserved_bytes = reserved
        return a

    def _migrate(self, a: Allocation, region: str, capacity_tokens: int, bucket: int | str | None,
                 total_tokens: int) -> bool:
        """Allocate the new block, copy the KV written so far contiguously, release the old block;
        the Allocation object keeps its identity and now describes the new block."""
        new = self._place(region, a.request_id, capacity_tokens, a.used_tokens, bucket)
        if new is None:
            self.failed_extends += 1
            return False
        copied = a.used_tokens * self.bytes_per_token
        self.arena.copy(a.offset_bytes, new.offset_bytes, copied)
        self.regions[a.region].give(a.offset_bytes, a.nbytes)
        self.reserved_bytes += new.nbytes - a.nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes + a.nbytes)
        a.offset_bytes, a.nbytes, a.capacity_tokens = new.offset_bytes, new.nbytes, new.capacity_tokens
        a.bucket, a.region, a.used_tokens = bucket, region, total_tokens
        self.migrations += 1
        self.migrated_bytes += copied
        return True

    def _grow_in_place(self, a: Allocation, total_tokens: int) -> bool:
        self._growth(a, total_tokens)
        x = a  # compiled, a typed local (contiguous.pxd): `_growth` found it this allocator's live Allocation
        self.extends += 1
        if total_tokens <= x.capacity_tokens:
            x.used_tokens = total_tokens
            return True
        return False

    def release(self, allocation: Allocation, final_tokens: int | None = None) -> None:
        try:
            rid = allocation.request_id
        except AttributeError:
            rid = None
        if self._live.get(rid) is not allocation:
            self._own(allocation)  # raises the right AllocationError
        a = allocation  # compiled, a typed local (contiguous.pxd): it is this allocator's live Allocation
        if final_tokens is not None:
            self._final_growth(a, final_tokens, a.capacity_tokens)
        self.regions[a.region].give(a.offset_bytes, a.nbytes)
        del self._live[rid]  # AllocatorBase._forget written out: the hot path
        self.kv_runs -= 1
        a.live = False
        a.owner = None
        self.releases += 1
        self.reserved_bytes -= a.nbytes
        realized = self._realized
        if realized is not None:
            realized.append(a.used_tokens)
            if len(realized) >= self._realized_batch:
                self._consume_realized()

    def _consume_realized(self) -> None:
        """Policies that learn from realized KV lengths set `_realized` to an array('q') and
        `_realized_batch`; release appends each finished request's length and calls this when a
        batch is full (the per-release cost is one append)."""
        raise NotImplementedError

    def _ranges(self, a: Allocation) -> list[tuple[int, int]]:
        return [(a.offset_bytes, a.nbytes)]

    def free_extents(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for region in self.regions.values():
            out += region.extents()
        return out

    def _region_stats(self) -> dict[str, RegionStats]:
        return {name: RegionStats.of(r.size_bytes, r.extents()) for name, r in self.regions.items()}

    def _check_structures(self) -> None:
        assert self.kv_runs == len(self._live), f"kv_runs counter {self.kv_runs}, {len(self._live)} live allocations"
        for name, region in self.regions.items():
            region.check()
        for a in self._live.values():
            r = self.regions[a.region]
            assert r.base <= a.offset_bytes and a.offset_bytes + a.nbytes <= r.base + r.size_bytes, \
                f"request '{a.request_id}' lies outside its region '{a.region}'"
