"""The HTML reports of `odmactl plan` and `odmactl capacity`: one self-contained file each (plots
embedded as PNG). Plan's compares the recommendation with static, paged and s3 on the held-out part
of the trace, with the plots of render/plan_plots.py (the Pareto front of the search, the
boundaries as ticks under the held-out length histogram, pool occupancy a panel per policy);
capacity's has the headline, the table, what binds and the latency curves (render/plots.py).
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path

from odmactl.core.stops import uninterrupted
from odmactl.core.units import format_bytes
from odmactl.render.metrics import METRICS, capacity_keys, format_metric, metric_rows, plan_keys
from odmactl.render.plan_plots import boundaries_png, occupancy_png, pareto_png
from odmactl.render.plan_text import (failure_message, holdout_title, plan_headline, search_counts, search_limits,
                                      stressed_pool, tuning_keys, tuning_rule)
from odmactl.render.tables import deployment
from odmactl.render.warnings import listed_capacity_warnings


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


HEADLINE_COLOURS = {"default": "#222", "bold red": "#b00020", "bold yellow": "#8a6d00", "yellow": "#8a6d00", "bold green": "#1b6e20",
                    "green": "#1b6e20"}


def _setting(value) -> str:
    """An engine setting's cell: a command line (serve_args) as code, left-aligned, each flag with
    its value kept on one line, so that a wrapped line never splits "--enable-chunked-prefill"."""
    text = str(value)
    if not text.startswith("--"):
        return html.escape(text)
    flags = re.split(r" (?=--)", text)
    return ('<code style="display:block;text-align:left">'
            + " ".join(f'<span style="white-space:nowrap">{html.escape(f)}</span>' for f in flags) + "</code>")


@uninterrupted
def write_plan_report(doc: dict, config: dict, path: Path, before: list[str] = ()) -> None:
    """The report; `config` is the config plan made, written only when it holds (doc["holds"]):
    otherwise the report says why and shows the closest candidate's settings. `before`: warnings
    said above the headline (a noisy measured profile's)."""
    import matplotlib

    matplotlib.use("Agg")
    esc = html.escape
    t = doc["trace"]
    head = "".join(f"<th>{esc(name)}</th>" for name in doc["validation"])
    keys = plan_keys(doc["objective"])
    body = "".join("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>"
                   for row in metric_rows(doc["validation"], keys))
    # the warnings of the JSON's list that the headline does not give (`before`: a noisy measured
    # profile's, which the console says on stderr before the search)
    headline = "".join(f'<p style="color:#8a6d00"><b>warning: {esc(line)}</b></p>' for line in before)
    headline += "".join(f'<p style="color:{HEADLINE_COLOURS[style]}"><b>{esc(line)}</b></p>'
                        for style, line in plan_headline(doc))
    holds = doc["holds"]
    if not holds:
        headline += f'<p style="color:#b00020"><b>{esc(failure_message(doc))}</b></p>'
    engine = "" if not holds else "<h2>[engine.vllm]: the vLLM launch settings</h2><table>" + "".join(
        f"<tr><td>{esc(k)}</td><td>{_setting(v)}</td></tr>" for k, v in config["engine"]["vllm"].items()) + "</table>"
    bold = ' style="font-weight:bold"'
    chosen = next((i for i, r in enumerate(doc["search"]["replays"]) if r["label"] == doc["chosen"]["label"]), None)
    replays = "".join(f"<tr{bold if i == chosen else ''}><td>{esc(r['label'])}</td>"
                      f"<td>{format_metric('kv_utilization', r['estimate']['kv_utilization'])}</td>"
                      f"<td>{format_metric('overflow_rate', r['estimate']['overflow_rate'])}</td>"
                      f"<td>{format_metric('kv_utilization', r['measured']['kv_utilization'])}</td>"
                      f"<td>{format_metric('overflow_rate', r['measured']['overflow_rate'])}</td>"
                      f"<td>{format_metric('tps', r['measured']['tps'])}</td>"
                      f"<td>{format_metric('rejections', r['measured']['rejections'])}</td>"
                      f"<td>{'chosen' if i == chosen else ''}</td></tr>"
                      for i, r in enumerate(doc["search"]["replays"]))
    allocator = "".join(f"<tr><td>{esc(k)}</td><td style=\"text-align:left\">{esc(str(v).lower() if isinstance(v, bool) else str(v))}"
                        "</td></tr>" for k, v in config["allocator"].items())  # as the TOML spells it
    option_keys = ("tps", "kv_utilization", "ttft_p99", "overflow_rate", "stalls")
    tuning = doc["tuning"]
    smaller = stressed_pool(tuning)
    # the same option with the smaller large pool _tune also tries: what picks among the options
    stressed_keys = () if smaller is None else tuning_keys(tuning)
    options = "".join(f"<tr{bold if o['chosen'] else ''}><td>{esc(o['scheduler'])}</td>"
                      f"<td>{'on' if o['large_spill'] else 'off'}</td>"
                      + "".join(f"<td>{format_metric(k, o[k])}</td>" for k in option_keys)
                      + f"<td>{o['large_spills']:,}</td>"
                      + "".join(f"<td>{format_metric(k, o['stressed'][k])}</td>" for k in stressed_keys)
                      + f"<td>{'chosen' if o['chosen'] else ''}</td></tr>"
                      for o in tuning["options"])
    options_head = ("".join(f"<th>{esc(METRICS[k].header)}</th>" for k in option_keys) + "<th>large spills</th>"
                    + "".join(f"<th>{esc(METRICS[k].header)}, smaller large pool</th>" for k in stressed_keys))
    planned = f"its large pool ({format_bytes(tuning['large_pool_bytes'])})"
    pools = f"{planned}, one largest block, so no smaller one" if smaller is None else \
        f"{planned} and with a smaller one ({smaller})"
    text = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>odmactl plan: {esc(t['path'])}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child{{text-align:left}}img{{max-width:100%}}</style>
</head><body>
<h1>odmactl plan</h1>
{headline}
<p><code>{esc(t['path'])}</code>: {t['requests']:,} requests; {esc(deployment(doc))}; predictor
<code>{esc(doc['predictor'])}</code>; KV pool {format_bytes(doc['kv_pool_bytes'])}; max_model_len {doc['max_model_len']:,}.
Searched on the first {t['search_requests']:,} requests, validated on the last {t['holdout_requests']:,}.</p>
<p>{esc(search_counts(doc))}; objective
<b>{esc(doc['objective'])}</b>, {esc(search_limits(doc))} (overflows: migrations + preemptions per request).
{'Recommended' if holds else 'Closest candidate (no config written)'}: <b>{esc(doc['chosen']['label'])}</b>{'' if doc['constraints_met_on_search'] else
' (no replayed candidate met every constraint: the closest is shown)'}.</p>
<h2>Held-out later part: the recommendation against the baselines</h2>
<p>{esc(holdout_title(doc))}</p>
<table><tr><th>metric</th>{head}</tr>{body}</table>
<h2>{'Recommended' if holds else 'Closest candidate (not written)'} [allocator]</h2><table>{allocator}</table>
<h2>Scheduler and large_spill: the options replayed on the search part</h2>
<p>The pick, with {esc(pools)}, under each scheduler, with a full large pool's block waiting or spilling
to the main pool: {esc(tuning_rule(tuning))}.</p>
<table><tr><th>scheduler</th><th>large_spill</th>{options_head}<th></th></tr>{options}</table>
{engine}
<h2>Utilization against overflow rate: the Pareto front</h2><img src="data:image/png;base64,{pareto_png(doc)}">
<h2>Bucket boundaries over the held-out lengths</h2><img src="data:image/png;base64,{boundaries_png(doc)}">
<h2>Pool occupancy over time (held-out part)</h2><img src="data:image/png;base64,{occupancy_png(doc)}">
<h2>Replayed candidates (search part)</h2>
<table><tr><th>candidate</th><th>est. KV util</th><th>est. overflow rate</th><th>KV util</th><th>overflow rate</th><th>TPS (tok/s)</th><th>rejected</th><th></th></tr>
{replays}</table>
</body></html>
"""
    path.write_text(text, encoding="utf-8")


@uninterrupted
def write_capacity_report(doc: dict, path: Path) -> None:
    """`odmactl capacity`'s report: the table of rates and devices, and the latency-throughput curves."""
    from odmactl.render.console_replay import (binding_lines, capacity_headline, capacity_value, headline_detail,
                                               infeasible_lines, ROUTER_TABLE_TITLE, router_table,
                                               routers_words)
    from odmactl.render.plots import capacity_figure

    esc = html.escape
    t = doc["trace"]
    keys = capacity_keys(doc.get("slo", {}))
    head = "".join(f"<th>{esc(METRICS[k].header)}</th>" for k in keys)
    body = "".join(f"<tr><td>{esc(r['policy'])} tp {r['tp']}</td>"
                   + "".join(f"<td>{esc(capacity_value(r, k, doc.get('slo')))}</td>" for k in keys) + "</tr>"
                   for r in doc["rows"])
    by_router = router_table(doc)
    routed = "" if by_router is None else (
        f"<p>{esc(ROUTER_TABLE_TITLE)}:</p><table><tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in by_router[0]) + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in by_router[1]) + "</table>")
    notes = "".join(f"<li>{esc(line)}</li>" for line in infeasible_lines(doc))
    notes += "".join(f"<li>{esc(line)}</li>" for line in binding_lines(doc))
    said = capacity_headline(doc)
    headline = (f"<p><b>{esc(said)}</b></p>" + "".join(f"<p>{esc(line)}</p>" for line in headline_detail(doc))) \
        if said else ""
    target = f"{doc['target_rate_per_s']:,.3f} req/s" + (" (the trace's busiest 10 minutes)" if doc["target_is_peak"] else "")
    warned = "".join(f'<p style="color:#8a6d00"><b>warning: {esc(line)}</b></p>'
                     for line in listed_capacity_warnings(doc))
    text = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>odmactl capacity: {esc(t['path'])}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child{{text-align:left;white-space:nowrap}}img{{max-width:100%}}</style>
</head><body>
<h1>odmactl capacity</h1>
{headline}
{warned}
<p><code>{esc(t['path'])}</code>: {t['requests']:,} requests at {t['mean_rate_per_s']:,.3f} req/s; {esc(doc['model'])} on
{esc(doc['device'])}; predictor <code>{esc(doc['predictor'])}</code>; engine {esc(str(doc['scheduler'].get('engine')))};
arrivals: {esc(doc.get('arrivals', {}).get('label', "the trace's own gaps"))}. SLO: <b>{esc(doc['slo_label'])}</b>; odma and s3 at most
{format_metric('overflow_rate', doc['max_migration_rate'])} overflows (migrations + preemptions) per request. Rates bracketed to {doc['tolerance']:.0%} by replay;
devices for {esc(target)} found by replaying replicas together behind {esc(routers_words(doc))}.</p>
<table><tr><th>policy</th>{head}</tr>{body}</table>
{routed}
{f'<ul>{notes}</ul>' if notes else ''}
<h2>Latency against offered rate per engine (every probe of the bisection)</h2>
<img src="data:image/png;base64,{_png(capacity_figure(doc))}">
</body></html>
"""
    path.write_text(text, encoding="utf-8")

