"""The coalesced free extents of one allocator region, in address order, in an int64 buffer:
best-fit `take` and coalescing `add` (allocator/extents.py keeps per-size free lists in front),
and unified's takes of page ranges (`take_at`: growth in place; `take_largest_first`: a take
scattered over the largest free ranges).

An extent is (start, nbytes); extent j is `_values[2 * j]`, `_values[2 * j + 1]`. A region's
coalesced extents are separated by live blocks, so there are at most one more of them than
there are live allocations in it (a few dozen while a replay runs, at most a few hundred), and a
scan of them in C costs less than the dictionary updates of indexes by start, end and size
(which this replaced: about 1,700 machine instructions a take and 5,200 a merge, against a few
hundred for the scan, measured with callgrind on a 100,000-request replay).

Compiled (setup.py, extentlist.pxd), ExtentList is an extension type whose methods the region
calls as C functions. They index the buffer's typed view (C-contiguous, its initialization not
checked) through the attribute (`self._values[i]`), never through a local copy of the view: taking
one costs two atomic operations a call, which were half of `_after`'s samples under `perf` on the
overloaded unified replay. From source, the same index arithmetic runs on a list, which opens and
closes gaps with slice assignment.
"""

from __future__ import annotations

from odmactl.allocator.int64buffer import Int64Buffer

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython  # cython.compiled is a constant when compiled: the from-source branches are not built
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    from odmactl.core.purecython import cython


@cython.initializedcheck(False)  # `_values` is always set (Int64Buffer), but while `_grow` replaces it
class ExtentList(Int64Buffer):
    """Extents (start, nbytes) as value pairs in `_values[0:size]` (Int64Buffer; size is twice
    the extent count), in ascending start order, each with nbytes > 0 and no two touching or
    overlapping (a caller's invariant on `add`; FreeExtents.check verifies it). `_pieces`: what
    the last `take_largest_first` took, as (nbytes, start) pairs in the order taken (None until
    the first; its extent invariants do not hold)."""

    __slots__ = ("_pieces",)

    def __init__(self, capacity_extents: cython.longlong = 16) -> None:
        super().__init__(2 * max(capacity_extents, 1))
        self._pieces = None

    def __len__(self) -> int:
        return self.size >> 1

    def take(self, nbytes: cython.longlong) -> cython.longlong:
        """Best fit: the smallest extent of at least `nbytes` (the lowest such on a tie) gives up
        its first `nbytes`; returns their start, or -1 when no extent is large enough."""
        return self._take_fit(nbytes, False)

    def take_first(self, nbytes: cython.longlong) -> cython.longlong:
        """First fit: the lowest extent of at least `nbytes` gives up its first `nbytes`; returns
        their start, or -1 when no extent is large enough."""
        return self._take_fit(nbytes, True)

    def _take_fit(self, nbytes: cython.longlong, first: cython.bint) -> cython.longlong:
        """`take_first` (`first`) or `take`."""
        j: cython.longlong = self._fit(nbytes, first)
        if j == 0:
            return -1
        start: cython.longlong = self._values[j - 1]
        self._take_front(j >> 1, nbytes)
        return start

    def holds(self, nbytes: cython.longlong) -> cython.bint:
        """Whether an extent of at least `nbytes` is free (`take` would succeed; nothing is taken)."""
        return self._fit(nbytes, True) != 0

    @cython.boundscheck(False)  # its indexes stay within [0, size)
    @cython.wraparound(False)
    def _fit(self, nbytes: cython.longlong, first: cython.bint) -> cython.longlong:
        """The index of the size of the extent that takes `nbytes`: the smallest that holds them
        (the lowest on a tie), or with `first` the lowest; 0 when none does."""
        best: cython.longlong = 0
        best_size: cython.longlong = 0
        n: cython.longlong
        j: cython.longlong = 1
        while j < self.size:
            n = self._values[j]
            if n >= nbytes and (best == 0 or n < best_size):
                best, best_size = j, n
                if n == nbytes or first:
                    break
            j += 2
        return best

    @cython.boundscheck(False)  # its indexes stay within [0, size)
    @cython.wraparound(False)
    def take_largest_first(self, nbytes: cython.longlong) -> cython.longlong:
        """Take `nbytes` from the largest extents, largest first (the lowest on a tie), each from
        its start: whole, but for the last, which gives what is left. That is taking the largest
        extent again and again; one scan finds the next four of them (sizes s0 >= .. >= s3 at
        starts a0 .. a3, in registers). Returns how many extents gave (`piece_start(i)`,
        `piece_size(i)`); -1 when all of them held less (the caller counts its free bytes: what
        there was is taken)."""
        if self._pieces is None:
            self._pieces = ExtentList()
        self._pieces._clear()
        n: cython.longlong
        j: cython.longlong
        s0: cython.longlong
        s1: cython.longlong
        s2: cython.longlong
        s3: cython.longlong
        a0: cython.longlong = 0
        a1: cython.longlong = 0
        a2: cython.longlong = 0
        a3: cython.longlong = 0
        while nbytes > 0:
            s0 = s1 = s2 = s3 = 0
            j = 1
            while j < self.size:
                n = self._values[j]
                if n > s3:  # it ranks among the four (a later start loses a tie)
                    if n > s0:
                        s3, a3, s2, a2, s1, a1, s0, a0 = s2, a2, s1, a1, s0, a0, n, self._values[j - 1]
                    elif n > s1:
                        s3, a3, s2, a2, s1, a1 = s2, a2, s1, a1, n, self._values[j - 1]
                    elif n > s2:
                        s3, a3, s2, a2 = s2, a2, n, self._values[j - 1]
                    else:
                        s3, a3 = n, self._values[j - 1]
                j += 2
            if s0 == 0:
                return -1
            nbytes = self._give_piece(a0, s0, nbytes)
            if s1 and nbytes:
                nbytes = self._give_piece(a1, s1, nbytes)
            if s2 and nbytes:
                nbytes = self._give_piece(a2, s2, nbytes)
            if s3 and nbytes:
                nbytes = self._give_piece(a3, s3, nbytes)
        return self._pieces.size >> 1

    def _give_piece(self, start: cython.longlong, size: cython.longlong, nbytes: cython.longlong) -> cython.longlong:
        """The extent of `size` at `start` gives its whole, or `nbytes` when fewer, recorded as a
        piece; returns what is left to take."""
        n: cython.longlong = size if size < nbytes else nbytes
        self._take_front(self._after(start) - 1, n)
        self._pieces._insert(self._pieces.size >> 1, n, start)
        return nbytes - n

    def piece_start(self, i: cython.longlong) -> cython.longlong:
        """Where the i-th extent of the last `take_largest_first` gave from."""
        return self._pieces._values[2 * i + 1]

    def piece_size(self, i: cython.longlong) -> cython.longlong:
        """How much the i-th extent of the last `take_largest_first` gave."""
        return self._pieces._values[2 * i]

    def add(self, start: cython.longlong, nbytes: cython.longlong) -> None:
        """Free [start, start + nbytes), merged with the extents it touches."""
        j: cython.longlong = self._after(start)
        end: cython.longlong = start + nbytes
        left: cython.bint = j > 0 and self._values[2 * j - 2] + self._values[2 * j - 1] == start
        right: cython.bint = 2 * j < self.size and self._values[2 * j] == end
        if left and right:
            self._values[2 * j - 1] += nbytes + self._values[2 * j + 1]
            self._close(j)
        elif left:
            self._values[2 * j - 1] += nbytes
        elif right:
            self._values[2 * j] = start
            self._values[2 * j + 1] += nbytes
        else:
            self._insert(j, start, nbytes)

    def take_at(self, start: cython.longlong, most: cython.longlong, least: cython.longlong) -> cython.longlong:
        """Growth in place (the range before `start` is extended): take [start, start + most)
        if a free extent begins at `start` and holds it, else [start, start + least) if it holds
        that (least <= most); returns what it took, 0 when neither."""
        j: cython.longlong = self._after(start) - 1
        if j < 0 or self._values[2 * j] != start or self._values[2 * j + 1] < least:
            return 0
        nbytes: cython.longlong = most if self._values[2 * j + 1] >= most else least
        self._take_front(j, nbytes)
        return nbytes

    def _take_front(self, j: cython.longlong, nbytes: cython.longlong) -> None:
        """Extent j gives up its first `nbytes` (at most its size): the remainder keeps its end."""
        if self._values[2 * j + 1] == nbytes:
            self._close(j)
        else:
            self._values[2 * j] += nbytes
            self._values[2 * j + 1] -= nbytes

    def tolist(self) -> list[tuple[int, int]]:
        """The extents as (start, nbytes), in address order."""
        flat = [int(v) for v in self._values[: self.size]]
        return list(zip(flat[0::2], flat[1::2]))

    @cython.boundscheck(False)  # its indexes stay within [0, size)
    @cython.wraparound(False)
    @cython.overflowcheck(False)  # and so do base and half
    def _after(self, start: cython.longlong) -> cython.longlong:
        """How many extents start at or before `start` (binary search, without a branch on the
        comparison: the range [base, base + n] holds the answer and halves each step)."""
        n: cython.longlong = self.size >> 1
        if n == 0:
            return 0
        base: cython.longlong = 0
        half: cython.longlong
        while n > 1:
            half = n >> 1
            base = base + half if self._values[2 * (base + half)] <= start else base
            n -= half
        return base + (self._values[2 * base] <= start)

    def _insert(self, j: cython.longlong, first: cython.longlong, second: cython.longlong) -> None:
        """Pair (first, second) at index j (the later ones move up one)."""
        if not cython.compiled:
            self._buffer[2 * j:2 * j] = (first, second)
            self.size += 2
            return
        if self.size == self.capacity:
            self._grow()  # the buffer is replaced: nothing may hold it across
        if self.size > 2 * j:  # the later extents up one (memmove: libc's, cimported in extentlist.pxd)
            memmove(cython.address(self._values[2 * j + 2]), cython.address(self._values[2 * j]), (self.size - 2 * j) * 8)
        self._values[2 * j] = first
        self._values[2 * j + 1] = second
        self.size += 2

    def _clear(self) -> None:
        """No pairs."""
        if not cython.compiled:
            del self._buffer[:]
        self.size = 0

    def _close(self, j: cython.longlong) -> None:
        """Remove extent j (the later ones move down one)."""
        if not cython.compiled:
            del self._buffer[2 * j:2 * j + 2]
            self.size -= 2
            return
        last: cython.longlong = self.size - 2
        if last > 2 * j:  # the later extents down one
            memmove(cython.address(self._values[2 * j]), cython.address(self._values[2 * j + 2]), (last - 2 * j) * 8)
        self.size = last
