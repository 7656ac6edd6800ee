"""The replay's plot: pool occupancy, batch and queue over time per policy, ODMA's boundaries, and
an on-device replay's measured against modelled decode steps."""

from __future__ import annotations

from odmactl.render.tables import deployment


def write_replay_plot(doc: dict, path) -> None:
    """Pool occupancy, batch size and queue length over time per policy, ODMA's boundaries, and for
    an on-device replay the measured against the modelled decode step time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    has_bounds = any(r["series"]["bucket_boundaries"] for r in results.values())
    has_device = any("on_device" in r for r in results.values())
    labels = ["pool occupancy (reserved / pool)", "batch size", "queue length"]
    labels += ["bucket boundaries (KV tokens)"] if has_bounds else []
    labels += ["decode step (s): measured, modelled dashed"] if has_device else []
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
        axes[-1].set_xlabel("decode iteration")
    fig.suptitle(f"{deployment(doc)}: {doc['trace']['path']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def write_capacity_plot(doc: dict, path) -> None:
    """`capacity_figure` as a PNG file."""
    import matplotlib.pyplot as plt

    fig = capacity_figure(doc)
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def capacity_figure(doc: dict):
    """TTFT p99 and TPOT p99 against the offered rate per engine, one line per policy and tp (the
    bisection's probes), with the SLO's limits dashed (a matplotlib figure; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean_rate = doc["trace"]["mean_rate_per_s"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    policies = list(dict.fromkeys(row["policy"] for row in doc["rows"]))
    sizes = list(dict.fromkeys(row["tp"] for row in doc["rows"]))
    colors = plt.get_cmap("tab10")
    for row in doc["rows"]:  # a color per policy, a line style per tp
        probes = row["probes"]
        rates = [p["rate_scale"] * mean_rate for p in probes]
        style = ("-", "--", ":", "-.")[sizes.index(row["tp"]) % 4]
        for ax, key in zip(axes, ("ttft_p99", "tpot_p99")):
            ax.plot(rates, [p[key] for p in probes], marker=".", linestyle=style,
                    color=colors(policies.index(row["policy"]) % 10), label=f"{row['policy']} tp {row['tp']}")
    for ax, key, title in zip(axes, ("ttft_p99", "tpot_p99"), ("TTFT p99 (s)", "TPOT p99 (s)")):
        if key in doc["slo"]:
            ax.axhline(doc["slo"][key], color="black", linewidth=0.8, linestyle="--", label=f"SLO {key}")
        ax.set_yscale("log")
        ax.set_ylabel(title, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=2, handlelength=4)  # long enough to show dashes and dots
    axes[1].set_xscale("log")
    axes[1].set_xlabel("offered rate per engine (requests/s)")
    fig.suptitle(f"{doc['model']} on {doc['device']}: {doc['trace']['path']} (SLO {doc['slo_label']})", fontsize=9)
    fig.tight_layout()
    return fig

