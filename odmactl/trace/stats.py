"""Trace statistics: counts, arrival rate, length quantiles, breakdowns and drift over time windows.

Quantiles use linear interpolation (numpy's default), so they match `numpy.quantile`.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from odmactl.core.errors import TraceError
from odmactl.trace.prefix import prefix_keys, reuse

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
BREAKDOWN_LIMIT = 1000
MAX_WINDOWS = 100_000  # drift windows in one report (the JSON holds one row each)
BUSIEST_WINDOW_S = 600.0  # the busiest 10 minutes: stats reports it, capacity sizes for it by default


def busiest_rate(arrival_s: np.ndarray, window_s: float = BUSIEST_WINDOW_S) -> float:
    """The busiest `window_s` of a trace in requests/s: the most arrivals in any window [t, t +
    window_s) that starts at an arrival (sliding, not fixed bins, which split a burst in two), over
    window_s; the mean rate over the trace's span when it is shorter than the window; 0 for a
    trace of one request, or of requests all at once."""
    span = float(arrival_s[-1] - arrival_s[0]) if arrival_s.size else 0.0
    if arrival_s.size < 2 or span <= 0:
        return 0.0
    if span < window_s:
        return (arrival_s.size - 1) / span
    ends = np.searchsorted(arrival_s, arrival_s + window_s, side="left")  # arrivals in [t_i, t_i + window)
    return float((ends - np.arange(arrival_s.size)).max()) / window_s


def _length_exprs(column: str, prefix: str = "") -> list[pl.Expr]:
    c = pl.col(column)
    exprs = [c.mean().alias(f"{prefix}mean")]
    exprs += [c.quantile(q, interpolation="linear").cast(pl.Float64).alias(f"{prefix}{name}") for name, q in QUANTILES.items()]
    exprs.append(c.max().cast(pl.Float64).alias(f"{prefix}max"))
    return exprs


def _lengths(frame: pl.DataFrame, column: str) -> dict[str, float]:
    return frame.select(_length_exprs(column)).row(0, named=True)


def _breakdown(frame: pl.DataFrame, key: str) -> list[dict[str, object]]:
    if frame[key].null_count() == frame.height:
        return []
    total = frame.height
    grouped = (
        frame.group_by(pl.col(key).fill_null("(none)"))
        .agg(
            pl.len().alias("requests"),
            pl.col("prompt_tokens").mean().alias("prompt_mean"),
            *_length_exprs("output_tokens", "output_"),
        )
        .sort(["requests", key], descending=[True, False])
        .head(BREAKDOWN_LIMIT)
    )
    return [{**row, "share": row["requests"] / total} for row in grouped.iter_rows(named=True)]


def _drift(frame: pl.DataFrame, window_s: float) -> list[dict[str, object]]:
    windows = (
        frame.with_columns((pl.col("arrival_s") // window_s).cast(pl.Int64).alias("window"))
        .group_by("window")
        .agg(
            pl.len().alias("requests"),
            *_length_exprs("prompt_tokens", "prompt_"),
            *_length_exprs("output_tokens", "output_"),
        )
        .sort("window")
    )
    last_s = float(frame["arrival_s"].max())
    rows = []
    for row in windows.iter_rows(named=True):
        start = row.pop("window") * window_s
        end = min(start + window_s, last_s)  # the trace ends inside its last window: rate over the part it covers
        rate = row["requests"] / (end - start) if end > start else None
        rows.append({"start_s": start, "end_s": end, "rate_per_s": rate, **row})
    return rows


def trace_stats(frame: pl.DataFrame, window_s: float) -> dict[str, object]:
    """Everything `odmactl stats` reports, as plain JSON-ready values."""
    if not (math.isfinite(window_s) and window_s > 0):
        raise TraceError(f"--window must be a positive number of seconds, got {window_s}")
    n = frame.height
    duration_s = float(frame["arrival_s"].max() - frame["arrival_s"].min()) if n else 0.0
    if duration_s / window_s > MAX_WINDOWS:
        raise TraceError(f"--window {window_s:g} s splits the trace's {duration_s:,.1f} s into more than "
                         f"{MAX_WINDOWS:,} drift windows", hint=f"give a window of at least {duration_s / MAX_WINDOWS:.3g} s")
    keys = prefix_keys(frame)
    return {
        "requests": n,
        "duration_s": duration_s,
        "arrival_rate_per_s": n / duration_s if duration_s > 0 else None,
        "prompt_tokens": _lengths(frame, "prompt_tokens"),
        "output_tokens": _lengths(frame, "output_tokens"),
        "total_prompt_tokens": int(frame["prompt_tokens"].cast(pl.Int64).sum()),
        "total_output_tokens": int(frame["output_tokens"].cast(pl.Int64).sum()),
        "by_model": _breakdown(frame, "model"),
        "by_tenant": _breakdown(frame, "tenant"),
        "window_s": window_s,
        "drift": _drift(frame, window_s) if duration_s > 0 else [],
        # capacity's default target, by the same rule
        "busiest_10min_rate_per_s": busiest_rate(frame["arrival_s"].to_numpy().astype(np.float64)),
        # the prompts' prefix reuse with an unbounded cache (trace/prefix.py), where the trace has hashes
        "prefix_reuse": None if keys is None else reuse(keys, frame["prompt_tokens"].to_numpy()),
    }
