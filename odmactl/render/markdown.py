"""Markdown: the one table writer, and check's pull-request summary."""

from __future__ import annotations

import re
from pathlib import Path

from odmactl.render.metrics import CHECK_SUMMARY_KEYS, METRICS, metric_rows
from odmactl.render.tables import check_scope


def code(text: object) -> str:
    """`text` as a Markdown code span that no backtick in it can end (CommonMark: a fence longer
    than any run of backticks inside, padded where the text starts or ends with one)."""
    text = str(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    pad = " " if longest else ""
    return f"{'`' * (longest + 1)}{pad}{text}{pad}{'`' * (longest + 1)}"


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """GitHub-flavoured table lines (cells' pipes escaped)."""
    def cells(values: list[str]) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    return [cells(headers), "|" + "---|" * len(headers), *(cells(r) for r in rows)]


def check_markdown(verdicts: list, doc: dict, policy: str, config: Path | None, warnings: list[str]) -> str:
    """A pull-request summary: the verdict, the thresholds table, the compared policies' metrics,
    and `warnings` (the JSON's list: a noisy measured profile's, then render/warnings.check_warnings)."""
    passed = all(v.passed for v in verdicts)
    t = doc["trace"]
    lines = [f"### odmactl check: {'PASS' if passed else 'FAIL'}", "",
             f"{code(t['path'])}: {check_scope(doc, policy)}, policy {code(policy)}"
             + (f", config {code(config)}" if config else "") + f", predictor {code(doc['predictor'])}", ""]
    lines += markdown_table(["check", "metric", "threshold", "value", "result"],
                            [[v.name, v.metric, f"{v.comparison} {v.threshold_text}", v.value_text,
                              "pass" if v.passed else "**FAIL**"] for v in verdicts])
    measured = doc["results"][policy]["metrics"]  # a judged metric the replay reports (not a rate check derives)
    judged = tuple(dict.fromkeys(v.metric for v in verdicts
                                 if v.metric in METRICS and v.metric in measured and v.metric not in CHECK_SUMMARY_KEYS))
    lines += [""] + markdown_table(["metric", *doc["results"]],
                                   metric_rows(doc["results"], CHECK_SUMMARY_KEYS + judged))
    for line in warnings:
        lines += ["", f"> **warning:** {line}"]
    return "\n".join(lines) + "\n"


def capacity_markdown(doc: dict) -> str:
    """`odmactl capacity --markdown`: the headline, the table and what binds, for a pull request or
    a planning document (the same lines as the console and the HTML report)."""
    from odmactl.render.console_replay import (binding_lines, capacity_headline, capacity_value, headline_detail,
                                               infeasible_lines, ROUTER_TABLE_TITLE, router_table,
                                               routers_words)
    from odmactl.render.metrics import METRICS, capacity_keys
    from odmactl.render.warnings import listed_capacity_warnings

    t = doc["trace"]
    said = capacity_headline(doc)
    lines = ["### odmactl capacity", ""]
    if said:
        lines += [f"**{said}**", ""] + [f"{line}  " for line in headline_detail(doc)] + [""]
    lines += [f"{code(t['path'])}: {t['requests']:,} requests at {t['mean_rate_per_s']:,.3f} req/s; {doc['model']} on "
              f"{doc['device']}; predictor {code(doc['predictor'])}; engine {doc['scheduler'].get('engine')}; arrivals: "
              f"{doc.get('arrivals', {}).get('label', 'the trace')}; SLO {doc['slo_label']}; devices for "
              f"{doc['target_rate_per_s']:,.3f} req/s" + (" (the busiest 10 minutes)" if doc["target_is_peak"] else "")
              + f" behind {routers_words(doc)}", ""]
    keys = capacity_keys(doc.get("slo", {}))
    lines += markdown_table(["policy", *(METRICS[k].header for k in keys)],
                            [[f"{r['policy']} tp {r['tp']}", *(capacity_value(r, k, doc.get("slo")) for k in keys)]
                             for r in doc["rows"]])
    by_router = router_table(doc)
    if by_router is not None:
        lines += ["", ROUTER_TABLE_TITLE + ":", ""] + markdown_table(*by_router)
    notes = infeasible_lines(doc) + binding_lines(doc)
    if notes:
        lines += [""] + [f"- {line}" for line in notes]
    for line in listed_capacity_warnings(doc):
        lines += ["", f"> **warning:** {line}"]
    return "\n".join(lines) + "\n"
