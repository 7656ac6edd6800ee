"""check's gate: thresholds against a replay's metrics, a verdict per threshold (render/ writes
them as a table, JUnit XML and a markdown summary).

Thresholds come from the command's flags or, for those not given, from the config's
`[thresholds]` table (plan writes it next to the expected metrics; run/config.Thresholds holds
their rules, so that every command reading a config checks the table the same way):

    min_utilization     kv_utilization of the checked policy >= value
    max_migration_rate  migration_rate <= value
    max_overflow_rate   overflow_rate <= value: migrations plus preemptions per request, the rate
                        plan's migration-rate limit applies to (plan writes this one)
    max_rejection_rate  rejections / requests <= value
    min_tps_gain        tps / tps of `baseline` - 1 >= value (the baseline is replayed on the same trace)
    baseline            the policy min_tps_gain compares with (default static)
    max_ttft_p99_s      ttft_p99 <= value, in seconds; likewise max_ttft_p50_s, max_tpot_p50_s and
                        max_tpot_p99_s (`check --slo ttft_p99=2s,tpot_p99=100ms` sets them, written
                        as capacity's --slo is). A latency no request had (TPOT where every reply
                        is one token) meets its bound, as capacity's SLO reads it (capacity/slo.py);
                        where no request completed, every latency bound fails
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from odmactl.render.metrics import compared
from odmactl.run.config import LATENCY_THRESHOLDS, THRESHOLD_KEYS, Thresholds

__all__ = ["THRESHOLD_KEYS", "THRESHOLD_METRIC", "Thresholds", "Verdict", "evaluate", "policies_needed",
           "rejection_rate"]

# the metric (render/metrics.py) each threshold bounds
THRESHOLD_METRIC = {"min_utilization": "kv_utilization", "max_migration_rate": "migration_rate",
                    "max_overflow_rate": "overflow_rate", "max_rejection_rate": "rejection_rate",
                    "min_tps_gain": "tps_gain", **LATENCY_THRESHOLDS}


@dataclass(frozen=True)
class Verdict:
    """One threshold against its measured value; `passed` is the comparison's outcome."""

    name: str
    metric: str
    comparison: str  # ">=" or "<="
    threshold: float
    # None: a latency no request had (it meets its bound), or a TPS gain where neither policy served
    # a token (it fails)
    value: float | None
    passed: bool

    @property
    def threshold_text(self) -> str:
        """The bound with its unit (a share's % included: "0.500%", "2.000 s", "100.0 ms", "0.0015 s")."""
        return self._texts()[0]

    @property
    def value_text(self) -> str:
        return self._texts()[1]

    def _texts(self) -> tuple[str, str]:
        """(the bound, the value) as render/metrics.compared writes them; a value equal to the
        bound but for float rounding (`equal`) meets it and reads as it."""
        value, bound = compared(THRESHOLD_METRIC[self.name], self.value, self.threshold,
                                self.value is not None and equal(self.value, self.threshold))
        return bound, value

    @property
    def text(self) -> str:
        return f"{self.metric} = {self.value_text} {'meets' if self.passed else 'violates'} " \
               f"{self.comparison} {self.threshold_text}"


def policies_needed(policy: str, thresholds: Thresholds) -> list[str]:
    """The policy checked, then the baseline when a TPS gain is asked for."""
    if thresholds.min_tps_gain is None or thresholds.baseline == policy:
        return [policy]
    return [policy, thresholds.baseline]


def rejection_rate(m: dict) -> float:
    """Rejected requests over all of a replay's (every rejection: CI wants to see them)."""
    return m["rejections"] / m["requests"] if m["requests"] else 0.0


TOLERANCE = 1e-12  # relative: a value equal to its threshold but for float rounding (120 / 100 - 1 < 0.2) meets it


def equal(value: float, bound: float) -> bool:
    """Whether `value` is `bound` but for float rounding (TOLERANCE, relative to the larger)."""
    return math.isfinite(value) and math.isfinite(bound) and abs(value - bound) <= TOLERANCE * max(abs(value), abs(bound))


def at_least(value: float, bound: float) -> bool:
    return value >= bound or equal(value, bound)


def at_most(value: float, bound: float) -> bool:
    return value <= bound or equal(value, bound)


def evaluate(doc: dict, policy: str, thresholds: Thresholds) -> list[Verdict]:
    """Each set threshold against the replay document's metrics for `policy`."""
    m = doc["results"][policy]["metrics"]
    out: list[Verdict] = []
    if thresholds.min_utilization is not None:
        v = m["kv_utilization"]
        out.append(Verdict("min_utilization", "kv_utilization", ">=", thresholds.min_utilization, v,
                           at_least(v, thresholds.min_utilization)))
    for name, metric in (("max_migration_rate", "migration_rate"), ("max_overflow_rate", "overflow_rate")):
        bound = getattr(thresholds, name)
        if bound is not None:
            v = m[metric]
            out.append(Verdict(name, metric, "<=", bound, v, at_most(v, bound)))
    if thresholds.max_rejection_rate is not None:
        v = rejection_rate(m)
        out.append(Verdict("max_rejection_rate", "rejection_rate", "<=", thresholds.max_rejection_rate, v,
                           at_most(v, thresholds.max_rejection_rate)))
    if thresholds.min_tps_gain is not None:
        base = doc["results"][thresholds.baseline]["metrics"]["tps"]
        # over a baseline that served nothing, any gain; where neither served a token, none (it fails)
        v = m["tps"] / base - 1.0 if base > 0 else math.inf if m["tps"] > 0 else None
        out.append(Verdict("min_tps_gain", f"tps gain over {thresholds.baseline}", ">=", thresholds.min_tps_gain, v,
                           v is not None and at_least(v, thresholds.min_tps_gain)))
    for name, metric in LATENCY_THRESHOLDS.items():
        bound = getattr(thresholds, name)
        if bound is not None:  # None: no request had it (one-token replies) or none completed, which fails
            v = m[metric]
            out.append(Verdict(name, metric, "<=", bound, v,
                               at_most(v, bound) if v is not None else m["completed"] > 0))
    return out
