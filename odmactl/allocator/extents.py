"""Free byte ranges of one contiguous region: per-size free lists in front of best-fit extents
that coalesce (deferred coalescing, the scheme of dlmalloc's fast bins)."""

from __future__ import annotations

from odmactl.allocator.extentlist import ExtentList


class FreeExtents:
    """The free bytes of the region [base, base + size_bytes), held in two forms.

    Per-size free lists (`_bins[size]`: a stack of starts): `give` pushes a released block here
    in O(1) and `take` of the same size pops it back, last in first out. This is the hot path: an
    allocator whose blocks come in a few sizes (ODMA buckets, static slots) mostly reuses blocks.

    Coalesced extents (`_extents`, an ExtentList in address order): `take` finds the best fit
    (the smallest extent large enough, the lowest on a tie) and splits off its low end. Extents are
    maximal: no two touch.

    Binned blocks are merged into the extents (`consolidate`) when a `take` finds neither a block of
    its size nor an extent large enough, so free space that is contiguous is never refused; and
    when the region becomes entirely free it is one piece again (reset to one extent, unless the
    block given back is the whole region). Invariants (checked by
    `check`): binned blocks and extents are disjoint, inside the region, and add up to
    `free_bytes`. `extents()` reports the free space with touching pieces merged, whichever form
    they are in. Everything is deterministic: no hashing of objects, no clocks. `gives` counts the
    blocks given back: while it stands, no take can succeed that failed before.
    """

    __slots__ = ("base", "size_bytes", "free_bytes", "binned_bytes", "consolidations", "gives", "_bins", "_extents")

    def __init__(self, base: int, size_bytes: int) -> None:
        assert base >= 0 and size_bytes >= 0
        self.base = base
        self.size_bytes = size_bytes
        self.consolidations = 0
        self.gives = 0
        self._reset()

    def _reset(self) -> None:
        self.free_bytes = self.size_bytes
        self.binned_bytes = 0
        self._bins: dict[int, list[int]] = {}
        self._extents = ExtentList()
        if self.size_bytes:
            self._extents.add(self.base, self.size_bytes)

    # -- the two operations ----------------------------------------------------------------------

    def take(self, nbytes: int) -> int | None:
        """Start of a free range of `nbytes`, now taken; None when no free piece is large enough.

        Order: a released block of exactly this size; else the best-fitting extent, split; else
        consolidate the free lists and look again. A request for more than all the free bytes
        fails at once (a full pool retried at every admission would otherwise consolidate for
        nothing).
        """
        if nbytes > self.free_bytes:
            return None
        binned = self._bins.get(nbytes)
        if binned:
            self.free_bytes -= nbytes
            self.binned_bytes -= nbytes
            return binned.pop()
        start = self._extents.take(nbytes)
        if start < 0 and self.binned_bytes:
            self.consolidate()
            start = self._extents.take(nbytes)
        if start < 0:
            return None
        self.free_bytes -= nbytes
        return start

    def give(self, start: int, nbytes: int) -> None:
        """Return [start, start + nbytes) to the free list of its size (bounds are the caller's
        invariant; `check` verifies them)."""
        self.free_bytes += nbytes
        self.gives += 1
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
        extents = self._extents
        for nbytes, starts in bins.items():
            for start in starts:
                extents.add(start, nbytes)

    # -- queries -------------------------------------------------------------------------------

    def can_take(self, nbytes: int) -> bool:
        """Whether `take(nbytes)` would succeed now, taking nothing and consolidating nothing (a
        router's question, sim/cluster.py): the same three places, in `take`'s order, the last
        read from the merged view `extents()` instead of merging the lists."""
        if nbytes > self.free_bytes:
            return False
        if self._bins.get(nbytes):
            return True
        if self._extents.holds(nbytes):
            return True
        if self.binned_bytes:
            for _, n in self.extents():
                if n >= nbytes:
                    return True
        return False

    def extents(self) -> list[tuple[int, int]]:
        """Free (start, nbytes) in address order, touching pieces merged (a read-only view)."""
        pieces = sorted([*self._extents.tolist(), *((s, n) for n, starts in self._bins.items() for s in starts)])
        out: list[list[int]] = []
        for start, n in pieces:
            if out and out[-1][0] + out[-1][1] == start:
                out[-1][1] += n
            else:
                out.append([start, n])
        return [(start, n) for start, n in out]

    def check(self) -> None:
        """Raise AssertionError if an invariant of the class docstring does not hold."""
        coalesced = self._extents.tolist()
        prev_end = None
        for start, n in coalesced:
            assert n > 0, f"empty extent at {start}"
            assert prev_end is None or start > prev_end, f"extents touch, overlap or are out of order at {start}"
            prev_end = start + n
        binned = [(s, n) for n, starts in self._bins.items() for s in starts]
        assert sum(n for _, n in binned) == self.binned_bytes, "binned byte count disagrees with the free lists"
        pos = self.base
        for start, n in sorted(coalesced + binned):
            assert start >= pos, f"free pieces overlap at {start}"
            pos = start + n
        assert pos <= self.base + self.size_bytes, "a free piece runs past the region"
        assert sum(n for _, n in coalesced) + self.binned_bytes == self.free_bytes, "free byte count disagrees"
