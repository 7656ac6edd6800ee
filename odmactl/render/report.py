"""Rendering: rich tables for people, canonical JSON for machines. Only this module and cli print."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from odmactl.gate.thresholds import format_threshold
from odmactl.trace.stats import json_safe


def to_json(data: object) -> str:
    """Deterministic JSON: sorted keys, fixed separators, non-finite floats as null."""
    return json.dumps(json_safe(data), sort_keys=True, indent=2, ensure_ascii=False)


def format_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_ingest(console: Console, summary: dict) -> None:
    table = Table(title=f"ingested -> {summary['out']}", title_justify="left")
    for col in ("source", "format", "rows", "excluded", "token counts"):
        table.add_column(col, overflow="fold")
    for s in summary["sources"]:
        excluded = "; ".join(f"{v:,} {k}" for k, v in s["excluded"].items()) or "-"
        table.add_row(s["path"], s["format"], format_value(s["rows"]), excluded, s["token_source"])
    console.print(table)
    console.print(
        f"{summary['requests']:,} requests over {summary['duration_s']:,.1f} s; "
        f"prompt tokens {summary['total_prompt_tokens']:,}, output tokens {summary['total_output_tokens']:,}"
    )
    console.print(f"arrivals: {summary['arrivals']}")
    if summary["moved_rows"]:
        console.print(f"[yellow]{summary['moved_rows']:,} rows arrived out of order and were moved when sorting by arrival[/]")
    for s in summary["sources"]:
        for note in s["notes"]:
            console.print(f"note ({s['path']}): {note}")


def _length_table(stats: dict) -> Table:
    table = Table(title="lengths (tokens)", title_justify="left")
    table.add_column("")
    for col in ("mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right")
    for key in ("prompt_tokens", "output_tokens"):
        table.add_row(key, *(format_value(stats[key][c]) for c in ("mean", "p50", "p90", "p99", "max")))
    return table


def _breakdown_table(title: str, rows: list[dict], key: str, limit: int = 20) -> Table:
    table = Table(title=f"{title} ({len(rows)} distinct; top {min(limit, len(rows))})", title_justify="left")
    for col in (key, "requests", "share", "prompt mean", "output mean", "output p50", "output p99"):
        table.add_column(col, justify="left" if col == key else "right")
    for r in rows[:limit]:
        table.add_row(str(r[key]), format_value(r["requests"]), f"{r['share']:.1%}", format_value(r["prompt_mean"]),
                      format_value(r["output_mean"]), format_value(r["output_p50"]), format_value(r["output_p99"]))
    return table


def _drift_table(stats: dict, limit: int = 48) -> Table:
    rows = stats["drift"]
    table = Table(title=f"drift per {stats['window_s']:g} s window ({len(rows)} windows"
                        + (f", first {limit}" if len(rows) > limit else "") + ")", title_justify="left")
    for col in ("start s", "requests", "req/s", "prompt p50", "prompt p99", "output mean", "output p50", "output p90", "output p99"):
        table.add_column(col, justify="right")
    for r in rows[:limit]:
        table.add_row(format_value(r["start_s"]), format_value(r["requests"]), format_value(r["rate_per_s"]), format_value(r["prompt_p50"]),
                      format_value(r["prompt_p99"]), format_value(r["output_mean"]), format_value(r["output_p50"]), format_value(r["output_p90"]),
                      format_value(r["output_p99"]))
    return table


def render_stats(console: Console, path: str, stats: dict) -> None:
    rate = stats["arrival_rate_per_s"]
    console.print(f"[bold]{path}[/]: {stats['requests']:,} requests over {stats['duration_s']:,.1f} s"
                  + (f" ({rate:,.2f} req/s)" if rate else " (all at t=0)"))
    console.print(f"total prompt tokens {stats['total_prompt_tokens']:,}, output tokens {stats['total_output_tokens']:,}")
    console.print(_length_table(stats))
    if stats["by_model"]:
        console.print(_breakdown_table("by model", stats["by_model"], "model"))
    if stats["by_tenant"]:
        console.print(_breakdown_table("by tenant", stats["by_tenant"], "tenant"))
    if stats["drift"]:
        console.print(_drift_table(stats))


def render_fit(console: Console, out_dir: str, summary: dict, seconds: float) -> None:
    ev = summary["evaluation"]
    split = summary["split"]
    console.print(f"predictor ({summary['family']}, {summary['mode']} heads) -> {out_dir}: trained on "
                  f"{split['train_rows']:,} rows in {seconds:,.1f} s ({summary['training']['epochs']} epochs); "
                  f"held out {split['test_rows']:,} rows by {split['by']}")
    table = Table(title="held-out evaluation", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("kendall_tau", ev["kendall_tau"]), ("mae_tokens", ev["mae_tokens"]),
            ("bucket_accuracy (fitted buckets)", ev["bucket_accuracy"]),
            (f"bucket_accuracy_s3 ({ev['s3_bucket_width_tokens']:g}-token buckets)", ev["bucket_accuracy_s3"]),
            (f"under_rate (gamma {ev['gamma']:g}, tau {ev['tau']:g})", ev["under_rate"]),
            ("reserved_over_actual", ev["reserved_over_actual"]), ("kv_utilization", ev["kv_utilization"]),
            ("routed_large_rate", ev["routed_large_rate"])]
    for name, value in rows:
        table.add_row(name, f"{value:.4f}")
    console.print(table)
    console.print(f"buckets (KV tokens): {summary['buckets']['boundaries_tokens']}")
    unc = summary["uncertainty"]
    coverage = unc.get("coverage_gamma")
    if coverage is not None:
        console.print(f"u = {unc['u']}; headroom_scale {unc['headroom_scale']:.3f}; coverage gamma {coverage:g} "
                      f"(fits {unc['upper_quantile']:.0%} of the held-back training prompts; marked *)")
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
        dec.add_row(str(d["decile"]), f"{d['u_min']:.3f}-{d['u_max']:.3f}", f"{d['rows']:,}",
                    f"{d['under_rate_uniform']:.4f}", f"{d['under_rate_unhedged']:.4f}", f"{d['under_rate']:.4f}")
    console.print(dec)


def device_summary(device, models: list) -> dict:
    """A device profile's figures and derived quantities (KV pool per model at its KV dtype)."""
    bw = device.bandwidth
    pools = []
    for m in models:
        pool = device.kv_pool_bytes(m)
        pools.append({"model": m.name, "kv_dtype": m.kv_dtype, "weight_bytes": m.weight_bytes, "kv_pool_bytes": pool,
                      "kv_pool_tokens": pool // m.kv_bytes_per_token})
    return {
        "name": device.name, "description": device.description, "file": str(device.path), "measured": device.measured,
        "memory_type": device.memory_type, "capacity_bytes": device.capacity_bytes,
        "peak_bandwidth_bytes_per_s": device.peak_bandwidth_bytes_per_s,
        "sequential_efficiency": bw.sequential_efficiency,
        "sequential_bandwidth_bytes_per_s": device.sequential_bandwidth_bytes_per_s,
        "peak_fp16_flops": device.peak_fp16_flops, "peak_bf16_flops": device.peak_bf16_flops,
        "ridge_flops_per_byte": device.peak_fp16_flops / device.peak_bandwidth_bytes_per_s,
        "memory_fraction": device.memory_fraction, "activation_reserve_bytes": device.activation_reserve_bytes,
        "usable_bytes": device.usable_bytes, "step_overhead_s": device.step_overhead_s,
        "bandwidth_table": [{"chunk_bytes": c, "efficiency": e} for c, e in zip(bw.chunk_bytes, bw.efficiency)],
        "kv_pool": pools, "sources": dict(device.sources),
        "measurement": dict(device.measurement) if device.measurement else None,
        "calibration": device.calibration,
    }


def model_summary(model) -> dict:
    from odmactl.hw.profiles import KV_DTYPE_BITS

    return {
        "name": model.name, "path": str(model.path), "model_type": model.model_type, "num_layers": model.num_layers,
        "hidden_size": model.hidden_size, "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "intermediate_size": model.intermediate_size,
        "vocab_size": model.vocab_size, "num_experts": model.num_experts,
        "num_experts_per_token": model.num_experts_per_token, "total_params": model.total_params,
        "active_params": model.active_params, "weight_dtype": model.weight_dtype, "weight_bytes": model.weight_bytes,
        "max_position_embeddings": model.max_position_embeddings,
        "kv_bytes_per_token": {d: model.with_kv_dtype(d).kv_bytes_per_token for d in KV_DTYPE_BITS},
    }


def _short_path(file: str) -> str:
    from pathlib import Path

    from odmactl.hw.profiles import profiles_dir

    try:
        return str(Path(file).resolve().relative_to(profiles_dir().resolve()))
    except ValueError:
        return file


def render_profiles_list(console: Console, devices: list[dict], models: list[dict]) -> None:
    from odmactl.core.units import format_bytes, format_rate

    table = Table(title="devices", title_justify="left")
    for col in ("name", "memory", "capacity", "peak bandwidth", "fp16", "measured", "file"):
        table.add_column(col, overflow="fold")
    for d in devices:
        table.add_row(d["name"], d["memory_type"], format_bytes(d["capacity_bytes"], binary=False),
                      format_rate(d["peak_bandwidth_bytes_per_s"], "B/s"), format_rate(d["peak_fp16_flops"], "FLOPS"),
                      "yes" if d["measured"] else "no", _short_path(d["file"]))
    console.print(table)
    table = Table(title="models", title_justify="left")
    for col in ("name", "layers", "heads / kv", "head dim", "params (active)", "KV bytes/token fp16"):
        table.add_column(col, justify="right")
    for m in models:
        params = f"{m['total_params'] / 1e9:.2f} B"
        if m["active_params"] != m["total_params"]:
            params += f" ({m['active_params'] / 1e9:.2f} B)"
        table.add_row(m["name"], str(m["num_layers"]), f"{m['num_attention_heads']} / {m['num_kv_heads']}",
                      str(m["head_dim"]), params, f"{m['kv_bytes_per_token']['fp16']:,}")
    console.print(table)


def render_device(console: Console, d: dict) -> None:
    from odmactl.core.units import format_bytes, format_rate

    console.print(f"[bold]{d['name']}[/]: {d['description']} ({d['file']})")
    table = Table(show_header=True, title_justify="left")
    for col in ("figure", "value", "source"):
        table.add_column(col, overflow="fold")
    src = d["sources"]
    rows = [("memory", d["memory_type"], src.get("memory.type")),
            ("capacity", format_bytes(d["capacity_bytes"], binary=False), src.get("memory.capacity")),
            ("peak bandwidth", format_rate(d["peak_bandwidth_bytes_per_s"], "B/s"), src.get("memory.peak_bandwidth")),
            ("sequential", f"{d['sequential_efficiency']:.3f} of peak = "
                           f"{format_rate(d['sequential_bandwidth_bytes_per_s'], 'B/s')}", src.get("bandwidth.sequential")),
            ("fp16", format_rate(d["peak_fp16_flops"], "FLOPS"), src.get("compute.peak_fp16")),
            ("bf16", format_rate(d["peak_bf16_flops"], "FLOPS") if d["peak_bf16_flops"] else "-", src.get("compute.peak_bf16")),
            ("memory fraction", f"{d['memory_fraction']:g}", src.get("budget.memory_fraction")),
            ("activation reserve", format_bytes(d["activation_reserve_bytes"]), src.get("budget.activation_reserve")),
            ("usable memory", format_bytes(d["usable_bytes"], binary=False), "derived: capacity * memory fraction"),
            ("ridge point", f"{d['ridge_flops_per_byte']:.0f} FLOP/byte", "derived: fp16 rate / peak bandwidth")]
    for name, value, source in rows:
        table.add_row(name, value, source or "-")
    console.print(table)
    bw = Table(title="scattered reads: share of peak by contiguous run length", title_justify="left")
    bw.add_column("run")
    bw.add_column("efficiency", justify="right")
    for row in d["bandwidth_table"]:
        bw.add_row(format_bytes(row["chunk_bytes"]), f"{row['efficiency']:.4f}")
    console.print(bw)
    console.print(f"source: {src.get('bandwidth.scattered', '-')}", soft_wrap=True)
    pools = Table(title="KV pool (capacity * fraction - weights - activation reserve)", title_justify="left")
    for col in ("model", "kv dtype", "weights", "KV pool", "KV tokens"):
        pools.add_column(col, justify="right")
    for p in d["kv_pool"]:
        pools.add_row(p["model"], p["kv_dtype"], format_bytes(p["weight_bytes"], binary=False),
                      format_bytes(p["kv_pool_bytes"], binary=False), f"{p['kv_pool_tokens']:,}")
    console.print(pools)


def render_model(console: Console, m: dict) -> None:
    from odmactl.core.units import format_bytes

    console.print(f"[bold]{m['name']}[/] ({m['model_type']}, {m['path']})")
    table = Table(show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    experts = f"{m['num_experts_per_token']} of {m['num_experts']}" if m["num_experts"] > 1 else "dense"
    for name, value in (("layers", m["num_layers"]), ("hidden size", m["hidden_size"]),
                        ("attention heads / kv heads", f"{m['num_attention_heads']} / {m['num_kv_heads']}"),
                        ("head dim", m["head_dim"]), ("experts", experts),
                        ("parameters", f"{m['total_params']:,}"), ("active parameters", f"{m['active_params']:,}"),
                        ("weights", f"{format_bytes(m['weight_bytes'], binary=False)} ({m['weight_dtype']})")):
        table.add_row(name, value if isinstance(value, str) else f"{value:,}")
    for dtype, nbytes in m["kv_bytes_per_token"].items():
        table.add_row(f"KV bytes/token {dtype}", f"{nbytes:,}")
    console.print(table)


def render_calibration(console: Console, out_path: str, doc: dict, seconds: float) -> None:
    from odmactl.core.units import format_bytes, format_rate

    cal = doc["calibration"]
    console.print(f"measured {doc['measurement']['device']} in {seconds:,.1f} s -> {out_path}")
    table = Table(show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("sequential read", format_rate(cal["sequential_read_bytes_per_s"], "B/s"))
    table.add_row("device copy (read + write)", format_rate(cal["copy_bytes_per_s"], "B/s"))
    table.add_row("sequential read / copy", f"{cal['sequential_read_over_copy']:.3f}")
    for key, label in (("matmul_fp16_flops", "fp16 matmul"), ("matmul_bf16_flops", "bf16 matmul")):
        table.add_row(label, format_rate(cal[key], "FLOPS") if key in cal else "not supported")
    a = cal["attention"]
    table.add_row(f"decode attention, {a['batch']} x {a['context_tokens']} tokens: contiguous",
                  f"{a['contiguous_s'] * 1e3:.3f} ms")
    table.add_row(f"paged ({a['block_tokens']}-token blocks, gathered)", f"{a['paged_s'] * 1e3:.3f} ms")
    table.add_row("paged / contiguous", f"{a['paged_over_contiguous']:.3f}")
    console.print(table)
    bw = Table(title="scattered reads by run length", title_justify="left")
    for col in ("run", "gathered", "contiguous copy", "efficiency"):
        bw.add_column(col, justify="right")
    for row, entry in zip(cal["scattered"], doc["bandwidth"]["scattered"]):
        bw.add_row(format_bytes(row["chunk_bytes"]), format_rate(row["gather_bytes_per_s"], "B/s"),
                   format_rate(row["contiguous_bytes_per_s"], "B/s"), f"{entry['efficiency']:.4f}")
    console.print(bw)


REPLAY_COLUMNS = (
    ("kv_utilization", "KV util", "{:.1%}"), ("pool_occupancy", "pool occ.", "{:.1%}"), ("tps", "TPS", "{:,.1f}"),
    ("ttft_p50", "TTFT p50 s", "{:.3g}"), ("ttft_p99", "TTFT p99 s", "{:.3g}"),
    ("tpot_p50", "TPOT p50 ms", "ms"), ("tpot_p99", "TPOT p99 ms", "ms"),
    ("migration_rate", "migr. rate", "{:.2%}"), ("preemptions", "preempt.", "{:,}"),
    ("rejections", "rejected", "{:,}"), ("peak_concurrency", "peak conc.", "{:,}"), ("completed", "completed", "{:,}"),
)


def _metric(value: float | int, fmt: str) -> str:
    if fmt == "ms":
        return f"{value * 1e3:.1f}"
    return fmt.format(value)


def _metrics_table(doc: dict) -> Table:
    """Policies side by side, a metric per row."""
    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    for policy in doc["results"]:
        table.add_column(policy, justify="right")
    for key, title, fmt in REPLAY_COLUMNS:
        table.add_row(title, *(_metric(r["metrics"][key], fmt) for r in doc["results"].values()))
    return table


def render_replay(console: Console, doc: dict) -> None:
    t = doc["trace"]
    console.print(f"[bold]{t['path']}[/]: {t['requests']:,} requests ({t['arrivals']}), "
                  f"{doc['model']} on {doc['device']}; KV pool {doc['kv_pool_bytes'] / 2**30:.2f} GiB = "
                  f"{doc['kv_pool_bytes'] // doc['kv_bytes_per_token']:,} tokens; max_model_len {doc['max_model_len']:,}; "
                  f"predictor {doc['predictor']}; {doc['time_advance']}", highlight=False)
    console.print(_metrics_table(doc))
    for policy, r in doc["results"].items():
        m = r["metrics"]
        extra = []
        if m["truncated"]:
            extra.append(f"{m['truncated']:,} outputs truncated at max_model_len")
        for key, note in r["notes"].items():
            extra.append(f"{key.replace('_', ' ')}: {note}")
        if extra:
            console.print(f"{policy}: " + "; ".join(extra), highlight=False)
    measured = {p: r["on_device"] for p, r in doc["results"].items() if "on_device" in r}
    if measured:
        first = next(iter(measured.values()))
        console.print(f"[bold]on device[/]: {first['device_name']} ({first['torch_device']}, torch {first['torch']}), "
                      f"model {first['model']}" + (f", scaled to {first['layers']} of {first['layers_full']} layers"
                                                   if first["layers"] != first["layers_full"] else "")
                      + f"; modelled with profile {first['profile']}", highlight=False)
        table = Table(show_header=True, header_style="bold")
        table.add_column("decode step time")
        for policy in measured:
            table.add_column(policy, justify="right")
        rows = [("steps", "decode_steps", "{:,}"), ("measured total (s)", "measured_decode_s", "{:.4g}"),
                ("modelled total (s)", "modelled_decode_s", "{:.4g}"), ("total error", "total_error", "{:+.1%}"),
                ("per-step error p50", "step_error_p50", "{:+.1%}"),
                ("per-step |error| p50", "step_abs_error_p50", "{:.1%}"),
                ("per-step |error| p90", "step_abs_error_p90", "{:.1%}")]
        for title, key, fmt in rows:
            table.add_row(title, *(fmt.format(m[key]) for m in measured.values()))
        # the least-squares terms of each side (ondevice.step_time_fit)
        for title, fit_key, key, scale in (("fit: fixed ms, measured", "measured_fit", "fixed_s", 1e3),
                                           ("fit: fixed ms, modelled", "modelled_fit", "fixed_s", 1e3),
                                           ("fit: KV GB/s, measured", "measured_fit", "kv_bytes_per_s", 1e-9),
                                           ("fit: KV GB/s, modelled", "modelled_fit", "kv_bytes_per_s", 1e-9)):
            fits = [m.get(fit_key) for m in measured.values()]
            table.add_row(title, *("-" if not f or f[key] is None else f"{f[key] * scale:.4g}" for f in fits))
        console.print(table)


def render_check(console: Console, doc: dict, policy: str, verdicts: list, passed: bool) -> None:
    """The verdict per threshold, then the replayed policies' metrics."""
    t = doc["trace"]
    console.print(f"[bold]{t['path']}[/]: {t['requests']:,} requests, {doc['model']} on {doc['device']}, "
                  f"policy {policy}, predictor {doc['predictor']}", highlight=False)
    table = Table(show_header=True, header_style="bold")
    for title in ("check", "metric", "threshold", "value", "result"):
        table.add_column(title, justify="left" if title in ("check", "metric") else "right")
    for v in verdicts:
        table.add_row(v.name, v.metric, f"{v.comparison} {format_threshold(v.name, v.threshold)}", format_threshold(v.name, v.value),
                      "[green]pass[/]" if v.passed else "[bold red]FAIL[/]")
    console.print(table)
    console.print(_metrics_table(doc))
    console.print("[bold green]PASS[/]" if passed else
                  f"[bold red]FAIL[/]: {sum(not v.passed for v in verdicts)} of {len(verdicts)} thresholds violated")


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
        axes[0].step(s["time_s"], s["pool_occupancy"], where="post", label=policy)
        axes[1].step(s["time_s"], s["batch_size"], where="post", label=policy)
        axes[2].step(s["time_s"], s["queue_length"], where="post", label=policy)
        if has_bounds and s["bucket_boundaries"]:
            bounds = s["bucket_boundaries"]
            times = [b["time_s"] for b in bounds] + [max(s["time_s"][-1], bounds[-1]["time_s"])]
            rows = [b["boundaries_tokens"] for b in bounds] + [bounds[-1]["boundaries_tokens"]]  # held to the end
            for j in range(max(len(row) for row in rows)):
                values = [row[j] if j < len(row) else float("nan") for row in rows]
                axes[3].step(times, values, where="post", label=f"{policy} b{j + 1}")
        if "on_device" in r:
            d = r["on_device"]["series"]
            line, = axes[-1].plot(d["step"], d["measured_s"], linewidth=0.8, label=policy)
            axes[-1].plot(d["step"], d["modelled_s"], linewidth=0.8, linestyle="--", color=line.get_color())
    for j, (ax, label) in enumerate(zip(axes, labels)):
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
        if j < over_time - 1:
            ax.tick_params(labelbottom=False)
    axes[over_time - 1].set_xlabel("time (s)")
    if has_device:
        axes[-1].set_xlabel("decode iteration")
    fig.suptitle(f"{doc['model']} on {doc['device']}: {doc['trace']['path']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


PLAN_ROWS = (("kv_utilization", "KV util", "{:.1%}"), ("tps", "TPS", "{:,.1f}"), ("migration_rate", "migr. rate", "{:.3%}"),
             ("rejections", "rejected", "{:,}"), ("preemptions", "preempt.", "{:,}"), ("ttft_p99", "TTFT p99 s", "{:.3g}"),
             ("tpot_p99", "TPOT p99 ms", "ms"), ("peak_concurrency", "peak conc.", "{:,}"))


def render_plan(console: Console, doc: dict, out_path: str) -> None:
    """The recommendation, then every policy on the held-out part, side by side."""
    t = doc["trace"]
    console.print(f"[bold]{t['path']}[/]: {t['requests']:,} requests, {doc['model']} on {doc['device']}, predictor "
                  f"{doc['predictor']}; searched on the first {t['search_requests']:,}, validated on the last "
                  f"{t['holdout_requests']:,}", highlight=False)
    console.print(f"{doc['candidates']} candidates: {doc['pruned']} pruned by the cheap bounds, {doc['replayed']} "
                  f"replayed; objective {doc['objective']}, overflow rate + 1 s.e. <= {doc['max_overflow_rate']:.2%}"
                  + (f", TTFT p99 <= {doc['ttft_p99_s']:g} s" if doc["ttft_p99_s"] else ""), highlight=False)
    a = doc["chosen"]["allocator"]
    console.print(f"[bold]recommended[/]: {doc['chosen']['label']}; boundaries {a['boundaries_tokens']} tokens, "
                  f"max_model_len {doc['max_model_len']:,}" + ("" if doc["constraints_met_on_search"] else
                  " [bold red](no replayed candidate met every constraint on the search part: the closest is shown)[/]"),
                  highlight=False)
    table = Table(show_header=True, header_style="bold", title="held-out later part")
    table.add_column("metric")
    for name in doc["validation"]:
        table.add_column(name, justify="right")
    for key, title, fmt in PLAN_ROWS:
        table.add_row(title, *(_metric(v["metrics"][key], fmt) for v in doc["validation"].values()))
    console.print(table)
    lines = [f"{name}: KV utilization {d['kv_utilization_points']:+.1f} points, TPS {d['tps_gain']:+.1%}"
             for name, d in doc["against_baselines"].items()]
    console.print("recommended odma against " + "; ".join(lines), highlight=False)
    faster = [name for name, d in doc["against_baselines"].items() if d["tps_gain"] < 0]
    if faster:
        console.print(f"[yellow]note:[/] {', '.join(faster)} served more tokens per second than the recommended odma "
                      "on the held-out part", highlight=False)
    console.print(f"wrote {out_path}", highlight=False)
