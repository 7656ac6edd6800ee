"""What a replay counts as it runs: events, the pool's occupancy over time, the time series and
the bucket boundaries a policy used, and the counters sim/metrics.py turns into metrics.

Compiled (setup.py, tally.pxd), Tally is an extension type whose counters are C fields and whose
methods the engine calls as C functions; the same source runs in Python.
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython  # cython.compiled is a constant when compiled: the from-source branch is not built
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    from odmactl.core.purecython import cython

from odmactl.sim.series import Series
from odmactl.sim.workload import PS

TWO_64 = 1 << 64  # the weight of occupancy_hi
HI_FLUSH = 1 << 62  # occupancy_hi moves to the Python sum at this (a call adds less than 2**62 + 2**33 to it)


def seconds(t_ps) -> float:
    """Picoseconds as seconds, Python's exactly rounded int / int (also when t_ps comes from a C integer)."""
    return t_ps / PS


class Tally:
    """The counters of one replay (names as sim/metrics.py reads them). Sums of bytes x
    picoseconds outgrow 64 bits (a pool's bytes times one step's ps already does): `occupancy_byte_ps`
    is a Python integer, and compiled, `occupy` keeps its own sum as a 128-bit number in two
    unsigned 64-bit halves, `occupancy_hi` x 2**64 + `occupancy_lo`, added to it at `counters`.
    `series` samples the pool, the batch and the queue at event boundaries from `series_next_ps`
    on; `boundaries` the bucket boundaries a policy with changing boundaries used, (seconds,
    boundaries) at each change.
    Invariant: every counter only grows; occupancy_byte_ps + occupancy_hi x 2**64 + occupancy_lo
    is the time integral of reserved bytes over the iterations run so far, summed by `occupy`
    (the block-growth fast-forward adds its own sum of blocks x ps, which may pass 64 bits, times
    a block's bytes, to occupancy_byte_ps)."""

    __slots__ = ("preemptions", "stalls", "too_long", "truncated", "recomputed", "migrations", "peak", "prefills", "decodes",
                 "completed", "migrated_bytes", "migration_ps", "occupancy_byte_ps", "occupancy_hi", "occupancy_lo",
                 "series",
                 "series_next_ps", "boundaries", "track_boundaries", "updates_seen")

    def __init__(self, series_points: int, track_boundaries: bool) -> None:
        self.preemptions = self.stalls = self.too_long = self.truncated = self.recomputed = 0
        self.migrations = self.peak = self.prefills = self.decodes = self.completed = 0
        self.migrated_bytes = self.occupancy_byte_ps = self.occupancy_hi = self.occupancy_lo = self.migration_ps = 0
        self.series = Series(series_points)
        self.series_next_ps = 0  # the series takes no sample before this time
        self.boundaries = []
        self.track_boundaries = track_boundaries
        self.updates_seen = -1

    @cython.overflowcheck(False)  # the low word wraps on purpose: its carries are counted
    def occupy(self, reserved_now: cython.longlong, dt: cython.longlong) -> None:
        """`reserved_now` bytes held for `dt` ps (neither negative: ValueError), added to the sum exactly.
        Compiled, in C integers: the product of the 32-bit halves of the two (each partial product
        below 2**64) goes into the 128-bit sum occupancy_hi x 2**64 + occupancy_lo with its carries,
        so no Python integer is made at each step (the high word goes to the Python sum once it
        reaches HI_FLUSH, far past any replay's); from source, into occupancy_byte_ps."""
        if reserved_now < 0 or dt < 0:
            raise ValueError(f"occupancy of {reserved_now} bytes for {dt} ps: neither may be negative")
        if not cython.compiled:
            self.occupancy_byte_ps += reserved_now * dt
            return
        r: cython.ulonglong = reserved_now
        d: cython.ulonglong = dt
        r_hi: cython.ulonglong = r >> 32
        r_lo: cython.ulonglong = r - (r_hi << 32)  # (no mask literal: a Python object to Cython)
        d_hi: cython.ulonglong = d >> 32
        d_lo: cython.ulonglong = d - (d_hi << 32)
        low: cython.ulonglong = r_lo * d_lo  # < 2**64
        cross1: cython.ulonglong = r_hi * d_lo  # < 2**63: r_hi < 2**31
        cross2: cython.ulonglong = r_lo * d_hi  # < 2**63: d_hi < 2**31
        add: cython.ulonglong
        total: cython.ulonglong = self.occupancy_lo + low
        carries: cython.ulonglong = total < low
        add = cross1 << 32  # its low 32 bits, in the upper half of the low word
        total += add
        carries += total < add
        add = cross2 << 32
        total += add
        carries += total < add
        self.occupancy_lo = total
        self.occupancy_hi += r_hi * d_hi + (cross1 >> 32) + (cross2 >> 32) + carries  # < 2**62 + 2**33 a call
        if self.occupancy_hi >= HI_FLUSH:  # past 2**126 in all: the high word to the Python sum, before it could wrap
            self.occupancy_byte_ps += self.occupancy_hi * TWO_64
            self.occupancy_hi = 0

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
        self.occupancy_byte_ps += self.occupancy_hi * TWO_64 + self.occupancy_lo  # Python integers
        self.occupancy_hi = self.occupancy_lo = 0
        own = {} if prefix is None else prefix.counters()
        return own | {"preemptions": self.preemptions, "stalls": self.stalls, "rejections": rejections,
                "rejected_prompt_too_long": self.too_long, "truncated": self.truncated,
                "recomputed_tokens": self.recomputed, "migrations": self.migrations,
                "migrated_bytes": self.migrated_bytes, "peak_concurrency": self.peak,
                "prefill_iterations": self.prefills, "decode_iterations": self.decodes,
                "occupancy_byte_ps": self.occupancy_byte_ps, "migration_ps": self.migration_ps,
                "end_ps": end_ps, "host_link_bytes": link.moved_bytes, "host_link_ps": link.link_ps,
                "link_bottleneck_ps": link.bottleneck_ps, "kv_pool_bytes": kv_pool_bytes}
