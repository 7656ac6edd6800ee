"""Chains of page ranges in one int64 buffer: the page ranges each request (or adapter) of the
unified pool holds (allocator/unified.py), without a Python list or int per range.

A chain is named by a handle (the index of its header node); a node is three values at
`_values[3 * n:3 * n + 3]`:
- a range node: its first page, its page count (> 0), the next node of its chain (-1 after the last);
- a header node: the chain's first range node and last range node (-1 for both while empty),
  and its range count;
- a free node: two unused values and the next free node (-1 after the last).
Invariants: every node is a header, in exactly one chain, or free; a chain's ranges are in the
order they were appended; `free_node` heads the free nodes. Nodes are reused, never returned:
the buffer holds the most nodes ever in use at once.

Compiled (setup.py, pageruns.pxd), PageRuns is an extension type whose methods the allocator calls
as C functions; they index the buffer's typed view through the attribute, as ExtentList does.
From source, the same arithmetic runs on a list.
"""

from __future__ import annotations

from odmactl.allocator.extentlist import ExtentList
from odmactl.allocator.int64buffer import Int64Buffer

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython  # cython.compiled is a constant when compiled: the from-source branches are not built
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    from odmactl.core.purecython import cython


@cython.boundscheck(False)  # node indexes stay within [0, size): the invariants above
@cython.initializedcheck(False)  # `_values` is always set (Int64Buffer), but while `_grow` replaces it
@cython.wraparound(False)
@cython.overflowcheck(False)  # and 3 * n + 2 stays far below 2**63
class PageRuns(Int64Buffer):
    """Chains of (first page, pages) ranges, one per handle (see the module's docstring)."""

    __slots__ = ("free_node",)

    def __init__(self, capacity_nodes: cython.longlong = 64) -> None:
        super().__init__(3 * max(capacity_nodes, 1))
        self.free_node = -1

    def _node(self) -> cython.longlong:
        """A node for the caller to fill: the first free one, else a new one at the end."""
        n: cython.longlong = self.free_node
        if n >= 0:
            self.free_node = self._values[3 * n + 2]
            return n
        if not cython.compiled:
            self._buffer.extend((0, 0, 0))
        elif self.size + 3 > self.capacity:
            self._grow()  # the buffer is replaced: nothing may hold it across
        self.size += 3
        return self.size // 3 - 1

    def _drop(self, n: cython.longlong) -> None:
        """Node n is free again."""
        self._values[3 * n + 2] = self.free_node
        self.free_node = n

    def new(self) -> cython.longlong:
        """A new, empty chain's handle."""
        h: cython.longlong = self._node()
        self._values[3 * h] = -1
        self._values[3 * h + 1] = -1
        self._values[3 * h + 2] = 0
        return h

    def discard(self, h: cython.longlong) -> None:
        """Chain h, which holds no range, is gone."""
        self._drop(h)

    def append(self, h: cython.longlong, start: cython.longlong, pages: cython.longlong) -> None:
        """Chain h's new last range: `pages` pages from page `start`."""
        n: cython.longlong = self._node()
        last: cython.longlong = self._values[3 * h + 1]
        self._values[3 * n] = start
        self._values[3 * n + 1] = pages
        self._values[3 * n + 2] = -1
        if last < 0:
            self._values[3 * h] = n
        else:
            self._values[3 * last + 2] = n
        self._values[3 * h + 1] = n
        self._values[3 * h + 2] += 1

    def runs(self, h: cython.longlong) -> cython.longlong:
        """How many ranges chain h holds."""
        return self._values[3 * h + 2]

    def first_page(self, h: cython.longlong) -> cython.longlong:
        """The first page of chain h's first range (the chain holds one)."""
        return self._values[3 * self._values[3 * h]]

    def last(self, h: cython.longlong) -> cython.longlong:
        """Chain h's last range node (-1 when it holds none)."""
        return self._values[3 * h + 1]

    def end(self, n: cython.longlong) -> cython.longlong:
        """The page after range node n."""
        return self._values[3 * n] + self._values[3 * n + 1]

    def widen(self, n: cython.longlong, pages: cython.longlong) -> None:
        """Range node n takes the `pages` pages after it (the caller took them from the free ranges)."""
        self._values[3 * n + 1] += pages

    def join_next(self, h: cython.longlong, n: cython.longlong) -> cython.bint:
        """Merge the range after node n in chain h into n when it begins where n ends; whether it did."""
        m: cython.longlong = self._values[3 * n + 2]
        if m < 0 or self._values[3 * m] != self._values[3 * n] + self._values[3 * n + 1]:
            return False
        self._values[3 * n + 1] += self._values[3 * m + 1]
        self._values[3 * n + 2] = self._values[3 * m + 2]
        if self._values[3 * h + 1] == m:
            self._values[3 * h + 1] = n
        self._values[3 * h + 2] -= 1
        self._drop(m)
        return True

    def give_all(self, h: cython.longlong, free: ExtentList) -> cython.longlong:
        """Give every range of chain h to `free`, first to last, and end the chain; returns the
        pages given."""
        pages: cython.longlong = 0
        n: cython.longlong = self._values[3 * h]
        m: cython.longlong
        while n >= 0:
            free.add(self._values[3 * n], self._values[3 * n + 1])
            pages += self._values[3 * n + 1]
            m = self._values[3 * n + 2]
            self._drop(n)
            n = m
        self._drop(h)
        return pages

    def tolist(self, h: cython.longlong) -> list[int]:
        """Chain h's ranges as [first page, pages, ...], first to last."""
        out: list[int] = []
        n: cython.longlong = self._values[3 * h]
        while n >= 0:
            out.append(int(self._values[3 * n]))
            out.append(int(self._values[3 * n + 1]))
            n = self._values[3 * n + 2]
        return out

    def nodes_in_use(self) -> int:
        """Nodes that are headers or ranges (every node less the free ones)."""
        free = 0
        n = self.free_node
        while n >= 0:
            free += 1
            n = self._values[3 * n + 2]
        return self.size // 3 - free
