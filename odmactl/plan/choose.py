"""Which replayed candidate plan recommends: the best by the objective (TPS, utilization, or the rate
it sustains at the SLO) among those that keep the constraints, the overflow rate held to its limit
with a margin for sampling noise. The constraints are the gate plan writes as [thresholds]
(plan/config.thresholds) and checks on the held-out part, the margin added, and TTFT p99 when
--ttft-p99 is given."""

from __future__ import annotations

import math

from odmactl.plan.spec import PlanSpec

OVERFLOW_MARGIN_SE = 1.0  # a replay's overflow count plus one standard error must keep the limit


def overflow_bound(m: dict) -> float:
    """A replay's overflow rate plus OVERFLOW_MARGIN_SE Poisson standard errors of its count: what
    `choose` holds to the limit. The search replays see a few thousand requests, so a candidate
    measured at 13 overflows where 15 are allowed is about as likely over the limit as under it on
    the next requests, which are the ones it will serve."""
    requests = max(m["requests"], 1)
    count = m["overflow_rate"] * requests
    return (count + OVERFLOW_MARGIN_SE * math.sqrt(count)) / requests


def violation(m: dict, spec: PlanSpec, margin: bool = True) -> float:
    """How far a replay's metrics are from the constraints (0: it meets them all): the overflow rate
    (with the margin for sampling noise, `overflow_bound`, unless `margin` is False), rejections
    as check's max_rejection_rate counts them (plan/config.thresholds), TTFT p99 when bounded, and
    with the capacity objective a rate that meets the SLO."""
    overflow = overflow_bound(m) if margin else m["overflow_rate"]
    over = max(0.0, overflow - spec.max_overflow_rate) + \
        max(0.0, m["rejections"] / max(m["requests"], 1) - spec.max_rejection_rate)
    if spec.ttft_p99_s is not None:
        over += max(0.0, m["ttft_p99"] / spec.ttft_p99_s - 1.0)
    if spec.objective == "capacity" and m["capacity_rate_scale"] <= 0:  # no rate meets the SLO
        over += 1.0
    return over


def choose(replayed: list[tuple[dict, dict]], spec: PlanSpec) -> tuple[int, bool]:
    """Index of the chosen (estimate, metrics) pair and whether it meets every constraint."""
    def violation_of(m: dict) -> float:
        return violation(m, spec)

    key = {"tps": "tps", "utilization": "kv_utilization", "capacity": "capacity_rate_scale"}[spec.objective]
    feasible = [i for i, (_, m) in enumerate(replayed) if violation_of(m) == 0.0]
    if feasible:
        return max(feasible, key=lambda i: (replayed[i][1][key], replayed[i][1]["kv_utilization"], -i)), True
    return min(range(len(replayed)), key=lambda i: (violation_of(replayed[i][1]), -replayed[i][1][key], i)), False
