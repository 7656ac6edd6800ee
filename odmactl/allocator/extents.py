"""Free byte ranges of one contiguous region: per-size free lists in front of best-fit extents
that coalesce (deferred coalescing, the scheme of dlmalloc's fast bins)."""

from __future__ import annotations

from odmactl.sortedints import SortedInts


class FreeExtents:
    """The free bytes of the region [base, base + size_bytes), held in two forms.

    Per-size free lists (`_bins[size]`: a stack of starts): `give` pushes a released block here
    in O(1) and `take` of the same size pops it back, last in first out. This is the hot path: an
    allocator whose blocks come in a few sizes (ODMA buckets, static slots) mostly reuses blocks.

    Coalesced extents, indexed three ways and kept consistent on every change: by start
    (`_size_at[start]`), by end (`_start_ending_at[end]`) and by size (`_starts_of_size[size]`, an
    insertion-ordered set of starts), with `_sizes` the sizes present (a SortedInts) so `take`
    finds the best fit by binary search and splits off the low end. Extents are maximal: no two touch.

    Binned blocks are merged into the extents (`consolidate`) when a `take` finds neither a block of
    its size nor an extent large enough, so free space that is contiguous is never refused; and
    when the region becomes entirely free it is one piece again (reset to one extent, unless the
    block given back is the whole region). Invariants (checked by
    `check`): binned blocks and extents are disjoint, inside the region, and add up to
    `free_bytes`. `extents()` reports the free space with touching pieces merged, whichever form
    they are in. Everything is deterministic: no hashing of objects, no clocks.
    """

    __slots__ = ("base", "size_bytes", "free_bytes", "binned_bytes", "consolidations", "_bins",
                 "_size_at", "_start_ending_at", "_starts_of_size", "_sizes")

    def __init__(self, base: int, size_bytes: int) -> None:
        assert base >= 0 and size_bytes >= 0
        self.base = base
        self.size_bytes = size_bytes
        self.consolidations = 0
        self._reset()

    def _reset(self) -> None:
        self.free_bytes = self.size_bytes
        self.binned_bytes = 0
        self._bins: dict[int, list[int]] = {}
        self._size_at: dict[int, int] = {}
        self._start_ending_at: dict[int, int] = {}
        self._starts_of_size: dict[int, dict[int, None]] = {}
        self._sizes = SortedInts()
        if self.size_bytes:
            self._insert(self.base, self.size_bytes)

    # -- the two operations (index updates written out inline: this is the allocator's hot path) --

    def take(self, nbytes: int) -> int | None:
        """Start of a free range of `nbytes`, now taken; None when no free piece is large enough.

        Order: a released block of exactly this size; else an extent of exactly this size; else the
        smallest larger extent, split; else consolidate the free lists and look again.
        """
        binned = self._bins.get(nbytes)
        if binned:
            self.free_bytes -= nbytes
            self.binned_bytes -= nbytes
            return binned.pop()
        start = self._take_extent(nbytes)
        if start is None and self.binned_bytes:
            self.consolidate()
            start = self._take_extent(nbytes)
        return start

    def give(self, start: int, nbytes: int) -> None:
        """Return [start, start + nbytes) to the free list of its size (bounds are the caller's
        invariant; `check` verifies them)."""
        self.free_bytes += nbytes
        if self.free_bytes == self.size_bytes and nbytes != self.size_bytes:
            self._reset()  # everything is free again, in pieces: make it one extent, empty lists
            return
        self.binned_bytes += nbytes
        binned = self._bins.get(nbytes)
        if binned is None:
            self._bins[nbytes] = [start]
        else:
            binned.append(start)

    def consolidate(self) -> None:
        """Merge every binned block into the extents, coalescing with its free neighbours."""
        self.consolidations += 1
        bins, self._bins = self._bins, {}
        self.binned_bytes = 0
        for nbytes, starts in bins.items():
            for start in starts:
                self._merge(start, nbytes)

    # -- queries -------------------------------------------------------------------------------

    def extents(self) -> list[tuple[int, int]]:
        """Free (start, nbytes) in address order, touching pieces merged (a read-only view)."""
        pieces = sorted([*self._size_at.items(), *((s, n) for n, starts in self._bins.items() for s in starts)])
        out: list[list[int]] = []
        for start, n in pieces:
            if out and out[-1][0] + out[-1][1] == start:
                out[-1][1] += n
            else:
                out.append([start, n])
        return [(start, n) for start, n in out]

    def check(self) -> None:
        """Raise AssertionError if an invariant of the class docstring does not hold."""
        coalesced = sorted(self._size_at.items())
        prev_end = None
        for start, n in coalesced:
            assert n > 0, f"empty extent at {start}"
            assert prev_end is None or start > prev_end, f"extents touch or overlap at {start} (not coalesced)"
            assert self._start_ending_at.get(start + n) == start, f"end index missing for extent {start}+{n}"
            assert start in self._starts_of_size.get(n, {}), f"size index missing for extent {start}+{n}"
            prev_end = start + n
        assert len(self._start_ending_at) == len(coalesced), "stale entries in the end index"
        assert sum(len(s) for s in self._starts_of_size.values()) == len(coalesced), "stale entries in the size index"
        assert self._sizes.tolist() == sorted(self._starts_of_size) and all(self._starts_of_size.values()), \
            "size list out of date"
        binned = [(s, n) for n, starts in self._bins.items() for s in starts]
        assert sum(n for _, n in binned) == self.binned_bytes, "binned byte count disagrees with the free lists"
        pos = self.base
        for start, n in sorted(coalesced + binned):
            assert start >= pos, f"free pieces overlap at {start}"
            pos = start + n
        assert pos <= self.base + self.size_bytes, "a free piece runs past the region"
        assert sum(n for _, n in coalesced) + self.binned_bytes == self.free_bytes, "free byte count disagrees"

    # -- coalesced extents ---------------------------------------------------------------------

    def _take_extent(self, nbytes: int) -> int | None:
        by_size = self._starts_of_size
        size = self._sizes.ceiling(nbytes)
        if size < 0:
            return None
        starts = by_size[size]
        start = starts.popitem()[0]
        if not starts:
            del by_size[size]
            self._sizes.remove(size)
        del self._size_at[start]
        self.free_bytes -= nbytes
        if size == nbytes:
            del self._start_ending_at[start + size]
            return start
        # the remainder keeps the extent's end: re-point the end index, re-file it under its new size
        rest_start, rest = start + nbytes, size - nbytes
        self._size_at[rest_start] = rest
        self._start_ending_at[start + size] = rest_start
        bucket = by_size.get(rest)
        if bucket is None:
            by_size[rest] = {rest_start: None}
            self._sizes.add(rest)
        else:
            bucket[rest_start] = None
        return start

    def _merge(self, start: int, nbytes: int) -> None:
        end = start + nbytes
        before = self._start_ending_at.pop(start, None)
        if before is not None:
            self._unfile(before, start - before)
            del self._size_at[before]
            start = before
        after = self._size_at.pop(end, None)
        if after is not None:
            self._unfile(end, after)
            del self._start_ending_at[end + after]
            end += after
        self._insert(start, end - start)

    def _insert(self, start: int, nbytes: int) -> None:
        self._size_at[start] = nbytes
        self._start_ending_at[start + nbytes] = start
        starts = self._starts_of_size.get(nbytes)
        if starts is None:
            self._starts_of_size[nbytes] = {start: None}
            self._sizes.add(nbytes)
        else:
            starts[start] = None

    def _unfile(self, start: int, nbytes: int) -> None:
        starts = self._starts_of_size[nbytes]
        del starts[start]
        if not starts:
            del self._starts_of_size[nbytes]
            self._sizes.remove(nbytes)
