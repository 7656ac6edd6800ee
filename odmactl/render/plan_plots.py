"""The plots of `odmactl plan`'s HTML report (render/html.py's `write_plan_report`), drawn from the plan
document (`odmactl plan --json`).

- `pareto_figure`: KV utilization against overflow rate, every candidate's cheap estimate and the
  replayed ones measured, with the replayed Pareto front, the recommendation and the limit. The x
  axis fits the points and the limit: logarithmic, or symlog when some points are at 0 (linear
  below the smallest positive decade, so the zeros stand clear of the spine). Beside it the
  replayed candidates zoomed on a linear axis that fits them (they are a clump on the wide axis),
  with the limit when it is near them. When every point is at 0 (the oracle predictor never
  outgrows its block) the axis spans 0 to past the limit, no zoom, and the title says so: there is
  no trade-off. The legend is below the axes, never over the points.
- `boundaries_figure`: the held-out KV-length histogram, and under it a rug (one short tick a
  boundary, a row a set): ODMA's boundaries as recommended (the start for serving), those in force
  after the last refit of the held-out replay when they changed, and S3's equal-width capacities.
  ODMA's B buckets give fewer distinct boundaries where quantiles round to the same 16-token step;
  a fine-bucket config keeps 60 or more, which full-height lines turned into a solid block. The
  x axis is linear: plan's histogram has 80 equal bins from 0 to max_model_len, so its lengths
  span less than two decades, and a log axis would only squeeze the long tail's bins.
- `occupancy_figure`: pool occupancy over time, a panel per policy on shared axes (y 0..1), every
  sample thin and a centred moving mean over a stated window thick.

Each `*_figure` returns a matplotlib figure (the caller closes it); each `*_png` the figure as a
base64 PNG for an <img> tag, closed.
"""

from __future__ import annotations

import base64
import io
import math

import numpy as np

from odmactl.rules.s3 import s3_capacities

WIDTH_IN = 9.0  # the report's column is 960 px; at 100 dpi the plots fill it without scaling up
DPI = 100


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_base64(fig) -> str:
    """`fig` as a base64 PNG (the figures lay themselves out: constrained layout); closes it."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _percent(x: float, _=None) -> str:
    if x == 0:
        return "0"
    return f"{x * 100:.3g}%"


# --- Pareto ---------------------------------------------------------------------------------------

def pareto_axis(xs: np.ndarray, limit: float) -> dict:
    """The x axis that fits the overflow rates `xs` and the limit: {"scale", "linthresh" (symlog),
    "xlim", "degenerate" (every point at 0)}."""
    xs = np.asarray(xs, dtype=float)
    positive = xs[xs > 0]
    top = max(float(xs.max()) if xs.size else 0.0, limit)
    if positive.size == 0:  # every point at 0: linear around 0, the limit a decade or so out
        linthresh = 10.0 ** (math.floor(math.log10(limit)) - 1) if limit > 0 else 1e-3
        return {"scale": "symlog", "linthresh": linthresh, "xlim": (-0.5 * linthresh, max(top, linthresh) * 2.0),
                "degenerate": True}
    smallest = float(positive.min())
    if limit > 0:
        smallest = min(smallest, limit)
    if positive.size == xs.size:  # no zeros: plain log, a margin either side
        return {"scale": "log", "linthresh": None, "xlim": (smallest / 1.5, top * 1.5), "degenerate": False}
    linthresh = 10.0 ** math.floor(math.log10(smallest))
    return {"scale": "symlog", "linthresh": linthresh, "xlim": (-0.5 * linthresh, top * 1.5), "degenerate": False}


def _front(xs: np.ndarray, ys: np.ndarray) -> list[int]:
    """The non-dominated points: no other has a lower overflow rate and a higher utilization."""
    order = np.lexsort((-ys, xs))
    front, best = [], -math.inf
    for i in order:
        if ys[i] > best:
            front.append(int(i))
            best = ys[i]
    return front


def zoom_xlim(rx: np.ndarray, limit: float, axis: dict) -> tuple[float, float] | None:
    """The x range of the zoomed panel of the replayed candidates: theirs, with the limit when it is
    within a factor of 2 of them, padded; None (no panel) when every point is at 0 or fewer than two
    were replayed."""
    if axis["degenerate"] or rx.size < 2:
        return None
    lo, hi = float(rx.min()), float(rx.max())
    if hi > 0 and lo / 2 <= limit <= hi * 2:
        lo, hi = min(lo, limit), max(hi, limit)
    span = hi - lo if hi > lo else max(abs(hi), axis["linthresh"] or 1e-4) * 0.2
    return lo - 0.12 * span, hi + 0.12 * span


def _replays(ax, rx, ry, chosen, chosen_label, count) -> None:
    """The replayed candidates, their Pareto front and the recommendation on `ax` (named in the
    legend when `chosen_label` is given)."""
    named = chosen_label is not None
    ax.scatter(rx, ry, s=28, color="tab:blue", zorder=3,
               label=f"replayed on the search part ({count})" if named else "_replayed")
    if rx.size:
        front = _front(rx, ry)
        ax.step(rx[front], ry[front], where="post", color="tab:blue", linewidth=1, zorder=3,
                label="Pareto front of the replayed" if named else "_front")
    if chosen is not None:
        ax.scatter([rx[chosen]], [ry[chosen]], s=180, marker="*", color="tab:red", edgecolors="white", linewidths=0.6,
                   zorder=5, label=f"recommended: {chosen_label}" if named else "_recommended")


def pareto_figure(doc: dict):
    plt = _pyplot()
    from matplotlib.collections import PathCollection
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    est = doc["search"]["estimates"]
    rep = doc["search"]["replays"]
    ex = np.array([e["estimate"]["overflow_rate"] for e in est], dtype=float)
    ey = np.array([e["estimate"]["kv_utilization"] for e in est], dtype=float)
    rx = np.array([r["measured"]["overflow_rate"] for r in rep], dtype=float)
    ry = np.array([r["measured"]["kv_utilization"] for r in rep], dtype=float)
    limit = float(doc["max_overflow_rate"])
    axis = pareto_axis(np.concatenate([ex, rx]), limit)

    chosen = next((i for i, r in enumerate(rep) if r["label"] == doc["chosen"]["label"]), None)
    zoom = zoom_xlim(rx, limit, axis)
    if zoom is None:
        fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.8), layout="constrained")
        near = None
    else:
        fig, (ax, near) = plt.subplots(1, 2, figsize=(WIDTH_IN, 4.8), layout="constrained",
                                       gridspec_kw={"width_ratios": [3, 1.15]})
    ax.scatter(ex, ey, s=6, color="0.65", alpha=0.5, linewidths=0,
               label=f"every candidate, cheap estimate ({len(est):,})")
    _replays(ax, rx, ry, chosen, doc["chosen"]["label"], len(rep))
    if near is not None:  # the replayed, on a linear axis that fits them (and the limit when it is near)
        _replays(near, rx, ry, chosen, None, len(rep))
        near.set_xlim(*zoom)
        if zoom[0] <= limit <= zoom[1]:
            near.axvline(limit, color="tab:red", linestyle=":", linewidth=1.2)
        near.xaxis.set_major_formatter(FuncFormatter(_percent))
        near.xaxis.set_major_locator(MaxNLocator(3))
        lo, hi = float(ry.min()), float(ry.max())
        pad = 0.1 * (hi - lo) if hi > lo else 0.01
        near.set_ylim(lo - pad, hi + pad)
        near.set_title(f"the {len(rep)} replayed, zoomed (linear)", fontsize=8)
        near.set_xlabel("overflow rate", fontsize=8)
        near.tick_params(labelsize=7)
        near.grid(alpha=0.3)
    if axis["scale"] == "symlog":
        ax.set_xscale("symlog", linthresh=axis["linthresh"], linscale=1.0)
    else:
        ax.set_xscale("log")
    ax.set_xlim(*axis["xlim"])
    if axis["xlim"][0] <= limit <= axis["xlim"][1]:
        ax.axvline(limit, color="tab:red", linestyle=":", linewidth=1.2,
                   label=f"overflow-rate limit ({_percent(limit)})")
    ys = np.concatenate([ey, ry])
    if ys.size:
        lo, hi = float(ys.min()), float(ys.max())
        pad = 0.06 * (hi - lo) if hi > lo else 0.02
        ax.set_ylim(lo - pad, hi + pad)
    ax.xaxis.set_major_formatter(FuncFormatter(_percent))
    ax.set_xlabel("overflow rate ((migrations + preemptions) per request)"
                  + (", symlog: linear below " + _percent(axis["linthresh"]) if axis["scale"] == "symlog" else ", log"))
    ax.set_ylabel("KV utilization (used / reserved)")
    ax.grid(alpha=0.3)
    if axis["degenerate"]:
        title = (f"All {len(est):,} candidates and the {len(rep)} replayed at overflow rate 0: no trade-off, the limit "
                 f"({_percent(limit)}) does not bind; the pick is the best by {doc['objective']}")
    else:
        zeros = int((np.concatenate([ex, rx]) == 0).sum())
        pick = "the best by " + doc["objective"] + " within the limits" if doc.get("constraints_met_on_search", True) \
            else "none met every limit with the margin for noise: the closest"
        title = (f"{len(est):,} candidates, {len(rep)} replayed; the pick: {pick}"
                 + (f" ({zeros:,} points at 0)" if zeros else ""))
    fig.suptitle(title, fontsize=9)
    legend = fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    for handle in legend.legend_handles:  # the estimates' dots as large in the legend as the replays'
        if isinstance(handle, PathCollection) and handle.get_sizes()[0] < 28:
            handle.set_sizes([28])
            handle.set_alpha(1.0)
    return fig


def pareto_png(doc: dict) -> str:
    return png_base64(pareto_figure(doc))


# --- boundaries -----------------------------------------------------------------------------------

def boundary_rows(doc: dict) -> list[dict]:
    """The rug's rows, top to bottom: {"key", "label", "tokens", "color"}. ODMA's recommended
    boundaries; those after the last refit of the held-out replay, when the refits changed them;
    S3's capacities, when s3 was validated."""
    odma = doc["validation"].get("odma")
    rows = []
    if odma is not None:
        start = [int(b) for b in odma["config"].get("boundaries_tokens") or []]
        rows.append({"key": "odma_start", "tokens": start, "color": "tab:red",
                     "label": f"ODMA recommended:\n{len(start)} boundaries"})
        series = odma.get("series", {})
        changes = series.get("bucket_boundaries") or []
        last = [int(b) for b in changes[-1]["boundaries_tokens"]] if changes else start
        if len(changes) > 1 and last != start:
            t0 = series["time_s"][0] if series.get("time_s") else changes[0]["time_s"]
            rows.append({"key": "odma_last", "tokens": last, "color": "tab:purple",
                         "label": f"ODMA after the last\nrefit ({changes[-1]['time_s'] - t0:,.0f} s): {len(last)}"})
    s3 = doc["validation"].get("s3")
    if s3 is not None:
        caps = list(s3_capacities(doc["max_model_len"], s3["config"]["s3_num_buckets"]))
        rows.append({"key": "s3", "tokens": caps, "color": "tab:green",
                     "label": f"S3 equal-width\nbuckets: {len(caps)}"})
    return rows


def rug_title(doc: dict) -> str:
    """What the rug shows, and why ODMA has fewer boundaries than buckets when it does."""
    odma = doc["validation"].get("odma")
    said = "One tick a bucket boundary (upper bound)"
    if odma is None:
        return said
    config = odma["config"]
    count, buckets = len(config.get("boundaries_tokens") or []), config.get("num_buckets")
    if buckets and count < buckets:
        said += (f"; ODMA's {buckets} buckets give {count} distinct boundaries\n(quantiles that round up to one "
                 f"{config.get('granularity_tokens', 16)}-token step merge)")
    if config.get("refit"):
        changes = max(len(odma.get("series", {}).get("bucket_boundaries") or []) - 1, 0)
        said += f"; the refit changed them {'once' if changes == 1 else f'{changes} times'} on the held-out part"
    return said


FAINT_LINES_AT_MOST = 16  # this few recommended boundaries are also drawn faintly behind the bars


def boundaries_figure(doc: dict):
    plt = _pyplot()

    rows = boundary_rows(doc)
    hist = doc["holdout_histogram"]
    edges = np.asarray(hist["edges_tokens"], dtype=float)
    counts = np.asarray(hist["counts"])
    fig, (ax, rug) = plt.subplots(2, 1, figsize=(WIDTH_IN, 4.2 + 0.45 * len(rows)), sharex=True, layout="constrained",
                                  gridspec_kw={"height_ratios": [3.2, 0.35 + 0.45 * max(len(rows), 1)]})
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="0.6", edgecolor="white", linewidth=0.3,
           zorder=2)
    start = next((r for r in rows if r["key"] == "odma_start"), None)
    if start is not None and 0 < len(start["tokens"]) <= FAINT_LINES_AT_MOST:
        for b in start["tokens"]:
            ax.axvline(b, color=start["color"], alpha=0.3, linewidth=0.8, zorder=1)
    ax.set_ylabel("held-out requests")
    ax.grid(axis="y", alpha=0.3)
    ax.set_xlim(0, max(float(edges[-1]), *(max(r["tokens"], default=0) for r in rows)))
    ax.set_title(f"Held-out KV lengths (prompt + output): {int(counts.sum()):,} requests, bins of "
                 f"{edges[1] - edges[0]:,.0f} tokens", fontsize=9)
    rug.set_title(rug_title(doc), fontsize=8)
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        rug.vlines(row["tokens"], y - 0.38, y + 0.38, color=row["color"], linewidth=0.8, label=row["key"])
    rug.set_yticks(range(len(rows)), [r["label"] for r in reversed(rows)], fontsize=7)
    for tick, row in zip(rug.get_yticklabels(), reversed(rows)):
        tick.set_color(row["color"])
    rug.set_ylim(-0.6, len(rows) - 0.4)
    rug.tick_params(axis="y", length=0)
    rug.grid(axis="x", alpha=0.3)
    rug.set_xlabel("KV tokens (S3's capacities are output tokens, reserved on top of the prompt)")
    return fig


def boundaries_png(doc: dict) -> str:
    return png_base64(boundaries_figure(doc))


# --- occupancy ------------------------------------------------------------------------------------

NICE_WINDOWS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)


def smoothing_window(span_s: float) -> float:
    """The moving mean's window: the longest round one within a 40th of the longest replay."""
    fitting = [w for w in NICE_WINDOWS_S if w <= span_s / 40]
    return fitting[-1] if fitting else NICE_WINDOWS_S[0]


def moving_mean(times: np.ndarray, values: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The step series (a value holds until the next sample) averaged over a centred window of
    `window_s` on a grid of a tenth of it: time-weighted, not per sample."""
    step = window_s / 10
    grid = np.arange(times[0], times[-1] + step / 2, step)
    held = values[np.clip(np.searchsorted(times, grid, side="right") - 1, 0, values.size - 1)]
    kernel = np.ones(10)
    total = np.convolve(held, kernel, mode="same")
    n = np.convolve(np.ones_like(held), kernel, mode="same")
    return grid, total / n


def occupancy_figure(doc: dict):
    plt = _pyplot()

    validation = doc["validation"]
    names = list(validation)
    spans = [s["time_s"][-1] - s["time_s"][0] for s in (validation[n]["series"] for n in names) if s["time_s"]]
    window = smoothing_window(max(spans, default=0.0))
    tops = [max(validation[n]["series"]["pool_occupancy"], default=0.0) for n in names]
    top = max(1.0, *tops) if tops else 1.0
    fig, axes = plt.subplots(len(names), 1, figsize=(WIDTH_IN, 0.9 + 1.15 * len(names)), sharex=True, sharey=True,
                             layout="constrained", squeeze=False)
    axes = axes[:, 0]
    colors = plt.get_cmap("tab10")
    for j, (ax, name) in enumerate(zip(axes, names)):
        s = validation[name]["series"]
        color = colors(j % 10)
        times = np.asarray(s["time_s"], dtype=float)
        values = np.asarray(s["pool_occupancy"], dtype=float)
        mean = validation[name].get("metrics", {}).get("pool_occupancy")
        if times.size:
            times = times - times[0]  # from each replay's first point: one axis for all
            ax.step(times, values, where="post", color=color, alpha=0.3, linewidth=0.6)
            if times.size >= 3 and times[-1] > window:
                t, m = moving_mean(times, values, window)
                ax.plot(t, m, color=color, linewidth=1.6)
        else:
            ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center", fontsize=8)
        label = name + ("" if mean is None else f"\nmean {mean:.0%}")
        label += f"\nto {times[-1]:,.0f} s" if times.size else ""
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8, color=color)
        ax.grid(alpha=0.3)
        ax.set_yticks([0, 0.5, 1])
    axes[0].set_ylim(0, top * 1.02)
    axes[0].set_xlim(left=0)
    axes[-1].set_xlabel("time since the replay's first sample on the held-out part (s)")
    axes[0].set_title(f"Pool occupancy (reserved / pool), a panel per policy: thin every sample, thick the mean over "
                      f"a centred {window:g} s window", fontsize=9)
    return fig


def occupancy_png(doc: dict) -> str:
    return png_base64(occupancy_figure(doc))
