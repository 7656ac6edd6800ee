"""What plan's console output and HTML report say in words: the headline, the held-out table's
title with the gate's bounds, why no config was written, and the config's opening comment."""

from __future__ import annotations

from odmactl.core.units import format_bytes, format_seconds
from odmactl.render.metrics import METRICS, format_metric
from odmactl.render.tables import deployment
from odmactl.render.warnings import plan_warnings


def plan_headline(doc: dict) -> list[tuple[str, str]]:
    """What plan's output says first, as (style, plain line) pairs: requests the deployment cannot
    serve whole and what fixes it, which policy wins on the held-out part by the objective and how
    the recommendation compares with each, latency regressions against static, the gate's outcome
    and overloads. The console and the HTML report print the same lines."""
    lines: list[tuple[str, str]] = []
    pick = "the recommended odma" if doc["holds"] else "odma's closest candidate"
    fit = doc["pool_fit"]
    if fit["over_max_model_len"] > 0:
        why = fit["limit"]
        line = (f"{fit['over_max_model_len']:.1%} of the requests do not fit max_model_len {fit['max_model_len']:,} "
                f"({why}): {fit['rejected_prompt']:.1%} are rejected (prompt at or past it), the rest truncated; "
                f"the longest needs {fit['longest_tokens']:,} KV tokens")
        if fit["over_pool"] > 0:
            line += f"; {fit['over_pool']:.1%} need more than the whole pool"
        if fit["options"]:
            line += "; " + ", ".join(f"--tp {o['tp']}: {o['pool_tokens']:,} tokens, " +
                                     ("all fit" if o["over_half_pool"] == 0 else f"{o['over_half_pool']:.1%} too long")
                                     for o in fit["options"])
        if fit["limited_by_pool"] and not any(o["over_half_pool"] == 0 for o in fit["options"]):
            line += f"; {MORE_MEMORY}"
        lines.append(("bold yellow", line))
    v = doc["verdict"]
    metric = v["metric"]
    title = METRICS[metric].title + (f" ({METRICS[metric].unit})" if METRICS[metric].unit not in ("", "%") else "")
    def versus(name: str, a: dict) -> str:
        if not a["comparable"]:
            return f"{name} {format_metric(metric, a['value'])} (no contest: {a['unserved']:,} rejected or truncated)"
        change = "" if a["odma_change"] is None else f" ({format_metric('tps_gain', a['odma_change'])} for odma)"
        return f"{name} {format_metric(metric, a['value'])}{change}"

    against = "; ".join(versus(name, a) for name, a in v["against"].items() if name != v["best"])
    if v["odma_is_best"] and v["tied_with"]:
        lines.append(("bold yellow", f"{pick} ties for best on the held-out part by {title} with "
                                     f"{', '.join(v['tied_with'])}: odma {format_metric(metric, v['odma_value'])}; "
                                     f"{against}"))
    elif v["odma_is_best"]:
        lines.append(("bold green", f"{pick} is best on the held-out part by {title}: "
                                    f"{format_metric(metric, v['odma_value'])}; {against}"))
    else:
        lines.append(("bold red", f"{v['best']} is best on the held-out part by {title}, not odma: {v['best']} "
                                  f"{format_metric(metric, v['best_value'])} against {pick}'s "
                                  f"{format_metric(metric, v['odma_value'])}; {against}"))
    if metric != "kv_utilization":  # what the memory does, next to the objective
        shares = "; ".join(f"{name} {format_metric('kv_utilization', r['metrics']['kv_utilization'])}"
                           for name, r in doc["validation"].items() if name != "odma")
        lines.append(("default", f"KV utilization on the held-out part: odma "
                                 f"{format_metric('kv_utilization', doc['validation']['odma']['metrics']['kv_utilization'])}"
                                 f"; {shares}"))
    for r in v["regressions_vs_static"]:
        lines.append(("bold yellow", f"latency regression against static: odma's {METRICS[r['metric']].title} "
                                     f"{METRICS[r['metric']].in_words(r['odma'])} against "
                                     f"{METRICS[r['metric']].in_words(r['static'])}"))
    gate = doc["gate"]
    checks = "; ".join(x["text"] for x in gate["verdicts"])
    if gate["passed"]:
        lines.append(("green", f"gate on the held-out part ([thresholds], as `check` runs it): PASS: {checks}"))
    else:
        lines.append(("bold red", f"gate on the held-out part ([thresholds], as `check` runs it): FAIL: {checks}"))
    if not doc["constraints_met_on_search"] and doc["holds"]:
        lines.append(("bold yellow", "on the search part no replayed candidate met every constraint with the margin "
                                     "for sampling noise; the closest passes the gate on the held-out part and is "
                                     "recommended"))
    elif not doc["constraints_met_on_search"]:
        lines.append(("bold red", "on the search part no replayed candidate met every constraint; the closest "
                                  f"missed: {'; '.join(doc['unmet_on_search']) or 'the margin for sampling noise'}"))
    lines += [("yellow", f"warning: {line}") for line in plan_warnings(doc)]
    return lines


def search_counts(doc: dict) -> str:
    """How many candidates the search had and what became of them: the cheap bounds prune the
    estimates past the overflow limit, candidates estimated alike count once (bounds.distinct), and
    the best of the rest by the bounds are replayed; where all were pruned, the closest to the
    limit are (plan/search.py)."""
    n, pruned, replayed = doc["candidates"], doc["pruned"], doc["replayed"]
    if doc.get("all_pruned"):
        return (f"{n:,} candidates, all pruned by the cheap bounds: the {replayed} closest to the overflow limit "
                "replayed")
    left, different = n - pruned, doc.get("distinct", n - pruned)
    head = f"{n:,} candidates: {pruned:,} pruned by the cheap bounds" if pruned else \
        f"{n:,} candidates, none pruned by the cheap bounds"
    pool = f"the {left:,} left" if pruned else "them"
    alike = f"; {different:,} of {pool} estimate differently (the rest tie with one of those)" if different < left else ""
    if replayed >= different:
        which = f"all {replayed:,} were replayed" if replayed > 1 else "it was replayed"
    else:
        which = "the best one by the bounds was replayed" if replayed == 1 else \
            f"the best {replayed} by the bounds were replayed"
    return f"{head}{alike}, and {which}"


def search_limits(doc: dict) -> str:
    """The limits plan's search held its candidates to, as the console and the report say them."""
    text = f"overflow rate + 1 s.e. <= {METRICS['overflow_rate'].text(doc['max_overflow_rate'], precise=True)}"
    if doc["ttft_p99_s"]:
        text += f", TTFT p99 <= {METRICS['ttft_p99'].in_words(doc['ttft_p99_s'], precise=True)}"
    return text


def holdout_title(doc: dict) -> str:
    """The held-out table's title, with the gate's bounds."""
    g = doc["gate"]["thresholds"]
    bound = {key: METRICS[key].text(g[name], precise=True) for key, name in
             (("overflow_rate", "max_overflow_rate"), ("rejection_rate", "max_rejection_rate"),
              ("kv_utilization", "min_utilization"))}
    return (f"on the held-out later part (gate: overflow rate <= {bound['overflow_rate']}, "
            f"rejected <= {bound['rejection_rate']}, KV util >= {bound['kv_utilization']}):")


MORE_MEMORY = "a device with more memory serves more of them"


def tp_advice(fit: dict) -> str | None:
    """The tensor-parallel size that serves every request whole (plan/search.pool_fit's options),
    else the best one and MORE_MEMORY; None without options."""
    options = fit["options"]
    if not options:
        return None
    whole = next((o for o in options if o["over_half_pool"] == 0), None)
    if whole is not None:
        return f"--tp {whole['tp']} ({whole['pool_tokens']:,} KV tokens) serves every request whole"
    best = min(options, key=lambda o: o["over_half_pool"])
    return f"--tp {best['tp']} ({best['pool_tokens']:,} KV tokens) leaves {best['over_half_pool']:.1%} too long; {MORE_MEMORY}"


def unmet(doc: dict) -> str:
    """What keeps plan from writing its pick: the held-out gate's failed verdicts, else what the
    pick missed on the search part."""
    failed = [x["text"] for x in doc["gate"]["verdicts"] if not x["passed"]]
    return f"fails plan's own gate on the held-out part: {'; '.join(failed)}" if failed else \
        f"missed on the search part: {'; '.join(doc['unmet_on_search'])}"


def failure_message(doc: dict, out_path=None) -> str:
    """Why plan wrote no config: the constraints that fail and the candidate that came closest."""
    where = unmet(doc)
    fit, fix = doc["pool_fit"], ""
    advice = tp_advice(fit)
    if advice is not None and fit["over_max_model_len"] > 0:
        fix = f" ({fit['over_max_model_len']:.1%} of the requests do not fit; {advice})"
    written = "no config written" + (f" to {out_path}" if out_path is not None else "")
    return f"{written}: the closest candidate, {doc['chosen']['label']}, {where}{fix}{_ttft_where(doc)}"


def _ttft_where(doc: dict) -> str:
    """Where --ttft-p99 failed on a replay whose queue grew, what it was judged at: the trace's own
    rate on one engine, where TTFT is the backlog's, not a serving latency (a new user asked for
    2 s and read 2,097 s); the way to plan for a latency at a rate one engine serves."""
    queue = doc["validation"]["odma"].get("queue", {})
    if doc.get("ttft_p99_s") is None or not queue.get("overloaded") or \
            not any(s.startswith("TTFT p99") for s in doc.get("unmet_on_search", [])):
        return ""
    found = queue.get("sustainable") or {}
    keeps = f" (odma keeps up at {found['rate_scale']:.3g}x it)" if found.get("rate_scale") else ""
    return (f". --ttft-p99 is judged at the trace's own rate on one engine, which does not keep up{keeps}, so its "
            "TTFT p99 is the backlog's; for a latency limit at the rate an engine serves, plan with --objective "
            f"capacity --slo ttft_p99={format_seconds(doc['ttft_p99_s']).replace(' ', '')} (docs/plan.md)")


def config_heading(doc: dict) -> str:
    """The comment lines a config starts with."""
    return (f"odmactl plan: ODMA settings for {deployment(doc)}.\n"
            "[plan]: what it was planned for and expects (check, replay and capacity compare it with each run);\n"
            "[allocator], [scheduler], [thresholds]: what they apply; [engine.*]: the same in engines' terms\n"
            "(docs/plan.md: \"Applying a plan\").")


def stressed_pool(tuning: dict) -> str | None:
    """The smaller large pool plan/search._tune also replays each option with, in words (its size and
    its share of the planned pool); None where there was none (a planned pool of one block)."""
    size, stressed = tuning["large_pool_bytes"], tuning["stressed_large_pool_bytes"]
    if stressed is None:
        return None
    return f"{format_bytes(stressed)}, {stressed / size:.0%} of it"


def tuning_keys(tuning: dict) -> tuple[str, ...]:
    """The metrics `_tune` picks an option by: the objective's (none under capacity), then TTFT p99."""
    return tuple(k for k in (tuning["objective_metric"], "ttft_p99") if k is not None)


def tuning_rule(tuning: dict) -> str:
    """How `_tune` picked among the options (listed in a fixed order, not ranked), in words."""
    by = "picked by the worse of the two pools: " if stressed_pool(tuning) else "picked by "
    if tuning["objective_metric"] is None:  # the capacity objective ranks by TTFT p99
        return f"{by}the lower TTFT p99, then the Task Pool, then the spill"
    return (f"{by}the best {METRICS[tuning['objective_metric']].title}; within {tuning['objective_tie']:.1%} of it, "
            "the lower TTFT p99, then the Task Pool, then the spill")
