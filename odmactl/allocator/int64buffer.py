"""A growable buffer of 64-bit integers: the storage of KeyHeap (keyheap.py) and ExtentList
(extentlist.py), which keep their values in `_values[0:size]` in their own order.

Compiled (setup.py, int64buffer.pxd), it is an extension type over an array('q') whose typed view
the subclasses index in C; the buffer doubles when full and never shrinks (`capacity`). From
source it is a list, which the subclasses change with heapq or slice assignment (C loops) where
their own Python loops would be slow; `capacity` and `_grow` then go unused.
"""

from __future__ import annotations

from array import array

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython  # cython.compiled is a constant when compiled: the from-source branches are not built
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    from odmactl.core.purecython import cython


class Int64Buffer:
    """`size` values in `_values[0:size]`; compiled, `_values` views `_buffer` (`capacity` slots)."""

    __slots__ = ("size", "capacity", "_buffer", "_values")

    def __init__(self, capacity: cython.longlong) -> None:
        self.size = 0
        self.capacity = max(capacity, 1)
        self._buffer = array("q", bytes(8 * self.capacity)) if cython.compiled else []
        self._values = self._buffer

    def __len__(self) -> int:
        return self.size

    def _grow(self) -> None:
        self._values = None  # a buffer cannot be resized while a view of it is held
        self._buffer.extend(self._buffer)
        self._values = self._buffer
        self.capacity *= 2
