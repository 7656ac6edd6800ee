"""The replay's plot: pool occupancy, batch and queue over time per policy, ODMA's boundaries, and
an on-device replay's measured against modelled decode steps."""

from __future__ import annotations

import math
from pathlib import Path

from odmactl.core.stops import uninterrupted
from odmactl.render.metrics import slo_latencies
from odmactl.render.tables import deployment


@uninterrupted
def write_replay_plot(doc: dict, path) -> None:
    """Pool occupancy, batch size and queue length over time per policy, ODMA's boundaries, and for
    an on-device replay the measured against the modelled step time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    has_bounds = any(r["series"]["bucket_boundaries"] for r in results.values())
    has_device = any("on_device" in r for r in results.values())
    labels = ["pool occupancy (reserved / pool)", "batch size", "queue length"]
    labels += ["bucket boundaries (KV tokens)"] if has_bounds else []
    labels += ["step (s, log): measured, modelled dashed"] if has_device else []
    fig = plt.figure(figsize=(10, 2.6 * len(labels)))
    over_time = len(labels) - (1 if has_device else 0)  # the panels that share the time axis
    axes = [fig.add_subplot(len(labels), 1, 1)]
    for j in range(1, len(labels)):
        axes.append(fig.add_subplot(len(labels), 1, j + 1, sharex=axes[0] if j < over_time else None))
    for policy, r in results.items():
        s = r["series"]
        first, = axes[0].step(s["time_s"], s["pool_occupancy"], where="post", label=policy)
        color = first.get_color()  # a policy keeps its color in every panel
        axes[1].step(s["time_s"], s["batch_size"], where="post", label=policy, color=color)
        axes[2].step(s["time_s"], s["queue_length"], where="post", label=policy, color=color)
        if has_bounds and s["bucket_boundaries"]:
            bounds = s["bucket_boundaries"]
            times = [b["time_s"] for b in bounds] + [max(s["time_s"][-1], bounds[-1]["time_s"])]
            rows = [b["boundaries_tokens"] for b in bounds] + [bounds[-1]["boundaries_tokens"]]  # held to the end
            count = max(len(row) for row in rows)
            for j in range(count):  # one legend entry a policy, however many boundaries
                values = [row[j] if j < len(row) else float("nan") for row in rows]
                axes[3].step(times, values, where="post", color=color, linewidth=0.8 if count > 8 else 1.2,
                             label=f"{policy} ({count} boundaries)" if j == 0 else None)
        if "on_device" in r:
            d = r["on_device"]["series"]
            axes[-1].plot(d["step"], d["measured_s"], linewidth=0.8, label=policy, color=color)
            axes[-1].plot(d["step"], d["modelled_s"], linewidth=0.8, linestyle="--", color=color)
    for j, (ax, label) in enumerate(zip(axes, labels)):
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
        if j < over_time - 1:
            ax.tick_params(labelbottom=False)
    axes[over_time - 1].set_xlabel("time (s)")
    if has_device:
        axes[-1].set_xlabel("iteration")
        axes[-1].set_yscale("log")  # prefill steps take 100x a decode step: on a linear axis the decodes lie flat
    fig.suptitle(f"{deployment(doc)}: {doc['trace']['path']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


@uninterrupted
def write_capacity_plot(doc: dict, path) -> None:
    """`capacity_figure` as a PNG file."""
    import matplotlib.pyplot as plt

    fig = capacity_figure(doc)
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def capacity_figure(doc: dict):
    """The latencies the SLO bounds (render/metrics.slo_latencies: TTFT p99 and TPOT p99 by default)
    against the offered rate per engine (the bisection's probes), a panel each, a column of panels
    per tp, a line per policy in a colour and style of its own; policies whose probes are the same
    are drawn once, named together; the SLO's limits dashed (a matplotlib figure; the caller closes
    it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    mean_rate = doc["trace"]["mean_rate_per_s"]
    sizes = list(dict.fromkeys(row["tp"] for row in doc["rows"]))
    policies = list(dict.fromkeys(row["policy"] for row in doc["rows"]))
    terms = slo_latencies(doc["slo"])
    fig, axes = plt.subplots(len(terms), len(sizes), figsize=(max(8.0, 4.2 * len(sizes)), 3.75 * len(terms)),
                             sharex="col", squeeze=False)
    colors = plt.get_cmap("tab10")
    styles = ("-", "--", "-.", ":")
    for column, tp in enumerate(sizes):
        curves: dict[tuple, list[str]] = {}  # identical probes -> the policies that share them
        for row in doc["rows"]:
            if row["tp"] == tp:
                key = tuple((p["rate_scale"], *(p.get(m) for m in terms)) for p in row["probes"])
                curves.setdefault(key, []).append(row["policy"])
        for key, names in curves.items():
            j = policies.index(names[0])
            rates = [point[0] * mean_rate for point in key]
            for ax, index in zip(axes[:, column], range(1, len(terms) + 1)):
                ax.plot(rates, [math.nan if point[index] is None else point[index] for point in key], marker=".",
                        linestyle=styles[j % 4],
                        color=colors(j % 10), label=" = ".join(names))
        xs = [point[0] * mean_rate for key in curves for point in key]
        span = max(xs) / min(xs) if xs and min(xs) > 0 else 1.0
        for ax, metric in zip(axes[:, column], terms):
            title = f"{metric.split('_')[0].upper()} {metric.split('_')[1]} (s)"  # in seconds, as the probes are
            if metric in doc["slo"]:
                ax.axhline(doc["slo"][metric], color="black", linewidth=0.8, linestyle="--", label=f"SLO {metric}")
            ax.set_yscale("log")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # a narrow log range labels its minor ticks over each other
            # labels at 1, 2 and 5 in a narrow range (a decade or two), at the decades in a wider one
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0,) if span > 100 else (1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.3g}"))
            ax.grid(alpha=0.3)
            ax.set_title(f"tp {tp}: {title}", fontsize=8)
            ax.legend(fontsize=6, loc="best", handlelength=3.5, framealpha=0.6)
        axes[-1, column].set_xlabel("offered rate per engine (requests/s)", fontsize=8)
    fig.suptitle(f"{doc['model']} on {doc['device']}: {Path(doc['trace']['path']).name}\n"
                 f"SLO {doc['slo_label']}; arrivals: {doc.get('arrivals', {}).get('process', 'trace')}", fontsize=9)
    fig.tight_layout()
    return fig

