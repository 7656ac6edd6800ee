"""What a replay counts as it runs: events, the pool's occupancy over time, the time series and
the bucket boundaries a policy used, and the counters sim/metrics.py turns into metrics.

Compiled (setup.py, tally.pxd), Tally is an extension type whose counters are C fields and whose
methods the engine calls as C functions; the same source runs in Python.
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.sim.series import Series
from odmactl.sim.workload import PS

OCCUPANCY_FLUSH = 1 << 62  # a 64-bit partial sum of byte x ps terms moves to the Python integer once at this


def seconds(t_ps) -> float:
    """Picoseconds as seconds, Python's exactly rounded int / int (also when t_ps comes from a C integer)."""
    return t_ps / PS


class Tally:
    """The counters of one replay (names as sim/metrics.py reads them). Sums of bytes x
    picoseconds outgrow 64 bits: `occupancy_byte_ps` is a Python integer and `occupancy_acc` the
    64-bit part not yet added to it. `series` samples the pool, the batch and the queue at event
    boundaries from `series_next_ps` on; `boundaries` the bucket boundaries a policy with changing
    boundaries used, (seconds, boundaries) at each change.
    Invariant: every counter only grows; occupancy_byte_ps + occupancy_acc is the time integral
    of reserved bytes over the iterations run so far, summed by `occupy` (the block-growth
    fast-forward adds its own sum of blocks x ps, which may pass 64 bits, times a block's bytes)."""

    __slots__ = ("preemptions", "stalls", "too_long", "truncated", "recomputed", "migrations", "peak", "prefills", "decodes",
                 "completed", "migrated_bytes", "migration_ps", "occupancy_byte_ps", "occupancy_acc", "series",
                 "series_next_ps", "boundaries", "track_boundaries", "updates_seen")

    def __init__(self, series_points: int, track_boundaries: bool) -> None:
        self.preemptions = self.stalls = self.too_long = self.truncated = self.recomputed = 0
        self.migrations = self.peak = self.prefills = self.decodes = self.completed = 0
        self.migrated_bytes = self.occupancy_byte_ps = self.occupancy_acc = self.migration_ps = 0
        self.series = Series(series_points)
        self.series_next_ps = 0  # the series takes no sample before this time
        self.boundaries = []
        self.track_boundaries = track_boundaries
        self.updates_seen = -1

    def occupy(self, reserved_now: cython.longlong, dt: cython.longlong) -> None:
        """`reserved_now` bytes held for `dt` ps, summed in 64 bits and handed to the Python sum at
        2**62: the partial sum stays below 2**62 between calls and a term summed in 64 bits is at
        most 2**62, so their sum stays below 2**63 (a larger term goes to the Python sum at once)."""
        if dt == 0 or reserved_now <= OCCUPANCY_FLUSH // dt:
            self.occupancy_acc += reserved_now * dt
            if self.occupancy_acc >= OCCUPANCY_FLUSH:
                self.occupancy_byte_ps += self.occupancy_acc
                self.occupancy_acc = 0
        else:
            self.occupancy_byte_ps += int(reserved_now) * dt

    def migrated(self, copied, dt: cython.longlong, reserved_now) -> None:
        """A migration copied `copied` bytes in `dt` ps while `reserved_now` bytes were held."""
        self.migrations += 1
        self.migrated_bytes += copied
        self.migration_ps += dt
        self.occupy(reserved_now, dt)

    def observe(self, t: cython.longlong, alloc, n: cython.longlong) -> cython.bint:
        """At a decode boundary: the batch's size, the boundaries the policy uses now; whether the
        series takes a sample now (`sample`)."""
        if n > self.peak:
            self.peak = n
        if self.track_boundaries and self.updates_seen != alloc.boundary_updates:
            self.updates_seen = alloc.boundary_updates
            self.boundaries.append((seconds(t), list(alloc.boundaries_tokens)))
        return t >= self.series_next_ps

    def sample(self, t: cython.longlong, reserved_now, n: cython.longlong, waiting: cython.longlong) -> None:
        self.series_next_ps = self.series.add(t, reserved_now, n, waiting)

    def counters(self, end_ps: cython.longlong, rejections: cython.longlong, link, kv_pool_bytes, prefix=None) -> dict:
        """The counters sim/metrics.replay_result reads, at the end of the run (with the prefix
        cache's, allocator/prefix.py, when the replay kept one)."""
        self.occupancy_byte_ps += self.occupancy_acc
        self.occupancy_acc = 0
        own = {} if prefix is None else prefix.counters()
        return own | {"preemptions": self.preemptions, "stalls": self.stalls, "rejections": rejections,
                "rejected_prompt_too_long": self.too_long, "truncated": self.truncated,
                "recomputed_tokens": self.recomputed, "migrations": self.migrations,
                "migrated_bytes": self.migrated_bytes, "peak_concurrency": self.peak,
                "prefill_iterations": self.prefills, "decode_iterations": self.decodes,
                "occupancy_byte_ps": self.occupancy_byte_ps, "migration_ps": self.migration_ps,
                "end_ps": end_ps, "host_link_bytes": link.moved_bytes, "host_link_ps": link.link_ps,
                "link_bottleneck_ps": link.bottleneck_ps, "kv_pool_bytes": kv_pool_bytes}
