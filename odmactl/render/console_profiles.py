"""Console output of profiles list / show and calibrate."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from odmactl.core.units import format_bytes, format_rate
from odmactl.device.calibrate import COPY_SPREAD_LIMIT, EFFICIENCY_DIP, GATHER_PAST_COPY, NOISY_SHARE, NOISY_SPREAD
from odmactl.hw.profiles import profiles_dir
from odmactl.render.tables import narrow_table, print_warnings


def _short_path(file: str) -> str:
    try:
        return str(Path(file).resolve().relative_to(profiles_dir().resolve()))
    except ValueError:
        return file


def render_profiles_list(console: Console, devices: list[dict], models: list[dict]) -> None:
    """The device profiles by the name --device takes (the file's stem), and the model profiles."""
    rows = [[escape(Path(d["file"]).stem), d["memory_type"], format_bytes(d["capacity_bytes"], binary=False),
             format_rate(d["peak_bandwidth_bytes_per_s"], "B/s"), format_rate(d["peak_fp16_flops"], "FLOPS"),
             "yes" if d["measured"] else "no"] for d in devices]
    console.print(_names_whole(narrow_table("devices (profiles/devices/, measured ones in measured/)",
                                            ("memory", "capacity", "peak\nbandwidth", "fp16", "measured"), rows,
                                            key="--device"), rows))
    rows = [[escape(m["name"]), str(m["num_layers"]), f"{m['num_attention_heads']} / {m['num_kv_heads']}",
             str(m["head_dim"]), f"{m['total_params'] / 1e9:.2f} B", f"{m['active_params'] / 1e9:.2f} B",
             f"{m['kv_bytes_per_token']['fp16']:,}"] for m in models]
    console.print(_names_whole(narrow_table("models (profiles/models/)", ("layers", "heads\n/ kv", "head\ndim",
                                                                          "params", "active\nparams",
                                                                          "KV bytes\nper token\n(fp16)"),
                                            rows, key="--model"), rows))


def _names_whole(table: Table, rows: list[list[str]]) -> Table:
    """`table` (narrow_table's, with a key column) with its names, which a user types after
    --device or --model, never wrapped: the key column as wide as the longest name and never
    folded, its room taken from the other columns, whose values wrap between words instead (a
    number above its unit)."""
    names, *others = table.columns
    names.no_wrap, names.overflow = True, "ignore"
    names.min_width = max((len(row[0]) for row in rows), default=0)
    for j, column in enumerate(others, start=1):
        words = str(column.header).split() + [word for row in rows for word in row[j].split()]
        column.min_width, column.max_width = max(len(word) for word in words), None
    return table


def render_device(console: Console, d: dict) -> None:
    console.print(f"[bold]{escape(d['name'])}[/]: {escape(d['description'])} ({escape(d['file'])})")
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
            ("ridge point", f"{d['ridge_flops_per_byte']:.3g} FLOP/byte", "derived: fp16 rate / peak bandwidth")]
    link = d["interconnect"]
    if link is None:
        rows.append(("interconnect", "none (--tp 1 only)", "the profile has no [interconnect] table"))
    else:
        rows += [("interconnect", link["kind"], src.get("interconnect.kind")),
                 ("link bandwidth", format_rate(link["bandwidth_bytes_per_s"], "B/s") + " a direction",
                  src.get("interconnect.bandwidth")),
                 ("ring step latency", f"{link['step_latency_s'] * 1e6:g} us", src.get("interconnect.step_latency")),
                 ("all-reduce latency", f"{link['base_latency_s'] * 1e6:g} us", src.get("interconnect.base_latency"))]
    rows.append(("engine", d["engine"], src.get("engine.default") or "the profile has no [engine] table: "
                 "odmactl's default (rules/engines.py)"))
    host = d["host_link"]
    if host is None:
        rows.append(("host link", "none", "the profile has no [host_link] table (no KV offload, no adapter loads)"))
    else:
        rows += [("host link", host["kind"], src.get("host_link.kind")),
                 ("host link bandwidth", format_rate(host["bandwidth_bytes_per_s"], "B/s") + " a direction",
                  src.get("host_link.bandwidth"))]
    for name, value, source in rows:
        table.add_row(name, escape(value), escape(source or "-"))
    console.print(table)
    console.print("scattered reads: share of peak by contiguous run length")  # a title would wrap to the table
    bw = Table()
    bw.add_column("run")
    bw.add_column("efficiency", justify="right")
    for row in d["bandwidth_table"]:
        bw.add_row(format_bytes(row["chunk_bytes"]), f"{row['efficiency']:.4f}")
    console.print(bw)
    console.print(escape(f"source: {src.get('bandwidth.scattered', '-')}"))
    print_warnings(console, noise_lines(d.get("calibration") or {}))  # a measured profile's run was disturbed
    k = d["kernels"]
    if k is None:
        console.print(escape("kernels: no [kernels] table: GEMMs and prefill attention at the sequential share of "
                             "the peaks, no fixed costs (profiles/README.md, 'Kernels')"))
    else:
        gemm = ", ".join(f"{e:.2f} at {t:,}" for t, e in zip(k["gemm_tokens"], k["gemm_efficiency"]) if t in (1, 128, 4096))
        kv = "the table" if k["decode_kv_efficiency"] is None else f"{k['decode_kv_efficiency']:.3f} of peak"
        console.print(escape(f"kernels: GEMM efficiency {gemm} tokens; decode attention {k['decode_layer_fixed_s'] * 1e6:g} us "
                             f"+ {k['decode_per_request_s'] * 1e6:g} us per request per layer, KV read at {kv}; prefill "
                             f"attention at {k['prefill_attention_efficiency']:.2f} of peak; elementwise "
                             f"{k['elementwise_layer_fixed_s'] * 1e6:g} us + {k['elementwise_per_token_s'] * 1e6:g} us per "
                             f"token per layer."))
        console.print(escape(f"kernels source: {src.get('kernels', '-')}"))
    rows = [[escape(p["model"]), p["kv_dtype"], format_bytes(p["weight_bytes"]), format_bytes(p["kv_pool_bytes"]),
             f"{p['kv_pool_tokens']:,}"] for p in d["kv_pool"]]
    console.print(narrow_table("KV pool (capacity * fraction - weights - activation reserve)",
                               ("kv dtype", "weights", "KV pool", "KV tokens"), rows, key="model"))
    if "paged_vs_contiguous" in d:
        render_paged_vs_contiguous(console, d["paged_vs_contiguous"])


def render_paged_vs_contiguous(console: Console, p: dict) -> None:
    """The decode step at a full pool, paged at each block size against contiguous."""
    rows = [[str(r["block_tokens"]), format_bytes(r["run_bytes"]), f"{r['paged_step_s'] * 1e3:.2f}",
             f"{r['kv_ratio']:.3f}" if r["kv_ratio"] is not None else "-",
             f"{r['step_ratio']:.4f}" if r["step_ratio"] is not None else "-"] for r in p["paged"]]
    title = (f"{p['model']} ({p['kv_dtype']}) at a full pool: {p['batch']} requests x {p['context_tokens']:,} "
             f"tokens; contiguous step {p['contiguous_step_s'] * 1e3:.2f} ms")
    console.print(narrow_table(escape(title), ("run per\nKV head", "paged\nstep (ms)", "KV read\npaged /\ncontig.",
                                               "step\npaged /\ncontig."), rows, key="block"))


def render_model(console: Console, m: dict) -> None:
    console.print(f"[bold]{escape(m['name'])}[/] ({escape(m['model_type'])}, {escape(m['path'])})")
    table = Table(show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    experts = f"{m['num_experts_per_token']} of {m['num_experts']}" if m["num_experts"] > 1 else "dense"
    for name, value in (("layers", m["num_layers"]), ("hidden size", m["hidden_size"]),
                        ("attention heads / kv heads", f"{m['num_attention_heads']} / {m['num_kv_heads']}"),
                        ("head dim", m["head_dim"]), ("experts", experts),
                        ("parameters", f"{m['total_params']:,}"), ("active parameters", f"{m['active_params']:,}"),
                        ("weights", f"{format_bytes(m['weight_bytes'])} ({m['weight_dtype']})")):
        table.add_row(name, value if isinstance(value, str) else f"{value:,}")
    for dtype, nbytes in m["kv_bytes_per_token"].items():
        table.add_row(f"KV bytes/token {dtype}", f"{nbytes:,}")
    console.print(table)


def noise_lines(record: dict) -> list[str]:
    """Warnings for a calibration's [calibration.noise] record when the run was disturbed (device/
    calibrate.py NOISY_SHARE, COPY_SPREAD_LIMIT, EFFICIENCY_DIP, GATHER_PAST_COPY); none for a profile written before it was kept."""
    n = record.get("noise")
    if not n:
        return []
    lines = []
    if len(n["noisy"]) > NOISY_SHARE * n["timings"]:
        lines.append(f"{len(n['noisy'])} of {n['timings']} timings spread more than {NOISY_SPREAD:.0%} over their "
                     f"repeats (widest: {n['widest']}, {n['widest_repeat_spread']:.0%}): the machine was busy or "
                     "throttling while it measured; run calibrate again on an idle machine")
    if n["copy_rate_spread"] > COPY_SPREAD_LIMIT:
        lines.append(f"the same contiguous copy measured rates {n['copy_rate_spread']:.0%} apart across the scattered "
                     "table's run lengths: its efficiencies are not to be trusted; run calibrate again on an idle "
                     "machine")
    if n.get("efficiency_dips"):  # a profile from before the check has none
        lines.append(f"scattered reads of {_and(n['efficiency_dips'])} runs had under {EFFICIENCY_DIP:.0%} of a shorter "
                     "run's efficiency, which longer runs do not have on an idle device: run calibrate again on an idle "
                     "machine")
    if n.get("gathers_past_copy"):
        lines.append(f"random {_and(n['gathers_past_copy'])} runs were gathered more than {GATHER_PAST_COPY:g} times as "
                     "fast as a contiguous copy of the same bytes, which no memory does (the profile caps their "
                     "efficiency at 1): run calibrate again on an idle machine")
    return lines


def _and(names: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def render_calibration(console: Console, out_path: str, doc: dict, seconds: float) -> None:
    cal = doc["calibration"]
    console.print(escape(f"measured {doc['measurement']['device']} in {seconds:,.1f} s -> {out_path}"))
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
    gemm = cal.get("gemm")
    if gemm:  # the [kernels] gemm table (a profile written before it has none)
        g = Table(title=f"linear-layer GEMM, {format_bytes(gemm['weight_bytes'])} of {gemm['dtype']} weights, "
                        f"hidden {gemm['hidden']:,}", title_justify="left")
        for col in ("tokens", "time", "of roofline"):
            g.add_column(col, justify="right")
        for row in gemm["rows"]:
            g.add_row(f"{row['tokens']:,}", f"{row['seconds'] * 1e3:.3f} ms", f"{row['efficiency']:.4f}")
        console.print(g)
    print_warnings(console, noise_lines(cal))


def render_kernels(console: Console, doc: dict) -> None:
    """`profiles kernels`: the derived [kernels] table, the fits' residuals and the comparison."""
    console.print(escape(f"{doc['device']}: kernel figures from aiconfigurator's {doc['database']} database "
                         f"({doc['system']}), fitted on {doc['model']}'s operations"))
    console.print(escape(doc["toml"]), soft_wrap=True, highlight=False)
    worst = ", ".join(f"{k.replace('_', ' ')} {v:.1%}" for k, v in doc["fit_worst_relative_error"].items())
    console.print(escape(f"largest relative error of each fit: {worst}"))
    shipped = "profile_ms" in doc["comparison"][0]
    columns = ("aiconfig.\n(ms)", "derived\n(ms)", "ratio") + (("profile\n(ms)", "ratio") if shipped else ())
    rows = [[escape(r["step"]), f"{r['aiconfigurator_ms']:.2f}", f"{r['derived_ms']:.2f}", f"{r['derived_ratio']:.3f}"]
            + ([f"{r['profile_ms']:.2f}", f"{r['profile_ratio']:.3f}"] if shipped else []) for r in doc["comparison"]]
    console.print(narrow_table("cost model against aiconfigurator (Llama-3-8B, tp 1; decode on vLLM's 16-token blocks)",
                               columns, rows, key="step"))
    console.print("derived: the cost model with the table above; ratio: derived / aiconfigurator"
                  + ("; profile: with the [kernels] table the profile carries now" if shipped else ""), highlight=False,
                  markup=False)
