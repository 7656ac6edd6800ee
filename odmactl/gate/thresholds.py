"""`odmactl check`: does a configuration still hold on this trace? Thresholds against a replay's
metrics, a verdict per threshold, and the verdicts as JUnit XML and a markdown summary for CI.

Thresholds come from the command's flags or, for those not given, from the config's
`[thresholds]` table (plan writes it next to the expected metrics):

    min_utilization     kv_utilization of the checked policy >= value
    max_migration_rate  migration_rate <= value
    max_overflow_rate   overflow_rate <= value: migrations plus preemptions per request, the rate
                        plan's migration-rate limit applies to (plan writes this one)
    max_rejection_rate  rejections / requests <= value
    min_tps_gain        tps / tps of `baseline` - 1 >= value (the baseline is replayed on the same trace)
    baseline            the policy min_tps_gain compares with (default static)
"""

from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from odmactl.core.errors import ConfigError

THRESHOLD_KEYS = ("min_utilization", "max_migration_rate", "max_overflow_rate", "max_rejection_rate", "min_tps_gain",
                  "baseline")


@dataclass(frozen=True)
class Thresholds:
    """Bounds a replay must meet; None leaves that bound unchecked. Invariant: rates and
    utilization in [0, 1], min_tps_gain > -1, baseline a policy name."""

    min_utilization: float | None = None
    max_migration_rate: float | None = None
    max_overflow_rate: float | None = None
    max_rejection_rate: float | None = None
    min_tps_gain: float | None = None
    baseline: str = "static"

    def __post_init__(self) -> None:
        for name in ("min_utilization", "max_migration_rate", "max_overflow_rate", "max_rejection_rate"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ConfigError(f"{name} must be between 0 and 1, got {value}", key=name)
        if self.min_tps_gain is not None and not (math.isfinite(self.min_tps_gain) and self.min_tps_gain > -1.0):
            raise ConfigError(f"min_tps_gain must be > -1 (a fraction: 0.2 is +20%), got {self.min_tps_gain}",
                              key="min_tps_gain")

    @property
    def empty(self) -> bool:
        return all(getattr(self, k) is None for k in THRESHOLD_KEYS if k != "baseline")

    @classmethod
    def merged(cls, table: dict, flags: dict, source: Path | None) -> Thresholds:
        """The config table's thresholds (errors name `source` and the key), then the flags' values
        where given."""
        values: dict = {}
        for key, value in table.items():
            if key not in THRESHOLD_KEYS:
                raise ConfigError(f"unknown threshold '{key}' (known: {', '.join(THRESHOLD_KEYS)})",
                                  file=source, key=f"thresholds.{key}")
            wanted = str if key == "baseline" else (int, float)
            if isinstance(value, bool) or not isinstance(value, wanted):
                raise ConfigError(f"expected {'a policy name' if key == 'baseline' else 'a number'}, got {value!r}",
                                  file=source, key=f"thresholds.{key}")
            values[key] = value if key == "baseline" else float(value)
        try:
            from_file = cls(**values)
        except ConfigError as exc:
            raise ConfigError(exc.message, file=source, key=f"thresholds.{exc.key}") from None
        return dataclasses.replace(from_file, **{k: v for k, v in flags.items() if v is not None})


@dataclass(frozen=True)
class Verdict:
    """One threshold against its measured value; `passed` is the comparison's outcome."""

    name: str
    metric: str
    comparison: str  # ">=" or "<="
    threshold: float
    value: float
    passed: bool

    @property
    def text(self) -> str:
        return f"{self.metric} = {format_threshold(self.name, self.value)} {'meets' if self.passed else 'violates'} " \
               f"{self.comparison} {format_threshold(self.name, self.threshold)}"


def format_threshold(name: str, value: float) -> str:
    """A threshold or its measured value as people read it (gains signed, rates to 0.0001%)."""
    return f"{value:+.1%}" if name == "min_tps_gain" else f"{value:.4%}" if "rate" in name else f"{value:.1%}"


def policies_needed(policy: str, thresholds: Thresholds) -> list[str]:
    """The policy checked, then the baseline when a TPS gain is asked for."""
    if thresholds.min_tps_gain is None or thresholds.baseline == policy:
        return [policy]
    return [policy, thresholds.baseline]


TOLERANCE = 1e-9  # a value equal to its threshold but for float rounding (120 / 100 - 1 < 0.2) meets it


def evaluate(doc: dict, policy: str, thresholds: Thresholds) -> list[Verdict]:
    """Each set threshold against the replay document's metrics for `policy`."""
    m = doc["results"][policy]["metrics"]
    out: list[Verdict] = []
    if thresholds.min_utilization is not None:
        v = m["kv_utilization"]
        out.append(Verdict("min_utilization", "kv_utilization", ">=", thresholds.min_utilization, v,
                           v >= thresholds.min_utilization - TOLERANCE))
    for name, metric in (("max_migration_rate", "migration_rate"), ("max_overflow_rate", "overflow_rate")):
        bound = getattr(thresholds, name)
        if bound is not None:
            v = m[metric]
            out.append(Verdict(name, metric, "<=", bound, v, v <= bound + TOLERANCE))
    if thresholds.max_rejection_rate is not None:
        v = m["rejections"] / m["requests"] if m["requests"] else 0.0  # every rejection: CI wants to see them
        out.append(Verdict("max_rejection_rate", "rejection_rate", "<=", thresholds.max_rejection_rate, v,
                           v <= thresholds.max_rejection_rate + TOLERANCE))
    if thresholds.min_tps_gain is not None:
        base = doc["results"][thresholds.baseline]["metrics"]["tps"]
        v = m["tps"] / base - 1.0 if base > 0 else math.inf
        out.append(Verdict("min_tps_gain", f"tps gain over {thresholds.baseline}", ">=", thresholds.min_tps_gain, v,
                           v >= thresholds.min_tps_gain - TOLERANCE))
    return out


def junit_xml(verdicts: list[Verdict], suite: str, seconds: float) -> str:
    """JUnit XML (the schema CI systems read): one testcase per threshold, a <failure> when violated."""
    failures = sum(not v.passed for v in verdicts)
    root = ET.Element("testsuites", name="odmactl check", tests=str(len(verdicts)), failures=str(failures),
                      errors="0", time=f"{seconds:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(verdicts)), failures=str(failures),
                       errors="0", skipped="0", time=f"{seconds:.3f}")
    for v in verdicts:
        case = ET.SubElement(ts, "testcase", classname="odmactl.check", name=v.name, time="0")
        if not v.passed:
            failure = ET.SubElement(case, "failure", message=v.text, type="ThresholdViolated")
            failure.text = v.text
        ET.SubElement(case, "system-out").text = v.text
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def markdown(verdicts: list[Verdict], doc: dict, policy: str, config: Path | None) -> str:
    """A pull-request summary: the verdict, the thresholds table, and the compared policies' metrics."""
    passed = all(v.passed for v in verdicts)
    t = doc["trace"]
    lines = [f"### odmactl check: {'PASS' if passed else 'FAIL'}", "",
             f"`{t['path']}`: {t['requests']:,} requests, {doc['model']} on {doc['device']}, policy `{policy}`"
             + (f", config `{config}`" if config else "") + f", predictor `{doc['predictor']}`", "",
             "| check | metric | threshold | value | result |", "|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(f"| {v.name} | {v.metric} | {v.comparison} {format_threshold(v.name, v.threshold)} | "
                     f"{format_threshold(v.name, v.value)} | {'pass' if v.passed else '**FAIL**'} |")
    lines += ["", "| metric | " + " | ".join(doc["results"]) + " |", "|---|" + "---|" * len(doc["results"])]
    for key, fmt in (("kv_utilization", "{:.1%}"), ("tps", "{:,.1f}"), ("migration_rate", "{:.3%}"),
                     ("overflow_rate", "{:.3%}"), ("rejections", "{:,}"), ("ttft_p99", "{:.3g} s"), ("peak_concurrency", "{:,}")):
        lines.append(f"| {key} | " + " | ".join(fmt.format(r["metrics"][key]) for r in doc["results"].values()) + " |")
    return "\n".join(lines) + "\n"
