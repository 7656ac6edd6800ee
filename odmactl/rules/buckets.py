"""Quantile bucket boundaries over KV tokens, and the sliding-window refit that keeps them current."""

from __future__ import annotations

import math
from bisect import bisect_left

import numpy as np

LEVEL_SHAPES = ("equal", "tail")  # named quantile levels (`shaped_levels`)


def bucket_levels(num_buckets: int, levels: tuple[float, ...] | None = None, top: float = 1.0) -> tuple[float, ...]:
    """The quantile levels of B buckets: `levels` when given (strictly increasing in (0, 1]), else
    top * i/B for i = 1..B, the levels that equalise the regular buckets' occupancy (ODMA eq. 2)
    below the `top` quantile; requests past the top bucket go to ODMA's large bucket."""
    if levels:
        return tuple(float(x) for x in levels)
    return tuple(top * i / num_buckets for i in range(1, num_buckets + 1))


def shaped_levels(num_buckets: int, shape: str, top: float = 1.0) -> tuple[float, ...]:
    """The levels a shape names, below the `top` quantile: "equal" is top * i/B (ODMA eq. 2,
    equal occupancy); "tail" is top * (1 - (1 - i/B)^2), finer buckets in the long tail, where
    rounding a request up costs the most (rounded to 6 places)."""
    if shape == "equal":
        return bucket_levels(num_buckets, top=top)
    if shape == "tail":
        return tuple(round(top * (1.0 - (1.0 - level) ** 2), 6) for level in bucket_levels(num_buckets))
    raise ValueError(f"unknown level shape {shape!r} (known: {', '.join(LEVEL_SHAPES)})")


def quantile_boundaries(kv_tokens: np.ndarray, num_buckets: int, *, granularity_tokens: int = 16,
                        max_tokens: int | None = None, levels: tuple[float, ...] | None = None) -> tuple[int, ...]:
    """Bucket upper bounds b_i = Q_{l_i}(L) at `bucket_levels(num_buckets, levels)` (by default
    l_i = i/B, ODMA eq. 2), rounded up to `granularity_tokens`.

    Quantiles use the "higher" rule, so every boundary is a length that occurred (at level 1 the last
    one is the window's maximum); rounding can merge neighbours, so fewer than B boundaries may come back.
    Clipped to `max_tokens` when given.
    """
    rounded = rounded_quantiles(kv_tokens, bucket_levels(num_buckets, levels), granularity_tokens, max_tokens)
    return tuple(int(b) for b in np.unique(rounded))


def rounded_quantiles(kv_tokens: np.ndarray, levels: tuple[float, ...], granularity_tokens: int = 16,
                      max_tokens: int | None = None) -> np.ndarray:
    """The "higher" quantiles at `levels`, rounded up to `granularity_tokens` and clipped to
    `max_tokens`: one value per level, merged neighbours repeated (`quantile_boundaries` drops them)."""
    values = np.asarray(kv_tokens)
    assert values.size > 0 and len(levels) >= 1 and granularity_tokens >= 1
    q = np.quantile(values, np.asarray(levels), method="higher")
    rounded = -(-q.astype(np.int64) // granularity_tokens) * granularity_tokens
    return rounded if max_tokens is None else np.minimum(rounded, max_tokens)


def bucket_of(boundaries_tokens: tuple[int, ...], need_tokens: int) -> int | None:
    """Index of the smallest boundary >= need_tokens, or None when it exceeds the last one."""
    i = bisect_left(boundaries_tokens, need_tokens)
    return i if i < len(boundaries_tokens) else None


class SlidingWindowRefit:
    """Realized KV lengths of the last `window` requests, kept as an online histogram; every
    `refresh_every` observations it proposes new boundaries from them (ODMA: window 10,000,
    refresh 1,000, B = 4).

    The histogram counts lengths per granule: bin j holds lengths in ((j-1)*g, j*g], g =
    `granularity_tokens`. Because boundaries are rounded up to whole granules anyway, the "higher"
    quantile read off the cumulative counts is exactly `quantile_boundaries` of the window's values,
    at a cost independent of the window size. Invariants: `_ring[:min(seen, window)]` holds the bins
    of the most recent observations, the newest at `(seen - 1) % window`; `_counts[j]` is how many
    entries of that part of the ring equal j; `seen` counts every observation ever made.
    """

    def __init__(self, *, window: int = 10_000, refresh_every: int = 1_000, num_buckets: int = 4,
                 granularity_tokens: int = 16, max_tokens: int | None = None,
                 levels: tuple[float, ...] | None = None) -> None:
        assert window >= 1 and refresh_every >= 1 and granularity_tokens >= 1
        self.window = window
        self.refresh_every = refresh_every
        self.num_buckets = num_buckets
        self.levels = bucket_levels(num_buckets, levels)
        self.granularity_tokens = granularity_tokens
        self.max_tokens = max_tokens
        self._ring = np.zeros(window, dtype=np.int64)
        self._counts = np.zeros(-(-(max_tokens or 4096) // granularity_tokens) + 1, dtype=np.int64)
        self.seen = 0
        self.refits = 0

    def observe(self, kv_tokens: int) -> tuple[int, ...] | None:
        """Record one realized length; new boundaries when a refresh falls due, else None."""
        return self.observe_many([kv_tokens])

    def observe_many(self, kv_tokens: list[int] | np.ndarray) -> tuple[int, ...] | None:
        """Record realized lengths in order. When refreshes fall due among them, the boundaries of
        the last one (computed from the window as it stood then), else None: the same as calling
        `observe` on each value and keeping the last answer."""
        values = np.asarray(kv_tokens, dtype=np.int64)
        if values.size and values.min() < 1:
            raise ValueError(f"KV lengths must be >= 1, got {int(values.min())}")
        bins = (values + (self.granularity_tokens - 1)) // self.granularity_tokens
        if bins.size and bins.max() >= self._counts.size:
            grown = np.zeros(int(bins.max()) + 1, dtype=np.int64)
            grown[: self._counts.size] = self._counts
            self._counts = grown
        fresh = None
        while bins.size:
            due_in = self.refresh_every - self.seen % self.refresh_every
            chunk, bins = bins[:due_in], bins[due_in:]
            self._write(chunk)
            if self.seen % self.refresh_every == 0:
                self.refits += 1
                fresh = self.boundaries()
        return fresh

    def boundaries(self) -> tuple[int, ...]:
        """`quantile_boundaries` of the lengths in the window, from the histogram (ranks and the
        final rounding in plain Python: with B values, numpy's per-call overhead would dominate)."""
        n = min(self.seen, self.window)
        assert n > 0
        # numpy's "higher" rule, computed as numpy does (level * (n - 1) in floats, then ceil), 1-based
        ranks = [math.ceil(level * (n - 1)) + 1 for level in self.levels]
        cut = np.searchsorted(np.cumsum(self._counts), ranks).tolist()
        out: list[int] = []
        for granules in cut:
            tokens = granules * self.granularity_tokens
            if self.max_tokens is not None and tokens > self.max_tokens:
                tokens = self.max_tokens
            if not out or tokens > out[-1]:
                out.append(tokens)
        return tuple(out)

    def _write(self, bins: np.ndarray) -> None:
        if bins.size > self.window:
            self._forget_overwritten(self.window)
            self.seen += bins.size - self.window
            bins = bins[-self.window:]
        else:
            self._forget_overwritten(bins.size)
        pos = self.seen % self.window
        if pos + bins.size <= self.window:
            self._ring[pos:pos + bins.size] = bins
        else:
            first = self.window - pos
            self._ring[pos:] = bins[:first]
            self._ring[: bins.size - first] = bins[first:]
        self._counts += np.bincount(bins, minlength=self._counts.size)
        self.seen += bins.size

    def _forget_overwritten(self, n: int) -> None:
        """Remove from the counts the ring entries the next `n` writes will overwrite."""
        filled = min(self.seen, self.window)
        drop = max(0, filled + n - self.window)
        if not drop:
            return
        if filled < self.window:  # the write runs past the end of a ring not yet full: it wraps onto [0, drop)
            old = self._ring[:drop]
        else:
            pos = self.seen % self.window
            if pos + drop <= self.window:
                old = self._ring[pos:pos + drop]
            else:
                old = np.concatenate([self._ring[pos:], self._ring[: pos + drop - self.window]])
        self._counts -= np.bincount(old, minlength=self._counts.size)
