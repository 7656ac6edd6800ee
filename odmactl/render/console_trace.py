"""Console output of ingest, stats and fit: rich tables for people."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from odmactl.render.tables import narrow_table


def format_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_ingest(console: Console, summary: dict) -> None:
    table = Table(title=escape(f"ingested -> {summary['out']}"), title_justify="left")
    for col in ("source", "format", "rows", "excluded", "token counts"):
        table.add_column(col, overflow="fold")
    for s in summary["sources"]:
        excluded = "; ".join(f"{v:,} {k}" for k, v in s["excluded"].items()) or "-"
        table.add_row(escape(s["path"]), s["format"], format_value(s["rows"]), escape(excluded), escape(s["token_source"]))
    console.print(table)
    console.print(
        f"{summary['requests']:,} requests over {summary['duration_s']:,.1f} s; "
        f"prompt tokens {summary['total_prompt_tokens']:,}, output tokens {summary['total_output_tokens']:,}"
    )
    console.print(escape(f"arrivals: {summary['arrivals']}"))
    if summary["moved_rows"]:
        console.print(f"[yellow]{summary['moved_rows']:,} rows arrived out of order and were moved when sorting by arrival[/]")
    for s in summary["sources"]:
        for note in s["notes"]:
            console.print(escape(f"note ({s['path']}): {note}"))


def _length_table(stats: dict) -> Table:
    table = Table(title="lengths (tokens)", title_justify="left")
    table.add_column("")
    for col in ("mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right")
    for key in ("prompt_tokens", "output_tokens"):
        table.add_row(key, *(format_value(stats[key][c]) for c in ("mean", "p50", "p90", "p99", "max")))
    return table


# two-line headers: the numbers stay narrow and the names get the width
BREAKDOWN_COLUMNS = {"requests": "requests", "share": "share", "prompt_mean": "prompt\nmean",
                     "output_mean": "output\nmean", "output_p50": "output\np50", "output_p99": "output\np99"}


def _breakdown_table(title: str, rows: list[dict], key: str, limit: int = 20) -> Table:
    cells = [[escape(str(r[key]))] + [f"{r[k]:.1%}" if k == "share" else format_value(r[k]) for k in BREAKDOWN_COLUMNS]
             for r in rows[:limit]]
    return narrow_table(f"{title} ({len(rows)} distinct; top {min(limit, len(rows))})",
                         tuple(BREAKDOWN_COLUMNS.values()), cells, key=key)


DRIFT_COLUMNS = {"start_s": "start s", "requests": "requests", "rate_per_s": "req/s", "prompt_p50": "prompt p50",
                 "prompt_p99": "prompt p99", "output_mean": "output mean", "output_p50": "output p50",
                 "output_p90": "output p90", "output_p99": "output p99"}


def _drift_table(stats: dict, limit: int = 48) -> Table:
    rows = stats["drift"]
    title = f"drift per {stats['window_s']:g} s window ({len(rows)} windows" + \
        (f", first {limit}" if len(rows) > limit else "") + ")"
    return narrow_table(title, tuple(DRIFT_COLUMNS.values()), [[format_value(r[k]) for k in DRIFT_COLUMNS]
                                                                for r in rows[:limit]])


def render_stats(console: Console, path: str, stats: dict) -> None:
    rate = stats["arrival_rate_per_s"]
    console.print(f"[bold]{escape(path)}[/]: {stats['requests']:,} requests over {stats['duration_s']:,.1f} s"
                  + (f" ({rate:,.2f} req/s)" if rate else " (all at t=0)"))
    console.print(f"total prompt tokens {stats['total_prompt_tokens']:,}, output tokens {stats['total_output_tokens']:,}")
    if rate and stats["duration_s"] >= 600:
        console.print(f"busiest 10 minutes: {stats['busiest_10min_rate_per_s']:,.3g} req/s (a window sliding over the "
                      "arrivals; capacity's default target)", highlight=False)
    elif rate:
        console.print(f"shorter than 10 minutes: capacity's default target is its rate over the gaps, "
                      f"{stats['busiest_10min_rate_per_s']:,.3g} req/s ((requests - 1) / span)", highlight=False)
    console.print(_length_table(stats))
    reuse = stats.get("prefix_reuse")
    if reuse is not None:
        console.print(f"prefix reuse (unbounded cache, {reuse['hash_block_tokens']}-token blocks): "
                      f"{reuse['reuse_rate']:.1%} of prompt tokens ({reuse['reused_tokens']:,} of "
                      f"{reuse['prompt_tokens']:,}) repeat an earlier prompt's prefix; "
                      f"{reuse['distinct_blocks']:,} distinct blocks")
    if stats["by_model"]:
        console.print(_breakdown_table("by model", stats["by_model"], "model"))
    if stats["by_tenant"]:
        console.print(_breakdown_table("by tenant", stats["by_tenant"], "tenant"))
    if stats["drift"]:
        console.print(_drift_table(stats))


CONSTANT_NOTE = ("constant: a predictor that always names the {mode_of}'s most common bucket (fitted bucket "
                 "{bucket}, S3 bucket {bucket_s3}); it ranks nothing, so its kendall_tau is undefined (n/a)")


def _figure(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def render_fit(console: Console, out_dir: str, summary: dict, seconds: float) -> None:
    ev = summary["evaluation"]
    split = summary["split"]
    seeds = summary.get("over_seeds")
    many = seeds is not None and seeds["count"] > 1
    epochs = summary["training"]["epochs"]
    trained = (f"{split['train_rows']:,} rows ({epochs} epochs at seed {split['seed']}; {seeds['count']} fits in "
               f"{seconds:,.1f} s)" if many else f"{split['train_rows']:,} rows in {seconds:,.1f} s ({epochs} epochs)")
    console.print(escape(f"predictor ({summary['family']}, {summary['mode']} heads) -> {out_dir}: trained on "
                         f"{trained}; held out {split['test_rows']:,} rows by {split['by']}"))
    table = Table(title="held-out evaluation" + (f" (seed {split['seed']}: the artifact's fit)" if many else ""),
                  title_justify="left")
    table.add_column("metric")
    table.add_column("predictor", justify="right")
    table.add_column("constant", justify="right")
    rows = [("kendall_tau", ev["kendall_tau"], _figure(ev.get("constant_kendall_tau"))),
            ("mae_tokens", ev["mae_tokens"], ""),
            ("bucket_accuracy (fitted buckets)", ev["bucket_accuracy"], _figure(ev.get("constant_bucket_accuracy"))),
            (f"bucket_accuracy_s3 ({ev['s3_bucket_width_tokens']:g}-token buckets)", ev["bucket_accuracy_s3"],
             _figure(ev.get("constant_bucket_accuracy_s3"))),
            (f"under_rate (gamma {ev['gamma']:g}, tau {ev['tau']:g})", ev["under_rate"], ""),
            ("reserved_over_actual", ev["reserved_over_actual"], ""), ("kv_utilization", ev["kv_utilization"], ""),
            ("routed_large_rate", ev["routed_large_rate"], "")]
    for name, value, constant in rows:
        table.add_row(name, _figure(value), constant)
    console.print(table)
    constant = ev.get("constant_predictor")
    if constant is not None:
        console.print(escape(CONSTANT_NOTE.format(**constant)))
    if many:
        console.print(_seeds_table(seeds))
    console.print(escape(f"buckets (KV tokens): {summary['buckets']['boundaries_tokens']}"))
    unc = summary["uncertainty"]
    coverage = unc.get("coverage_gamma")
    if coverage is not None:
        console.print(escape(f"u = {unc['u']}; headroom_scale {unc['headroom_scale']:.3f}; coverage gamma {coverage:g} "
                             f"(fits {unc['upper_quantile']:.0%} of the held-back training prompts; marked *)"))
    curve = Table(title="trade-off over gamma (tau fixed)", title_justify="left")
    for col in ("gamma", "under_rate", "reserved/actual", "kv_utilization", "routed large"):
        curve.add_column(col, justify="right")
    for c in ev["gamma_curve"]:
        mark = " *" if c["gamma"] == coverage else ""
        curve.add_row(f"{c['gamma']:g}{mark}", f"{c['under_rate']:.4f}", f"{c['reserved_over_actual']:.3f}",
                      f"{c['kv_utilization']:.3f}", f"{c['routed_large_rate']:.3f}")
    console.print(curve)
    dec = Table(title="under_rate by u decile (uniform: 2 x L_hat for all; unhedged: the fitted bucket of "
                      "prompt + L_hat)", title_justify="left")
    for col in ("decile", "u range", "rows", "under_rate uniform", "under_rate unhedged", "under_rate"):
        dec.add_column(col, justify="right")
    for d in ev["u_deciles"]:
        dec.add_row(str(d["decile"]), _u_range(d), f"{d['rows']:,}",
                    f"{d['under_rate_uniform']:.4f}", f"{d['under_rate_unhedged']:.4f}", f"{d['under_rate']:.4f}")
    console.print(dec)
    if "calibration" in ev:  # both kinds of u: does a higher u mean a longer output than L_hat says?
        kinds = list(ev["calibration"])
        cal = Table(title="calibration: share of outputs past 2 x L_hat, by decile of each u (the one in use: "
                          f"{ev['uncertainty']})", title_justify="left")
        cal.add_column("decile", justify="right")
        for kind in kinds:
            cal.add_column(f"{kind} u", justify="right")
            cal.add_column("past 2 L_hat", justify="right")
        for row in zip(*(ev["calibration"][k] for k in kinds)):
            cal.add_row(str(row[0]["decile"]), *(x for d in row for x in
                                                  (_u_range(d), f"{d['under_rate_uniform']:.4f}")))
        console.print(cal)


def _u_range(decile: dict) -> str:
    """A u decile's range, in both of fit's u tables: four decimals (the entropy u of a trained head
    spans 0.98-0.99, which two decimals print as 0.99-0.99 decile after decile, three 0.990-0.990)."""
    return f"{decile['u_min']:.4f}-{decile['u_max']:.4f}"


SEED_ROWS = (("kendall_tau", "kendall_tau", "constant_kendall_tau", None),
             ("bucket_accuracy", "bucket_accuracy", "constant_bucket_accuracy", "bucket_accuracy_over_constant"),
             ("bucket_accuracy_s3", "bucket_accuracy_s3", "constant_bucket_accuracy_s3",
              "bucket_accuracy_s3_over_constant"))


def _seeds_table(seeds: dict) -> Table:
    """Mean and sample sd over the seeds of the predictor, the constant predictor and the margin."""
    metrics = seeds["metrics"]
    cells = []
    for name, model, constant, margin in SEED_ROWS:
        row = [name]
        for key in (model, constant, margin):
            figure = metrics[key] if key is not None else {"mean": None, "sd": None}
            row += [_figure(figure["mean"]), _figure(figure["sd"])]
        cells.append(row)
    first, last = seeds["seeds"][0], seeds["seeds"][-1]
    held_out = "a different held-out share of prompts per seed" if seeds["split_varies_with_seed"] else \
        "time split: the same held-out rows for every seed, which vary the training alone"
    return narrow_table(f"over {seeds['count']} seeds, {first}-{last} ({held_out}; "
                        "margin: predictor - constant, per seed; sd: sample, ddof=1)",
                        ("predictor mean", "predictor sd", "constant mean", "constant sd", "margin mean",
                         "margin sd"), cells, key="metric")
