"""Which replayed candidate plan recommends: the best by the objective (TPS, utilization, or the rate
it sustains at the SLO) among those that keep the constraints, the overflow rate held to its limit
with a margin for sampling noise. The constraints are the limits of the gate plan writes as
[thresholds] (plan/config.thresholds: overflow and rejection rates; its utilization floor follows
from the pick), the margin added, TTFT p99 when --ttft-p99 is given, and with the capacity
objective a rate that meets the SLO."""

from __future__ import annotations

import math

from odmactl.gate.thresholds import at_most, rejection_rate
from odmactl.plan.spec import PlanSpec
from odmactl.render.metrics import compared

OVERFLOW_MARGIN_SE = 1.0  # a replay's overflow count plus one standard error must keep the limit


def overflow_bound(m: dict) -> float:
    """A replay's overflow rate plus OVERFLOW_MARGIN_SE Poisson standard errors of its count: what
    `choose` holds to the limit. The search replays see a few thousand requests, so a candidate
    measured at 13 overflows where 15 are allowed is about as likely over the limit as under it on
    the next requests, which are the ones it will serve."""
    requests = max(m["requests"], 1)
    count = m["overflow_rate"] * requests
    return (count + OVERFLOW_MARGIN_SE * math.sqrt(count)) / requests


OBJECTIVE_METRIC = {"tps": "tps", "utilization": "kv_utilization", "capacity": "capacity_rate_scale"}


def _shortfalls(m: dict, spec: PlanSpec, margin: bool) -> list[tuple[float, str]]:
    """(how far past, what) for each constraint a replay's metrics miss: the overflow rate (with the
    margin for sampling noise, `overflow_bound`, unless `margin` is False), the rejection rate as
    check counts it (gate/thresholds.rejection_rate), TTFT p99 when bounded, and with the capacity
    objective a rate that meets the SLO."""
    overflow = overflow_bound(m) if margin else m["overflow_rate"]
    rejected = rejection_rate(m)
    # a figure equal to its limit but for float rounding meets it, as check's gate reads it (gate/thresholds.at_most)
    out = [(0.0 if at_most(overflow, spec.max_overflow_rate) else overflow - spec.max_overflow_rate,
            f"overflow rate{' + 1 s.e.' if margin else ''} " + " > ".join(compared("overflow_rate", overflow,
                                                                                    spec.max_overflow_rate))),
           (0.0 if at_most(rejected, spec.max_rejection_rate) else rejected - spec.max_rejection_rate,
            "rejection rate " + " > ".join(compared("rejection_rate", rejected, spec.max_rejection_rate)))]
    if spec.ttft_p99_s is not None:
        if m["ttft_p99"] is None:  # no request completed: the limit cannot be shown to hold
            out.append((1.0, "no request completed, so TTFT p99 is unknown"))
        else:
            ttft = m["ttft_p99"]
            out.append((0.0 if at_most(ttft, spec.ttft_p99_s) else ttft / spec.ttft_p99_s - 1.0,
                        "TTFT p99 " + " > ".join(compared("ttft_p99", ttft, spec.ttft_p99_s))))
    if spec.objective == "capacity":
        out.append((1.0 if m["capacity_rate_scale"] <= 0 else 0.0, "no rate meets the SLO"))
    return [(excess, what) for excess, what in out if excess > 0]


def violation(m: dict, spec: PlanSpec, margin: bool = True) -> float:
    """How far a replay's metrics are from the constraints (0: it meets them all; `_shortfalls`)."""
    return sum(excess for excess, _ in _shortfalls(m, spec, margin))


def unmet(m: dict, spec: PlanSpec, margin: bool = True) -> list[str]:
    """The constraints a replay's metrics miss, in words."""
    return [what for _, what in _shortfalls(m, spec, margin)]


def choose(replayed: list[tuple[dict, dict]], spec: PlanSpec) -> tuple[int, bool]:
    """Index of the chosen (estimate, metrics) pair and whether it meets every constraint."""
    key = OBJECTIVE_METRIC[spec.objective]
    feasible = [i for i, (_, m) in enumerate(replayed) if violation(m, spec) == 0.0]
    if feasible:
        return max(feasible, key=lambda i: (replayed[i][1][key], replayed[i][1]["kv_utilization"], -i)), True
    return min(range(len(replayed)), key=lambda i: (violation(replayed[i][1], spec), -replayed[i][1][key], i)), False
