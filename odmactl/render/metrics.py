"""The one table of metrics people read: key (DESIGN.md's name), title, unit and how a value is
written. The console tables, the HTML report, the markdown summary and the JUnit verdicts all
format a metric through it, so a metric reads the same everywhere.

Units: a share (utilization, occupancy) is written as a percentage to 0.1 point; a rate per
request (migrations, overflows, rejections) as a percentage to 0.001 point, because the limits
that matter are fractions of a percent; a gain signed; latencies in s (TTFT) and ms (TPOT).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """`text(value)` writes a value without its unit; `header` is the title with the unit."""

    key: str
    title: str
    unit: str
    text: Callable[[float], str]

    @property
    def header(self) -> str:
        return f"{self.title} ({self.unit})" if self.unit else self.title

    def with_unit(self, value: float) -> str:
        """The value with its unit, for prose (a percentage carries its own sign)."""
        return self.text(value) + (f" {self.unit}" if self.unit and self.unit != "%" else "")


def _share(v: float) -> str:
    return f"{v:.1%}"


def _rate(v: float) -> str:
    return f"{v:.3%}"


def _gain(v: float) -> str:
    return f"{v:+.1%}"


def _count(v: float) -> str:
    return f"{v:,}"


def _per_s(v: float) -> str:
    return f"{v:,.1f}"


def _seconds(v: float) -> str:
    return f"{v:.3g}"


def _ms(v: float) -> str:
    return f"{v * 1e3:.1f}"


METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("kv_utilization", "KV util", "%", _share),
    Metric("pool_occupancy", "pool occ.", "%", _share),
    Metric("tps", "TPS", "tok/s", _per_s),
    Metric("ttft_p50", "TTFT p50", "s", _seconds),
    Metric("ttft_p99", "TTFT p99", "s", _seconds),
    Metric("tpot_p50", "TPOT p50", "ms", _ms),
    Metric("tpot_p99", "TPOT p99", "ms", _ms),
    Metric("migration_rate", "migr. rate", "%", _rate),
    Metric("overflow_rate", "overflow rate", "%", _rate),
    Metric("rejection_rate", "reject. rate", "%", _rate),
    Metric("migrations", "migrations", "", _count),
    Metric("preemptions", "preempt.", "", _count),
    Metric("rejections", "rejected", "", _count),
    Metric("peak_concurrency", "peak conc.", "", _count),
    Metric("completed", "completed", "", _count),
    Metric("tps_gain", "TPS gain", "%", _gain),
)}

REPLAY_KEYS = ("kv_utilization", "pool_occupancy", "tps", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
               "migration_rate", "overflow_rate", "preemptions", "rejections", "peak_concurrency", "completed")
PLAN_KEYS = ("kv_utilization", "tps", "migration_rate", "overflow_rate", "rejections", "preemptions", "ttft_p99",
             "tpot_p99", "peak_concurrency")
CHECK_SUMMARY_KEYS = ("kv_utilization", "tps", "migration_rate", "overflow_rate", "rejections", "ttft_p99",
                      "peak_concurrency")


def format_metric(key: str, value: float) -> str:
    return METRICS[key].text(value)


def metric_rows(results: dict[str, dict], keys: tuple[str, ...]) -> list[list[str]]:
    """Policies side by side: one row per metric (its header, then each policy's value)."""
    return [[METRICS[k].header, *(format_metric(k, r["metrics"][k]) for r in results.values())] for k in keys]
