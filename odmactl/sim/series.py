"""The replay's time series: pool occupancy, batch size and queue length sampled at event boundaries."""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None


class Series:
    """Samples at event boundaries, at most 2 * points: when full, every other sample is dropped and
    the spacing doubles (deterministic, bounded memory whatever the trace length). Invariant: rows
    are in time order and `next_ps` is the earliest time of the next sample."""

    __slots__ = ("points", "gap_ps", "next_ps", "rows")

    def __init__(self, points: int) -> None:
        self.points = max(points, 2)
        self.gap_ps = 0
        self.next_ps = 0
        self.rows = []  # (t_ps, reserved_bytes, batch, queue) tuples

    def add(self, t_ps: cython.longlong, reserved_bytes, batch: cython.longlong, queue: cython.longlong) -> cython.longlong:
        """Sample (unless before `next_ps`); returns the next `next_ps`."""
        if t_ps < self.next_ps:
            return self.next_ps
        self.rows.append((t_ps, reserved_bytes, batch, queue))
        if len(self.rows) >= 2 * self.points:
            self.rows = self.rows[::2]
            self.gap_ps = max(2 * self.gap_ps, (t_ps - self.rows[0][0]) // self.points)
        self.next_ps = t_ps + self.gap_ps
        return self.next_ps
