"""Console output of replay, check, plan and capacity: the policies side by side, a metric per row."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from odmactl.allocator import ALLOCATORS
from odmactl.core.units import format_bytes, format_seconds
from odmactl.render.metrics import (
    CAPACITY_DEVICES,
    METRICS,
    REPLAY_IF_ANY,
    REPLAY_KEYS,
    capacity_keys,
    compared,
    format_metric,
    metric_rows,
    plan_keys,
    slo_latencies,
)
from odmactl.render.plan_text import (holdout_title, plan_headline, search_counts, search_limits, stressed_pool,
                                      tuning_keys, tuning_rule)
from odmactl.render.tables import check_scope, deployment, fits, narrow_table, print_warnings, print_wrapped
from odmactl.render.warnings import capacity_warnings, check_warnings, replay_warnings
from odmactl.run.serving import static_legend
from odmactl.sim.metrics import LATENCY_METRICS

LABEL_CHARS = 16  # the metric column of a policies table wraps past this


def _sized_by(sized_by: str) -> str:
    """plan's large-pool sizing rule (plan/search._tune's `sized_by`), in words."""
    return "the peak of large blocks held" if sized_by == "peak" else "the large blocks' share of block-token-time"


def _print_tuning(console: Console, doc: dict) -> None:
    """plan's scheduler and spill options on the search part (plan/search._tune): what ranked them,
    then one row each with the metric the objective ranks them by (none under capacity) and TTFT
    p99, with the planned large pool and, where `_tune` replayed one, with the smaller pool."""
    t = doc["tuning"]
    smaller = stressed_pool(t)
    keys = tuning_keys(t)
    headers = [METRICS[k].header for k in keys]
    if smaller is not None:
        headers += [f"{METRICS[k].header}, smaller pool" for k in keys]
    rows = [[f"{o['scheduler']}{' + spill' if o['large_spill'] else ''}{' (chosen)' if o['chosen'] else ''}"]
            + [format_metric(k, o[k]) for k in keys]
            + ([format_metric(k, o["stressed"][k]) for k in keys] if smaller is not None else [])
            for o in t["options"]]
    pools = (f"with the planned large pool and with a smaller one ({smaller})" if smaller else
             "with the planned large pool (one largest block: no smaller one to try)")
    print_wrapped(console, f"the options on the search part, {pools}, {tuning_rule(t)}:", "default")
    console.print(narrow_table(None, tuple(headers), rows, key="option"))


def _print_policies(console: Console, results: dict, keys: tuple[str, ...], title: str | None = None) -> None:
    """Policies side by side, a metric per row (render/metrics.py writes the values), in narrow
    tables: as many policies in each as the console's width holds, so no value is cut at 80
    columns or in a pipe."""
    names = list(results)
    rows = metric_rows(results, keys)
    label = min(max(len(r[0]) for r in rows), LABEL_CHARS)
    widths = [max([len(w) for w in name.split()] + [len(r[j + 1]) for r in rows]) for j, name in enumerate(names)]
    groups: list[list[int]] = [[]]
    used = label
    for j, width in enumerate(widths):
        if groups[-1] and used + width + 2 > console.width:
            groups.append([])
            used = label
        groups[-1].append(j)
        used += width + 2
    for n, group in enumerate(groups):
        console.print(narrow_table(title if n == 0 else None, tuple(escape(names[j]) for j in group),
                                   [[r[0]] + [r[j + 1] for j in group] for r in rows], key="metric"))


def schedulers(doc: dict) -> str:
    """The scheduler the run named, else each policy's own ("odma: task_pool, paged: fcfs")."""
    if doc["scheduler"].get("policy"):
        return doc["scheduler"]["policy"]
    ran = {p: r.get("scheduler") for p, r in doc["results"].items()}
    if len(set(ran.values())) == 1:
        return str(next(iter(ran.values())))
    return ", ".join(f"{p}: {s}" for p, s in ran.items())


def _caps(scheduler: dict) -> dict:
    return {k: scheduler.get(k) for k in ("engine", "max_num_seqs", "max_num_batched_tokens", "prefix_caching")}


def _block(tokens) -> str:
    """A large block's size as [engine.odma] says it: a token count, or "prompt + N, at most M"."""
    return f"{tokens:,}" if isinstance(tokens, int) else str(tokens)


def engine_caps(engine: str, max_num_seqs: int, max_num_batched_tokens: int, prefix_caching: bool | None = None) -> str:
    """The engine a command replayed, its batch caps and whether it cached prefixes, as every
    command's console says them."""
    caching = "" if prefix_caching is None else f", prefix caching {'on' if prefix_caching else 'off'}"
    return f"engine {engine} (max_num_seqs {max_num_seqs:,}, max_num_batched_tokens {max_num_batched_tokens:,}{caching})"


def render_replay(console: Console, doc: dict) -> None:
    t = doc["trace"]
    console.print(f"[bold]{escape(t['path'])}[/]: {t['requests']:,} requests ({t['arrivals']}), "
                  f"{escape(deployment(doc))}; KV pool {format_bytes(doc['kv_pool_bytes'])} = "
                  f"{doc['kv_pool_bytes'] // doc['kv_bytes_per_token']:,} tokens; max_model_len {doc['max_model_len']:,}; "
                  f"predictor {escape(doc['predictor'])}; {escape(engine_caps(**_caps(doc['scheduler'])))}, "
                  f"scheduler {escape(schedulers(doc))}; "
                  f"{doc['time_advance']}", highlight=False)
    new_tokens = doc["scheduler"].get("max_new_tokens")
    settings = []
    if new_tokens:
        settings.append(f"outputs capped at {new_tokens:,} new tokens (max_new_tokens, vLLM's max_tokens)")
    for policy, r in doc["results"].items():  # what each policy says of its settings (Allocator.describe)
        said = ALLOCATORS[policy].describe(r["config"]) if policy in ALLOCATORS else None
        if said:
            settings.append(said)
    if doc["scheduler"].get("prefix_caching") and not t.get("prefix_hashes", True):
        settings.append("prefix caching is on, but the trace has no prefix hashes: nothing is cached (a trace with "
                        "Mooncake's hash_ids has them)")
    elif doc["scheduler"].get("prefix_caching") and not any("prefix_hit_rate" in r["metrics"]
                                                            for r in doc["results"].values()):
        settings.append("prefix caching is on, but none of these policies caches prefixes (paged does)")
    if settings:
        console.print(escape("; ".join(settings)), highlight=False)
    shown = tuple(k for k in REPLAY_IF_ANY if any(r["metrics"].get(k) for r in doc["results"].values()))
    _print_policies(console, doc["results"], REPLAY_KEYS + shown)
    for policy, r in doc["results"].items():
        m = r["metrics"]
        extra = []
        if m["truncated"]:
            limit = "max_model_len" + (f" or max_new_tokens ({new_tokens:,})" if new_tokens else "")
            extra.append(f"{m['truncated']:,} outputs truncated at {limit}")
        for key, note in r["notes"].items():
            extra.append(f"{key.replace('_', ' ')}: {note}")
        counters = r["allocator"]["policy_counters"]
        totals = [f"{key.replace('_', ' ')} {counters[key]:,}" for key in r["allocator"].get("policy_totals", ())
                  if counters.get(key)]
        if totals:
            extra.append(", ".join(totals))
        if extra:
            console.print(escape(f"{policy}: " + "; ".join(extra)), highlight=False)
    measured = {p: r["on_device"] for p, r in doc["results"].items() if "on_device" in r}
    if measured:
        _render_on_device(console, measured)
    print_warnings(console, replay_warnings(doc))


def _render_on_device(console: Console, measured: dict[str, dict]) -> None:
    """Measured against modelled step time per policy, over every iteration and over the
    decode-only ones, and the least-squares terms of each side's decode-only steps."""
    first = next(iter(measured.values()))
    console.print(escape(f"on device: {first['device_name']} ({first['torch_device']}, torch {first['torch']}), "
                         f"model {first['model']}; modelled with profile {first['profile']}"), highlight=False)
    elsewhere = first.get("profile_measured_on")
    if elsewhere and elsewhere != first["device_name"]:
        console.print(escape(f"warning: profile {first['profile']} was measured on {elsewhere}, not on this device: "
                             f"the modelled side describes that machine (odmactl calibrate measures this one)"),
                      style="yellow", highlight=False)
    table = Table(show_header=True, header_style="bold")
    table.add_column("step time")
    for policy in measured:
        table.add_column(escape(policy), justify="right")
    for title, key in (("decode steps", "decode_steps"), ("mixed steps (+ prompt chunks)", "mixed_steps"),
                       ("prefill steps", "prefill_steps")):
        table.add_row(title, *(f"{m[key]:,}" for m in measured.values()))
    rows = [("measured total (s)", "measured_s", "{:.4g}"), ("modelled total (s)", "modelled_s", "{:.4g}"),
            ("total error", "total_error", "{:+.1%}"), ("per-step error p50", "step_error_p50", "{:+.1%}"),
            ("per-step |error| p90", "step_abs_error_p90", "{:.1%}")]
    for part, label in (("all_steps", "all"), ("decode_only", "decode"), ("mixed_only", "mixed")):
        for title, key, fmt in rows:
            table.add_row(f"{label}: {title}", *(fmt.format(m[part][key]) if m[part]["steps"] else "-"
                                                 for m in measured.values()))
    # the least-squares terms of each side's decode-only steps (ondevice.step_time_fit)
    for title, fit_key, key, scale in (("fit: fixed ms, measured", "measured_fit", "fixed_s", 1e3),
                                       ("fit: fixed ms, modelled", "modelled_fit", "fixed_s", 1e3),
                                       ("fit: KV GB/s, measured", "measured_fit", "kv_bytes_per_s", 1e-9),
                                       ("fit: KV GB/s, modelled", "modelled_fit", "kv_bytes_per_s", 1e-9)):
        fits = [m.get(fit_key) for m in measured.values()]
        table.add_row(title, *("-" if not f or f[key] is None else f"{f[key] * scale:.4g}" for f in fits))
    console.print(table)


def render_check(console: Console, doc: dict, policy: str, verdicts: list, passed: bool) -> None:
    """The verdict per threshold, then the replayed policies' metrics."""
    console.print(escape(f"{doc['trace']['path']}: {check_scope(doc, policy)}, policy {policy}, "
                         f"predictor {doc['predictor']}"), highlight=False)
    rows = [(v.name, v.metric, f"{v.comparison} {v.threshold_text}", v.value_text, "pass" if v.passed else "FAIL")
            for v in verdicts]
    headers = ("check", "metric", "threshold", "value", "result")
    # as render/tables.narrow_table's: no vertical rules, every cell whole
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for j, title in enumerate(headers):
        table.add_column(title, justify="left" if j < 2 else "right", no_wrap=True)
    for r in rows:
        table.add_row(*(escape(c) for c in r[:4]), "[green]pass[/]" if r[4] == "pass" else "[bold red]FAIL[/]")
    if fits(console, table):
        console.print(table)
    else:  # a table that does not fit would cut a check's name or fold a figure mid-number: a line each
        for v, r in zip(verdicts, rows):
            print_wrapped(console, f"{r[4]}  {v.name}: {v.text}", "green" if v.passed else "bold red")
    _print_policies(console, doc["results"], REPLAY_KEYS)
    print_warnings(console, check_warnings(doc, policy, verdicts))
    console.print("[bold green]PASS[/]" if passed else
                  f"[bold red]FAIL[/]: {sum(not v.passed for v in verdicts)} of {len(verdicts)} thresholds violated")


def render_plan(console: Console, doc: dict, written: list[str]) -> None:
    """The headline (`plan_headline`), the recommendation, then every policy on the held-out part."""
    for style, line in plan_headline(doc):
        print_wrapped(console, line, style)
    t = doc["trace"]
    print_wrapped(console, f"{t['path']}: {t['requests']:,} requests, {deployment(doc)}, predictor {doc['predictor']}; "
                      f"searched on the first {t['search_requests']:,}, validated on the last {t['holdout_requests']:,}",
             "default")
    print_wrapped(console, f"{search_counts(doc)}; objective {doc['objective']}, {search_limits(doc)}", "default")
    a = doc["chosen"]["allocator"]
    bounds = a["boundaries_tokens"]
    merged = f" ({a['num_buckets'] - len(bounds)} of B merged: equal after rounding)" if len(bounds) < a["num_buckets"] else ""
    shown = f"boundaries {bounds} tokens{merged}" if len(bounds) <= 16 else \
        f"{len(bounds)} boundaries{merged} from {bounds[0]:,} to {bounds[-1]:,} tokens (all in the config)"
    large, blocks = doc["chosen"]["large_pool_bytes"], doc["chosen"]["large_pool_blocks"]
    what = "recommended" if doc["holds"] else "closest candidate (no config written)"
    print_wrapped(console, f"{what}: {doc['chosen']['label']}; {shown}; max_model_len "
                      f"{doc['max_model_len']:,}; large pool {large / doc['kv_pool_bytes']:.1%} of the KV pool "
                      f"({blocks:,} block{'s' if blocks != 1 else ''} of {_block(doc['chosen']['large_block_tokens'])} "
                      f"tokens, sized after the search from {_sized_by(doc['tuning']['sized_by'])}, at least one "
                      f"block; the label's large= is the pool it was searched with); {engine_caps(doc['engine'], doc['max_num_seqs'], doc['max_num_batched_tokens'], doc.get('prefix_caching'))}, "
                      f"scheduler {doc['scheduler']} {'with' if doc['tuning']['large_spill'] else 'without'} large_spill "
                      f"(the best of {len(doc['tuning']['options'])} scheduler and spill options on the search part)",
             "bold")
    _print_tuning(console, doc)
    if doc["objective"] == "capacity":
        chosen = next(r for r in doc["search"]["replays"] if r["label"] == doc["chosen"]["label"])
        limits = ", ".join(f"{m} <= {format_seconds(v)}" for m, v in doc["slo"].items())
        console.print(escape(f"capacity objective: the pick sustains {chosen['measured']['capacity_rate_scale']:.3f}x the "
                             f"search part's arrival rate within {limits} (bisected by replay)"), highlight=False)
    keys = plan_keys(doc["objective"])
    print_wrapped(console, holdout_title(doc), "default")
    _print_policies(console, doc["validation"], keys)
    legend = static_legend(doc["validation"])
    if legend:
        print_wrapped(console, legend, "default")
    console.print(escape(f"wrote {', '.join(written)}" if written else "wrote nothing"), highlight=False)


def capacity_value(row: dict, key: str, slo: dict | None = None) -> str:
    """A capacity row's value for `key`: the row's own figure, or a latency at the capacity, to the
    digits that keep it on its side of the SLO's limit for it (`slo`; render/metrics.compared: a
    TPOT p50 of 5.4587 ms under a 5.46 ms limit read 5.5)."""
    if row["rate_scale"] is None and key not in ("rejected_never_fit", "devices_for_target"):
        return "none" if key == "max_rate_per_replica" else "-"
    value = row["metrics_at_capacity"][key] if key in LATENCY_METRICS else row[key]
    if value is None:
        return "none" if key == "devices_for_target" else "n/a"
    if slo and key in slo:
        return compared(key, value, slo[key], unit=False)[0]
    return format_metric(key, value)


def routers_words(doc: dict, short: bool = False) -> str:
    """The router the devices are for: the one --router named, or, with several, each row's that
    needs the fewest (capacity/search.fewest_router). `short`: for a table's title."""
    routers = doc["routers"]
    if len(routers) == 1:
        return f"{routers[0]} router" if short else f"the {routers[0]} router"
    if short:
        return f"the fewest over {len(routers)} routers"
    return (f"the router that needs the fewest, each row's, of {', '.join(routers)} (among ties, the lower "
            "latencies at the target)")


KEPT = "*"  # router_table's mark of the router a row keeps
ROUTER_TABLE_TITLE = f"Devices for the target behind each router ({KEPT}: the row's, the fewest; among ties, the lower latencies)"


def router_table(doc: dict) -> tuple[list[str], list[list[str]]] | None:
    """With several routers: (the headers, a row per policy and tp) of the devices each router
    needs for the target ("none": not within --max-replicas engines), the row's router marked
    `KEPT`; None with one router."""
    routers = doc["routers"]
    if len(routers) < 2:
        return None
    rows = [[f"{r['policy']} tp {r['tp']}",
             *(("none" if (n := r["devices_by_router"][router]) is None else format_metric("devices_for_target", n))
               + (KEPT if router == r["router"] and n is not None else "") for router in routers)] for r in doc["rows"]]
    return ["policy", *routers], rows


def _caps_for(doc: dict) -> dict:
    """The engine caps a capacity run states; prefix caching only where the trace has hashes."""
    caps = _caps(doc["scheduler"])
    if not doc["trace"].get("prefix_hashes", True):
        caps["prefix_caching"] = None
    return caps


def _headline_row(doc: dict) -> dict | None:
    h = doc.get("headline")
    if not h:
        return None
    return next(r for r in doc["rows"] if r["policy"] == h["policy"] and r["tp"] == h["tp"])


TARGET_PEAK_SLACK = 1.25  # a replayed peak this far from the target is said under the headline


def headline_detail(doc: dict) -> list[str]:
    """Under the headline: what the target is and the rate the trace is replayed at (and how fast
    its own busiest 10 minutes then arrive, when that is more than TARGET_PEAK_SLACK times off),
    its latencies at the target (the headroom to the SLO), and why its engines times one engine's
    rate is not the target, in this run's numbers."""
    row = _headline_row(doc)
    if row is None:
        return []
    lines = []
    target, replayed = doc["target_rate_per_s"], doc.get("target_replay_peak_10min_rate_per_s")
    if replayed is not None:
        speedup = target / doc["trace"]["mean_rate_per_s"]
        text = (f"the target, {target:,.3g} req/s, is " + ("the trace's busiest 10 minutes (--target-rate sets another)"
                                                          if doc.get("target_is_peak") else "--target-rate's")
                + f"; it is a mean rate: the whole trace is replayed at {speedup:,.3g}x its own rate")
        if not 1 / TARGET_PEAK_SLACK <= replayed / target <= TARGET_PEAK_SLACK:
            text += (f", so its busiest 10 minutes arrive at {replayed:,.3g} req/s, {replayed / target:,.2g}x the "
                     "target: the devices are for that")
        lines.append(text)
    m = row.get("metrics_at_target") or {}
    slo = doc.get("slo", {})
    parts = []
    for metric in slo_latencies(slo):
        if m.get(metric) is not None:
            if metric in slo:  # to the digits that keep it on its side (79.19945 ms read 79.2 under 79.1995)
                parts.append(f"{metric} {compared(metric, m[metric], slo[metric])[0]} "
                             f"({1 - m[metric] / slo[metric]:.0%} under its limit)")
            else:
                parts.append(f"{metric} {METRICS[metric].in_words(m[metric])}")
    if parts:
        n = row["replicas_for_target"]
        lines.append(f"at the target on {'that engine' if n == 1 else f'those {n} engines'}: " + ", ".join(parts))
    rate, replicas = row["max_rate_per_replica"], row["replicas_for_target"]
    if rate is None:
        lines.append(f"one engine meets the SLO at no rate, yet {replicas} engines carry the target: the router splits "
                     "what one engine could not absorb")
    elif replicas * rate < target:
        lines.append(f"{replicas} engines x {format_metric('max_rate_per_replica', rate)} req/s (one engine's rate on the "
                     f"whole trace) = {format_metric('max_rate_per_replica', replicas * rate)} < {target:,.3g} req/s: "
                     "each engine sees about 1/R of the trace, its bursts split by the router, so R engines carry more "
                     "than R times one engine's rate")
    elif (replicas - 1) * rate >= target:
        lines.append(f"{replicas} engines although {replicas - 1} x {format_metric('max_rate_per_replica', rate)} req/s "
                     f"covers {target:,.3g} req/s: the target replays the busiest part of the trace, whose bursts one "
                     "engine fewer does not absorb")
    else:
        lines.append(f"{replicas} engine{'s' if replicas != 1 else ''} x {format_metric('max_rate_per_replica', rate)} req/s = "
                     f"{format_metric('max_rate_per_replica', replicas * rate)} >= {target:,.3g} req/s: the target rounded "
                     "up to whole engines")
    return lines


def capacity_headline(doc: dict) -> str | None:
    """The answer first: the cheapest row for the target, its ties and its savings."""
    h = doc.get("headline")
    if not h:
        return None
    engines = f"{h['replicas']} engine{'s' if h['replicas'] != 1 else ''} of tp {h['tp']}"
    text = (f"cheapest for {doc['target_rate_per_s']:,.3g} req/s: {h['devices']} x {doc['device']} ({engines}) "
            f"running {h['policy']}")
    if len(doc["routers"]) > 1:
        text += f" behind {h['router']}"
    if h["ties"]:
        text += f"; as few with {', '.join(h['ties'])} (ties decided by fewer engines, then latency at the target)"
    for key, name in (("vs_static", "static"), ("vs_paged", "paged")):
        other = h.get(key)
        if other is not None and other["saved"] > 0:
            behind = f", {other['router']}" if len(doc["routers"]) > 1 else ""
            text += f"; {other['policy']} needs {other['devices']} (tp {other['tp']}{behind}), {other['saved']} more"
    return text


def infeasible_lines(doc: dict) -> list[str]:
    """Per tp, the rows where one engine meets the SLO at no rate, with the first one's failure and
    the floor's cause (the same for every policy at a tp), and what the replicas did."""
    lines = []
    for tp in dict.fromkeys(r["tp"] for r in doc["rows"]):
        none = [r for r in doc["rows"] if r["tp"] == tp and r["infeasible"]]
        if not none:
            continue
        names = ", ".join(r["policy"] for r in none)
        replicas = [r for r in none if r["devices_for_target"] is not None]
        after = (f"; behind the router, enough engines still meet it at the target for "
                 f"{', '.join(r['policy'] for r in replicas)} (the router splits what one engine could not absorb: "
                 "devices in the table)") if replicas else ""
        cause = f"; {none[0]['floor_cause']}" if none[0]["floor_cause"] else ""
        lines.append(f"tp {tp}: one engine meets the SLO at no rate for {names} ({none[0]['policy']}: "
                     f"{none[0]['infeasible']}){cause}{after}")
    return lines


def queue_lines(doc: dict) -> list[str]:
    """Per tp, where the SLO (not the queue) binds one engine: the rate its queue keeps up with (the
    rate plan's and replay's overload test reports) against the rate that meets the SLO, so that a
    plan that keeps up on a device and a capacity answer of many more do not contradict each other."""
    lines = []
    tolerance = doc["tolerance"]
    for tp in dict.fromkeys(r["tp"] for r in doc["rows"]):
        within, keeping = [], []
        for r in (r for r in doc["rows"] if r["tp"] == tp):
            keeps, slo = r.get("keeps_up_rate_per_replica"), r["max_rate_per_replica"]
            if keeps and slo is not None and keeps > (1 + tolerance) * slo:  # no rate: said by headline_detail
                within.append(f"{r['policy']} {format_metric('max_rate_per_replica', slo)}")
                keeping.append(f"{r['policy']} {format_metric('max_rate_per_replica', keeps)}")
        if within:
            lines.append(f"tp {tp}: the SLO binds, not the queue: one engine meets the SLO up to {', '.join(within)} "
                         f"req/s, while its queue keeps up with {', '.join(keeping)} req/s (the rate replay's and "
                         "plan's overload warning gives)")
    return lines


def binding_lines(doc: dict) -> list[str]:
    """What binds: memory per tp, the limit that breaks above each row's rate, and why devices x
    rate need not give the target (the warnings are render/warnings.capacity_warnings)."""
    lines = []
    for tp, binds in doc.get("memory_binds", {}).items():
        devices = sorted({r["devices_for_target"] for r in doc["rows"] if str(r["tp"]) == tp} - {None})
        if all(r["max_rate_per_replica"] is None for r in doc["rows"] if str(r["tp"]) == tp):
            lines.append(f"tp {tp}: no policy has a rate for one engine, so memory is not judged there"
                         + (f" (devices for the target: {devices[0]}-{devices[-1]})" if devices else ""))
            continue
        if sum(str(r["tp"]) == tp for r in doc["rows"]) < 2:
            continue  # one policy at this tp: nothing to compare it with, so nothing said of memory
        spread = (f"; devices for the target still differ by policy ({devices[0]}-{devices[-1]}: the router and each "
                  "policy's KV layout in the step time)") if len(devices) > 1 else ""
        static = any(r["policy"] == "static" for r in doc["rows"] if str(r["tp"]) == tp)
        if binds:
            lines.append(f"tp {tp}: memory binds (" + ("static at max_model_len serves less than the best"
                                                       if static else "the policies' rates per engine differ") + ")")
        elif doc.get("rates_differ", {}).get(tp):
            lines.append(f"tp {tp}: memory does not bind one engine (static at max_model_len within "
                         f"{doc['tolerance']:.0%} of the best): the rates that differ differ by the policies' step times "
                         f"(paged reads blocks){spread}")
        else:
            lines.append(f"tp {tp}: memory does not bind one engine (every policy within {doc['tolerance']:.0%}): "
                         f"choose by latency or simplicity{spread}")
    lines += queue_lines(doc)
    breaks: dict[str, list[str]] = {}
    for r in doc["rows"]:
        if r.get("breaks_above"):
            breaks.setdefault(", ".join(r["breaks_above"]), []).append(f"{r['policy']} tp {r['tp']}")
    for what, where in breaks.items():
        lines.append(f"above the rate found, {what} breaks first: {', '.join(where)}")
    over = [f"{r['policy']} tp {r['tp']}" for r in doc["rows"] if r["devices_for_target"] is None]
    if over:
        lines.append(f"no devices for the target within --max-replicas engines for {', '.join(over)}: more engines "
                     "than that, or none meets it")
    lines += gate_lines(doc)
    lines.append("devices for the target come from replaying the target traffic on that many engines behind "
                 f"{routers_words(doc)}; the rate per engine is one engine on the whole trace")
    return lines


def gate_lines(doc: dict) -> list[str]:
    """Where a row's rate per engine as printed is not one at which one engine met the SLO (at the
    SLO's edge it holds at one rate and breaks 0.2% below it), the check flags that gate one engine
    at a rate that held (capacity/search.gate_rate); nothing where every printed rate held, nor
    under drawn arrivals (`--arrivals poisson`: check replays the trace's own gaps)."""
    if doc.get("arrivals", {}).get("process", "trace") != "trace":
        return []
    gates, none, rated = [], [], 0
    for r in doc["rows"]:
        found, gate = r["max_rate_per_replica"], r.get("gate_rate_per_replica")
        if found is None:
            continue
        rated += 1
        if gate is None:
            tried = ", ".join(format_metric("max_rate_per_replica", t) for t in r.get("gate_rates_tried", []))
            none.append(f"{r['policy']} tp {r['tp']} (tried {tried})")
        elif format_metric("max_rate_per_replica", gate) != format_metric("max_rate_per_replica", found):
            gates.append(f"{r['policy']} tp {r['tp']}: {_check_flags(r)}--rate {format_metric('max_rate_per_replica', gate)}")
    lines = []
    if gates:
        rest = "; the other rows' rates held as printed" if len(gates) + len(none) < rated else ""
        which = "this row's rate" if len(gates) == 1 else "these rows' rates"
        lines.append(f"to gate one engine with check, give {'; '.join(gates)} (req/s): the SLO broke at {which} as "
                     f"printed, just below the rate found (at its edge it is not monotone in the rate){rest}; --json: "
                     "gate_rate_per_replica, gate_rates_tried")
    if none:
        lines.append(f"no rate as printed just below the rate found met the SLO for {', '.join(none)}: gate one engine "
                     "(check --rate) lower")
    return lines


def _check_flags(row: dict) -> str:
    """The flags `check` replays a capacity row's engine with, from what the row replayed: the
    policy, static's slot of prompt + N as --max-new-tokens N (run/spec.papers_static), the tp."""
    replayed = row["replayed_as"]
    cap = replayed["allocator"].get("max_new_tokens") if replayed["allocator"].get("static_slot") == \
        "prompt_plus_max_new" else None
    return (f"--policy {replayed['policy']} " + (f"--max-new-tokens {cap} " if cap else "")
            + (f"--tp {row['tp']} " if row["tp"] > 1 else ""))


def render_capacity(console: Console, doc: dict) -> None:
    """One row per policy and tp: the rate at the SLO per engine and per device, the latencies
    there, and the devices the target rate needs (found by replay)."""
    t = doc["trace"]
    console.print(escape(f"{t['path']}: {t['requests']:,} requests at {t['mean_rate_per_s']:,.3f} req/s "
                         f"(peak 10 min {t['peak_10min_rate_per_s']:,.3f}), {doc['model']} on {doc['device']}, "
                         f"predictor {doc['predictor']}, {engine_caps(**_caps_for(doc))}; arrivals: "
                         f"{doc['arrivals']['label']}; SLO {doc['slo_label']}"
                         f"{', overflow rate <= ' + format_metric('overflow_rate', doc['max_migration_rate'])}"
                         + (f"; outputs capped at {cap:,} new tokens" if (cap := doc['scheduler'].get('max_new_tokens'))
                            else "")),
                  highlight=False)
    said = capacity_headline(doc)
    if said:
        print_wrapped(console, said, "bold")
        for line in headline_detail(doc):
            console.print(escape(line), highlight=False)
    keys = capacity_keys(doc.get("slo", {}))
    rows = [[f"{r['policy']} tp {r['tp']}", *(capacity_value(r, k, doc["slo"]) for k in keys)] for r in doc["rows"]]
    target = f"{doc['target_rate_per_s']:,.3f} req/s" + (" (peak 10 min)" if doc["target_is_peak"] else "") \
        + f", {routers_words(doc, short=True)}"  # short: the title wraps to the table's width
    table = narrow_table(f"at the SLO; devices for {target}", tuple(METRICS[k].header for k in keys), rows,
                         key="policy")
    if fits(console, table):
        console.print(table)
    else:  # more latency columns than the width holds (an SLO on all four): the devices in a table of their own
        devices = len(CAPACITY_DEVICES)  # capacity_keys ends with them
        console.print(narrow_table("at the SLO", tuple(METRICS[k].header for k in keys[:-devices]),
                                   [r[:-devices] for r in rows], key="policy"))
        console.print(narrow_table(f"devices for {target}", tuple(METRICS[k].header for k in keys[-devices:]),
                                   [[r[0], *r[-devices:]] for r in rows], key="policy"))
    by_router = router_table(doc)
    if by_router is not None:
        headers, rows = by_router
        # a router's name wraps after its hyphens (narrow_table wraps headers between words): five fit 80 columns
        console.print(narrow_table(ROUTER_TABLE_TITLE, tuple(h.replace("-", "- ") for h in headers[1:]), rows,
                                   key="policy"))
    for r in doc["rows"]:
        hits = (r.get("metrics_at_capacity") or {}).get("prefix_hit_rate")
        if hits is not None and r["rate_scale"] is not None:  # "at its rate": a row with none has no such figure
            console.print(escape(f"{r['policy']} tp {r['tp']}: prefix hits {format_metric('prefix_hit_rate', hits)} of "
                                 "the prompt tokens at its rate (vLLM's prefix caching)"), highlight=False)
        if r["unbounded"]:
            console.print(escape(f"{r['policy']} tp {r['tp']}: the SLO held at every rate tried, up to the one shown "
                                 "(2**20 x the trace's); the trace is too short to load the engine there, so this is "
                                 "a lower bound"), highlight=False)
    for line in infeasible_lines(doc):
        console.print(escape(line), highlight=False)
    for line in binding_lines(doc):
        console.print(escape(line), highlight=False)
    print_warnings(console, capacity_warnings(doc))
    legend = static_legend(r["policy"] for r in doc["rows"])
    if legend:
        console.print(escape(legend), highlight=False)
    console.print(escape(f"rates bracketed to {doc['tolerance']:.0%}: the SLO holds at the rate found (rounded in "
                         "the table; exact in --json) and fails at the next one tried; rejected requests (never fit) "
                         "do not count against it"),
                  highlight=False)

