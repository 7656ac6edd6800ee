"""The coalesced free extents of one allocator region, in address order, in an int64 buffer:
best-fit `take` and coalescing `add` (allocator/extents.py keeps per-size free lists in front).

An extent is (start, nbytes); extent j is `_values[2 * j]`, `_values[2 * j + 1]`. A region's
coalesced extents are separated by live blocks, so there are at most one more of them than
there are live allocations in it (a few dozen while a replay runs, at most a few hundred), and a
scan of them in C costs less than the dictionary updates of indexes by start, end and size
(which this replaced: about 1,700 machine instructions a take and 5,200 a merge, against a few
hundred for the scan, measured with callgrind on a 100,000-request replay).

Compiled (setup.py, extentlist.pxd), ExtentList is an extension type whose methods the region
calls as C functions. They index the buffer's typed view through the attribute (`self._values[i]`),
never through a local copy of the view: taking one costs two atomic operations a call, which were
half of `_after`'s samples under `perf` on the overloaded unified replay. From source, the same
index arithmetic runs on a list, which opens and closes gaps with slice assignment.
"""

from __future__ import annotations

from odmactl.allocator.int64buffer import Int64Buffer

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython  # cython.compiled is a constant when compiled: the from-source branches are not built
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    class cython:  # noqa: N801 - the names this module reads at run time
        compiled = False

        @staticmethod
        def boundscheck(flag):
            return lambda function: function

        wraparound = overflowcheck = boundscheck


class ExtentList(Int64Buffer):
    """Extents (start, nbytes) as value pairs in `_values[0:size]` (Int64Buffer; size is twice
    the extent count), in ascending start order, each with nbytes > 0 and no two touching or
    overlapping (a caller's invariant on `add`; FreeExtents.check verifies it)."""

    __slots__ = ()

    def __init__(self, capacity_extents: cython.longlong = 16) -> None:
        super().__init__(2 * max(capacity_extents, 1))

    def __len__(self) -> int:
        return self.size >> 1

    @cython.boundscheck(False)  # its indexes stay within [0, size)
    @cython.wraparound(False)
    def take(self, nbytes: cython.longlong) -> cython.longlong:
        """Best fit: the smallest extent of at least `nbytes` (the lowest such on a tie) gives up
        its first `nbytes`; returns their start, or -1 when no extent is large enough."""
        best: cython.longlong = -1  # index of the best extent's size
        best_size: cython.longlong = 0
        n: cython.longlong
        start: cython.longlong
        j: cython.longlong = 1
        while j < self.size:
            n = self._values[j]
            if n >= nbytes and (best < 0 or n < best_size):
                best, best_size = j, n
                if n == nbytes:
                    break
            j += 2
        if best < 0:
            return -1
        start = self._values[best - 1]
        if best_size == nbytes:
            self._close(best >> 1)
        else:  # the remainder keeps the extent's end
            self._values[best - 1] = start + nbytes
            self._values[best] = best_size - nbytes
        return start

    def add(self, start: cython.longlong, nbytes: cython.longlong) -> None:
        """Free [start, start + nbytes), merged with the extents it touches."""
        if cython.compiled and self.size == self.capacity:
            self._grow()  # room for one more extent (the buffer is replaced: nothing may hold it across)
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
            self._open(j)
            self._values[2 * j] = start
            self._values[2 * j + 1] = nbytes

    def take_first(self, nbytes: cython.longlong) -> cython.longlong:
        """First fit: the lowest extent of at least `nbytes` gives up its first `nbytes`; returns
        their start, or -1 when no extent is large enough."""
        start: cython.longlong
        j: cython.longlong = 1
        while j < self.size:
            if self._values[j] >= nbytes:
                start = self._values[j - 1]
                if self._values[j] == nbytes:
                    self._close(j >> 1)
                else:
                    self._values[j - 1] = start + nbytes
                    self._values[j] -= nbytes
                return start
            j += 2
        return -1

    def take_at(self, start: cython.longlong, nbytes: cython.longlong) -> cython.bint:
        """Take [start, start + nbytes) if a free extent begins at `start` and holds it (growth
        in place: the range before it is extended); answers whether it did."""
        j: cython.longlong = self._after(start) - 1
        if j < 0 or self._values[2 * j] != start or self._values[2 * j + 1] < nbytes:
            return False
        if self._values[2 * j + 1] == nbytes:
            self._close(j)
        else:
            self._values[2 * j] = start + nbytes
            self._values[2 * j + 1] -= nbytes
        return True

    @cython.boundscheck(False)  # its indexes stay within [0, size)
    @cython.wraparound(False)
    def largest(self) -> cython.longlong:
        """The start of the largest extent (the lowest such on a tie), or -1 when there is none."""
        best: cython.longlong = -1
        best_size: cython.longlong = 0
        j: cython.longlong = 1
        while j < self.size:
            if self._values[j] > best_size:
                best, best_size = self._values[j - 1], self._values[j]
            j += 2
        return best

    def size_at(self, start: cython.longlong) -> cython.longlong:
        """The size of the extent that begins at `start` (0 when none does)."""
        j: cython.longlong = self._after(start) - 1
        if j < 0 or self._values[2 * j] != start:
            return 0
        return self._values[2 * j + 1]

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

    def _open(self, j: cython.longlong) -> None:
        """Make room for an extent at index j (the later ones move up one); compiled, the buffer
        has room (`add` grew it)."""
        if not cython.compiled:
            self._buffer[2 * j:2 * j] = (0, 0)
            self.size += 2
            return
        if self.size > 2 * j:  # the later extents up one (memmove: libc's, cimported in extentlist.pxd)
            memmove(cython.address(self._values[2 * j + 2]), cython.address(self._values[2 * j]), (self.size - 2 * j) * 8)
        self.size += 2

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
