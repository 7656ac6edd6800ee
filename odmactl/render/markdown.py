"""Markdown: the one table writer, and check's pull-request summary."""

from __future__ import annotations

from pathlib import Path

from odmactl.render.metrics import CHECK_SUMMARY_KEYS, metric_rows
from odmactl.render.tables import deployment
from odmactl.render.warnings import replay_warnings


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """GitHub-flavoured table lines (cells' pipes escaped)."""
    def cells(values: list[str]) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    return [cells(headers), "|" + "---|" * len(headers), *(cells(r) for r in rows)]


def check_markdown(verdicts: list, doc: dict, policy: str, config: Path | None) -> str:
    """A pull-request summary: the verdict, the thresholds table, and the compared policies' metrics."""
    passed = all(v.passed for v in verdicts)
    t = doc["trace"]
    lines = [f"### odmactl check: {'PASS' if passed else 'FAIL'}", "",
             f"`{t['path']}`: {t['requests']:,} requests, {deployment(doc)}, policy `{policy}`"
             + (f", config `{config}`" if config else "") + f", predictor `{doc['predictor']}`", ""]
    lines += markdown_table(["check", "metric", "threshold", "value", "result"],
                            [[v.name, v.metric, f"{v.comparison} {v.threshold_text}", v.value_text,
                              "pass" if v.passed else "**FAIL**"] for v in verdicts])
    lines += [""] + markdown_table(["metric", *doc["results"]], metric_rows(doc["results"], CHECK_SUMMARY_KEYS))
    warnings = replay_warnings(doc)
    if warnings:
        for line in warnings:
            lines += ["", f"> **warning:** {line}"]
    return "\n".join(lines) + "\n"
