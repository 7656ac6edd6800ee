"""A sorted set of non-negative 64-bit integers: the free-extent sizes of an allocator region
(allocator/extents.py), where `take` asks for the smallest size at least as large as a request.

Compiled (setup.py, sortedints.pxd), SortedInts is an extension type over an int64 buffer with a
binary search in C, which the allocator calls as C functions. From source it is a list kept
sorted by bisect: the same values, in the same order, with the same answers.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from odmactl.int64buffer import Int64Buffer

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython  # cython.compiled is a constant when compiled: the from-source branches are not built
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    class cython:  # noqa: N801 - the one name this module reads at run time
        compiled = False


class SortedInts(Int64Buffer):
    """Distinct values `_values[0:size]` (Int64Buffer) in ascending order, each >= 0."""

    __slots__ = ()

    def __init__(self, capacity: cython.longlong = 16) -> None:
        super().__init__(capacity)

    def _index(self, x: cython.longlong) -> cython.longlong:
        """The first position whose value is >= x (size when there is none): bisect_left."""
        if not cython.compiled:
            return bisect_left(self._buffer, x)
        values: cython.longlong[:] = self._values
        lo: cython.longlong = 0
        hi: cython.longlong = self.size
        mid: cython.longlong
        while lo < hi:
            mid = (lo + hi) >> 1
            if values[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def ceiling(self, x: cython.longlong) -> cython.longlong:
        """The smallest value >= x, or -1 when every value is smaller."""
        i: cython.longlong = self._index(x)
        if i == self.size:
            return -1
        if not cython.compiled:
            return self._buffer[i]
        values: cython.longlong[:] = self._values
        return values[i]

    def add(self, x: cython.longlong) -> None:
        """Insert x, which must be >= 0 and not present."""
        if x < 0:
            raise ValueError(f"SortedInts holds non-negative values, got {x}")
        if not cython.compiled:
            insort(self._buffer, x)
            self.size += 1
            return
        if self.size == self.capacity:
            self._grow()
        i: cython.longlong = self._index(x)
        j: cython.longlong = self.size
        values: cython.longlong[:] = self._values
        while j > i:  # shift the tail up by one
            values[j] = values[j - 1]
            j -= 1
        values[i] = x
        self.size += 1

    def remove(self, x: cython.longlong) -> None:
        """Delete x, which must be present (KeyError otherwise)."""
        i: cython.longlong = self._index(x)
        if not cython.compiled:
            if i == self.size or self._buffer[i] != x:
                raise KeyError(x)
            del self._buffer[i]
            self.size -= 1
            return
        values: cython.longlong[:] = self._values
        if i == self.size or values[i] != x:
            raise KeyError(x)
        last: cython.longlong = self.size - 1
        while i < last:  # shift the tail down by one
            values[i] = values[i + 1]
            i += 1
        self.size = last

    def tolist(self) -> list[int]:
        return [int(v) for v in self._values[: self.size]]
