"""The one table of metrics people read: key (DESIGN.md's name), title, unit and how a value is
written. The console tables, the HTML report, the markdown summary and the JUnit verdicts all
format a metric through it, so a metric reads the same everywhere.

Units: a share (utilization, occupancy) is written as a percentage to 0.1 point; a rate per
request (migrations, overflows, rejections) as a percentage to 0.001 point, because the limits
that matter are fractions of a percent; a gain signed; latencies in s (TTFT) and ms (TPOT).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

from odmactl.core.units import sig3_decimals
from odmactl.sim.metrics import LATENCY_METRICS


@dataclass(frozen=True)
class Metric:
    """A value is written as `format(value * scale, spec)`, without its unit; `header` is the
    title with the unit."""

    key: str
    title: str
    unit: str
    spec: str
    scale: float = 1

    @property
    def header(self) -> str:
        return f"{self.title} ({self.unit})" if self.unit else self.title

    def text(self, value: float | None, precise: bool = False, digits: int | None = None) -> str:
        """The value written; a missing or non-finite one (a gain over a baseline that served nothing) is n/a.
        `precise`: to `digits` significant digits (`precise_text`), by default as many as the
        value was set with (its shortest round trip, counted before the unit's scaling, whose float
        noise they leave out: 0.178343739 s is "178.343739" ms)."""
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return "n/a"
        if precise:  # the spec's sign and percent kept, and at least its decimals ("100.0 ms", not "100 ms")
            percent = self.spec.endswith("%")
            least = re.search(r"\.(\d+)[f%]$", self.spec)
            factor = self.scale * (100 if percent else 1)
            if digits is None:  # as set: its shortest round trip, scaled in decimal, so no float noise is
                shown = Decimal(repr(value)) * Decimal(repr(factor))  # added (0.8252219501518426 is 82.52219501518426%)
            else:
                shown = Decimal(format(value * factor, f".{digits - 1}e"))
            text = precise_text(shown, "+" if self.spec.startswith("+") else "", int(least.group(1)) if least else 0)
            return text + ("%" if percent else "")
        value = value * self.scale if self.scale != 1 else value
        if self.spec == SIG3:  # three significant digits, never rounded to zero: 0.00234, 0.107, 1,235
            if value == 0:
                return "0"
            if abs(value) >= 1e5:  # past five digits, as 1.05e+12, not a row of them
                return format(value, ".3g")
            return format(value, f",.{sig3_decimals(value)}f")
        text = format(value, self.spec)
        if text.startswith("-") and not any(c in "123456789" for c in text):  # -0.0004 as "-0.0%": no sign is due
            text = ("+" if self.spec.startswith("+") else "") + text[1:]
        return text

    def in_words(self, value: float | None, precise: bool = False, digits: int | None = None) -> str:
        """The value with its unit, as a sentence writes it ("634.0 tok/s"; a share's text holds
        its %; n/a alone)."""
        text = self.text(value, precise, digits)
        return text if text == "n/a" or self.unit in ("", "%") else f"{text} {self.unit}"


POSITIONAL = (Decimal("1e-9"), Decimal("1e15"))  # a precise figure in that magnitude is written without an exponent


def precise_text(x: Decimal, sign: str = "", decimals: int = 0) -> str:
    """The decimal `x` written out, with thousands separators and at least `decimals` decimals
    (zeros added, never rounded: "100.0", not "100"); an exponent only outside POSITIONAL ("1e-10",
    not "1e-05" for 0.00001). -0 is 0."""
    if not x:
        return ("+" if sign else "") + "0" + ("." + "0" * decimals if decimals else "")
    lead = "-" if x < 0 else sign
    x = abs(x).normalize()
    if not POSITIONAL[0] <= x < POSITIONAL[1]:
        return lead + format(x, "e")
    whole, _, frac = format(x, "f").partition(".")
    frac += "0" * (decimals - len(frac))
    return lead + format(int(whole), ",") + ("." + frac if frac else "")


SHARE, RATE, GAIN, COUNT, SIG3 = ".1%", ".3%", "+.1%", ",", "sig3"

METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("kv_utilization", "KV util", "%", SHARE),
    Metric("pool_occupancy", "pool occ.", "%", SHARE),
    Metric("tps", "TPS", "tok/s", ",.1f"),
    Metric("ttft_p50", "TTFT p50", "s", ",.3f"),
    Metric("ttft_p99", "TTFT p99", "s", ",.3f"),
    Metric("tpot_p50", "TPOT p50", "ms", ",.1f", 1e3),
    Metric("tpot_p99", "TPOT p99", "ms", ",.1f", 1e3),
    Metric("migration_rate", "migr. rate", "%", RATE),
    Metric("overflow_rate", "overflow rate", "%", RATE),
    Metric("rejection_rate", "reject. rate", "%", RATE),
    Metric("migrations", "migrations", "", COUNT),
    Metric("preemptions", "preempt.", "", COUNT),
    Metric("stalls", "stalls", "", COUNT),
    Metric("rejections", "rejected", "", COUNT),
    Metric("peak_concurrency", "peak conc.", "", COUNT),
    Metric("completed", "completed", "", COUNT),
    Metric("truncated", "truncated", "", COUNT),
    Metric("kv_runs_per_request", "KV runs/req", "", ",.1f"),
    Metric("peak_borrowed_bytes", "borrowed peak", "GiB", ",.2f", 1 / (1 << 30)),
    Metric("host_link_bytes", "host link", "GiB", ",.2f", 1 / (1 << 30)),
    Metric("link_bottleneck_s", "link stall", "s", ",.3f"),
    # vLLM's automatic prefix caching (paged, on a trace with prefix hashes): tokens found cached
    Metric("prefix_hit_rate", "prefix hits", "%", SHARE),
    Metric("prefill_tokens_saved", "prefill saved", "tok", COUNT),
    Metric("capacity_rate_scale", "rate at SLO", "x trace", ".3f"),
    Metric("tps_gain", "TPS gain", "%", GAIN),
    # odmactl capacity: per engine (a replica of tp devices) and per device, at the SLO
    Metric("max_rate_per_replica", "req/s per engine", "", SIG3),
    Metric("max_rate_per_device", "req/s per device", "", SIG3),
    Metric("output_tps_per_device", "out tok/s per device", "", SIG3),  # output tokens only, as plan's TPS
    Metric("devices_for_target", "devices for target", "", COUNT),
    Metric("devices_saved_vs_static", "saved vs static", "", "+,d"),
    Metric("rejected_never_fit", "never fit", "", COUNT),
)}

# capacity's table: these, the latencies at each row's rate (`capacity_keys`), then the devices
_CAPACITY_RATES = ("max_rate_per_replica", "max_rate_per_device", "output_tps_per_device")
CAPACITY_DEVICES = ("devices_for_target", "devices_saved_vs_static", "rejected_never_fit")


def slo_latencies(slo: dict) -> tuple[str, ...]:
    """The latencies capacity shows (headline, table, plot), TTFT's then TPOT's: for each, those the
    SLO bounds (`slo`: metric -> limit), else its p99. An SLO on p50s was shown with p99s, which
    looked like a violation beside a p50 limit."""
    shown = []
    for kind in ("ttft", "tpot"):
        bounded = [m for m in LATENCY_METRICS if m.startswith(kind) and m in slo]
        shown += bounded or [f"{kind}_p99"]
    return tuple(shown)


def capacity_keys(slo: dict) -> tuple[str, ...]:
    """capacity's table columns: the rates, `slo_latencies`, then the devices."""
    return _CAPACITY_RATES + slo_latencies(slo) + CAPACITY_DEVICES

REPLAY_KEYS = ("kv_utilization", "pool_occupancy", "tps", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
               "migration_rate", "overflow_rate", "preemptions", "rejections", "peak_concurrency", "completed",
               "kv_runs_per_request")
# shown beside REPLAY_KEYS when some policy of the run has them (eLLM's borrowing, the host link)
REPLAY_IF_ANY = ("stalls", "peak_borrowed_bytes", "host_link_bytes", "link_bottleneck_s", "prefix_hit_rate",
                 "prefill_tokens_saved")
PLAN_KEYS = ("kv_utilization", "tps", "migration_rate", "overflow_rate", "rejections", "truncated", "preemptions",
             "ttft_p99", "tpot_p99", "peak_concurrency")
# check's markdown: these, then any other metric a threshold judged
CHECK_SUMMARY_KEYS = ("kv_utilization", "tps", "migration_rate", "overflow_rate", "rejections", "ttft_p99",
                      "tpot_p99", "peak_concurrency")


def plan_keys(objective: str) -> tuple[str, ...]:
    """plan's held-out table: PLAN_KEYS, and the rate at the SLO under the capacity objective."""
    return PLAN_KEYS + (("capacity_rate_scale",) if objective == "capacity" else ())


def compared(key: str, value: float | None, bound: float, same: bool = False, unit: bool = True) -> tuple[str, str]:
    """(the value, the bound) of metric `key` with their units, for a sentence or a table that
    compares them (check's verdicts, plan's unmet constraints). The bound as it was set (a 1.5 ms
    TTFT limit is "0.0015 s", which the format's three decimals would write "0.002 s"); the value
    in its format where that text orders against the bound as the value does, else to the fewest
    more digits that do ("98.6769 s" below "98.6769203854715 s", not "98.677"). A value equal to
    the bound, or `same` (equal but for float rounding), reads as the bound. Without `unit`, the
    figures alone (a table's cell, its unit in the header)."""
    metric = METRICS[key]
    say = metric.in_words if unit else metric.text
    bound_text = say(bound, precise=True)
    if value is None or not math.isfinite(value):  # n/a: a latency no request had, a gain over nothing served
        return say(value), bound_text
    if value == bound or same:
        return bound_text, bound_text
    value_text = say(value)
    digits = len(re.sub(r"^[0.]*", "", re.sub(r"[^0-9.]", "", value_text.split()[0])).replace(".", ""))
    while digits < 17 and not _ordered(value_text, bound_text, value < bound):
        digits += 1
        value_text = say(value, precise=True, digits=digits)
    return value_text, bound_text


def _ordered(value_text: str, bound_text: str, below: bool) -> bool:
    """Whether the figures as written differ, in the order of the values they stand for."""
    v, b = (float(re.sub(r"[^0-9.eE+-]", "", t.split()[0].replace("%", ""))) for t in (value_text, bound_text))
    return v != b and (v < b) == below


def format_metric(key: str, value: float) -> str:
    return METRICS[key].text(value)


def metric_rows(results: dict[str, dict], keys: tuple[str, ...]) -> list[list[str]]:
    """Policies side by side: one row per metric (its header, then each policy's value; n/a where a
    policy has none, as a contiguous policy has no prefix hits)."""
    return [[METRICS[k].header, *(METRICS[k].text(r["metrics"].get(k)) for r in results.values())] for k in keys]
