"""A min-heap of 64-bit integer keys in an int64 buffer: the replay's pending events.

The replay keys each pending completion or block overflow as iteration * span + admission number
(see replay.SEQ_SPAN), so an event is one integer and the heap never compares Python objects.
Compiled (setup.py, keyheap.pxd), KeyHeap is an extension type whose methods the replay calls as
C functions; push and pop sift through a raw pointer to the buffer (a typed view taken in a local
costs two atomic operations a call; indexing the attribute reloads it at every step), top
indexes the attribute. From source, where a sift loop in Python would be several times slower
than heapq's C one, it keeps the keys in a list ordered by heapq: the same heap invariant and the
same pops (keys are distinct, so the smallest is one key).
"""

from __future__ import annotations

from heapq import heappop, heappush

from odmactl.allocator.int64buffer import Int64Buffer

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython  # cython.compiled is a constant when compiled: the from-source branches are not built
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    from odmactl.core.purecython import cython


@cython.initializedcheck(False)  # `_values` is always set (Int64Buffer), but while `_grow` replaces it
class KeyHeap(Int64Buffer):
    """Keys `_values[0:size]` (Int64Buffer) in binary-heap order: every key is >= its parent's
    (index (i - 1) // 2), so `_values[0]` is the smallest. From source, the list is ordered by
    heapq. Equal keys pop in no particular order (the replay's keys are distinct: admission
    numbers are)."""

    __slots__ = ()

    def __init__(self, capacity: cython.longlong = 64) -> None:
        super().__init__(capacity)

    def push(self, key: cython.longlong) -> None:
        pos: cython.longlong = self.size
        parent: cython.longlong
        if not cython.compiled:
            heappush(self._buffer, key)
            self.size = pos + 1
            return
        if pos == self.capacity:
            self._grow()
        keys: cython.p_longlong = cython.address(self._values[0])  # the buffer, until it grows
        self.size = pos + 1
        while pos > 0:  # sift the hole up to where key belongs
            parent = (pos - 1) >> 1
            if keys[parent] <= key:
                break
            keys[pos] = keys[parent]
            pos = parent
        keys[pos] = key

    def top(self) -> cython.longlong:
        """The smallest key (the heap must not be empty)."""
        if self.size == 0:
            raise IndexError("top of an empty KeyHeap")
        return self._values[0]  # through the attribute: a local view would cost two atomic operations

    def pop(self) -> cython.longlong:
        """Remove and return the smallest key (the heap must not be empty)."""
        size: cython.longlong = self.size
        pos: cython.longlong = 0
        child: cython.longlong
        if size == 0:
            raise IndexError("pop from an empty KeyHeap")
        if not cython.compiled:
            self.size = size - 1
            return heappop(self._buffer)
        keys: cython.p_longlong = cython.address(self._values[0])  # the buffer, until it grows
        smallest: cython.longlong = keys[0]
        size -= 1
        self.size = size
        last: cython.longlong = keys[size]
        while True:  # sift the hole at the root down, then fill it with the last key
            child = 2 * pos + 1
            if child >= size:
                break
            if child + 1 < size and keys[child + 1] < keys[child]:
                child += 1
            if last <= keys[child]:
                break
            keys[pos] = keys[child]
            pos = child
        if size:
            keys[pos] = last
        return smallest
