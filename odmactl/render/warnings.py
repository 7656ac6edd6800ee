"""What a reader must not miss, as plain lines: a config applied to another deployment than it
was planned for, a policy whose queue grew through the run (overload), for check a latency judged
from a handful of requests, and for capacity an SLO near its zero-load floor, a target replayed too
briefly to judge a queue, a rate past which the SLO failed below it. The console, the markdown, the
HTML report and the JUnit XML print the same lines (on stderr with --json); the JSON of replay,
check, capacity and plan lists them as `warnings`."""

from __future__ import annotations

from odmactl.render.metrics import compared
from odmactl.sim.metrics import LATENCY_METRICS, MIN_COMPLETED


def overload_line(results: dict[str, dict]) -> str | None:
    """One line for every policy of `results` (name -> a result with a "queue" section) whose queue
    grew through the run, with the rate each keeps up at when that was searched; None when all
    kept up. The median waits by quarter are in the JSON."""
    parts = []
    for policy, r in results.items():
        queue = r.get("queue", {})
        if not queue.get("overloaded"):
            continue
        found, rate = queue.get("sustainable"), queue.get("arrival_rate_per_s")
        if found is None:
            parts.append(policy)
        elif found["rate_scale"] is None:
            parts.append(f"{policy} (not even at {found['next_rate_scale']:.3g}x, the slowest rate tried)")
        else:
            at = f" ({found['rate_scale'] * rate:,.3g} req/s)" if rate else ""
            parts.append(f"{policy} {found['rate_scale']:.3g}x{at}")
    if not parts:
        return None
    return ("overloaded: the queue grew through the run, so TPS is the device's service rate and latencies grow "
            "with the trace's length; it keeps up with this multiple of the replayed requests' arrival rate: "
            + ", ".join(parts))


def mismatch_lines(doc: dict) -> list[str]:
    """A document's mismatches (run/config.mismatches, allowed by --allow-mismatch), one line each."""
    return [f"the config was planned for another deployment ({m}); its settings were applied anyway "
            "(--allow-mismatch)" for m in doc.get("mismatches", [])]


def check_warnings(doc: dict, policy: str, verdicts: list) -> list[str]:
    """check's warnings: the replay's (`replay_warnings`), then a latency judged from fewer than
    MIN_COMPLETED completed requests (a p99 over a handful)."""
    lines = replay_warnings(doc)
    judged = [v.metric for v in verdicts if v.metric in LATENCY_METRICS]
    done = doc["results"][policy]["metrics"]["completed"]
    if judged and done < MIN_COMPLETED:
        lines.append(f"{', '.join(judged)} judged from {done:,} completed requests: a percentile over fewer than "
                     f"{MIN_COMPLETED} describes a handful (capacity reports no rate from them); replay more requests")
    return lines


def replay_warnings(doc: dict) -> list[str]:
    """The warnings of a replay document (run/replay.run_policies): mismatches, then overloads."""
    lines = mismatch_lines(doc)
    line = overload_line(doc["results"])
    if line is not None:
        lines.append(line)
    return lines


def capacity_warnings(doc: dict) -> list[str]:
    """capacity's warnings (capacity/run.capacity's document): mismatches, an SLO term under or near
    its zero-load floor (each row's `near_floor`, once per term and tp), a rate past which the SLO
    failed below it (`monotone`), and a target that replays too briefly for the overload test."""
    lines = mismatch_lines(doc)
    limits, warned = doc.get("slo", {}), set()
    for r in doc["rows"]:
        floor = doc.get("zero_load", {}).get(str(r["tp"]))
        for metric in r.get("near_floor", ()):
            if (metric, r["tp"]) in warned or floor is None:
                continue
            warned.add((metric, r["tp"]))
            # as check writes a bound: the limit as set, the floor to the digits that tell them apart
            floor_text, limit_text = compared(metric, floor[metric], limits[metric])
            if floor[metric] > limits[metric]:
                lines.append(f"tp {r['tp']}: the {metric} limit ({limit_text}) is under its zero-load floor "
                             f"({floor_text}, each request alone): one engine meets it at no rate")
            else:
                lines.append(f"tp {r['tp']}: the {metric} limit ({limit_text}) is only {limits[metric] / floor[metric]:.2f}x "
                             f"its zero-load floor ({floor_text}, each request alone): the answer moves with small "
                             "changes of it")
    odd = [f"{r['policy']} tp {r['tp']}" for r in doc["rows"] if not r["monotone"]]
    if odd:
        lines.append(f"the SLO failed below the reported rate for {', '.join(odd)} (not monotone): see "
                     "failed_below_at_scale in --json")
    replay_s = doc.get("target_replay_s")
    if replay_s is not None and replay_s < 120:
        lines.append(f"at the target the trace replays in {replay_s:.3g} s: too short for the overload test to judge "
                     "a queue, so devices for such a target may not follow the rate (replay a longer trace)")
    return lines


def listed_capacity_warnings(doc: dict) -> list[str]:
    """The warnings capacity's files (markdown, HTML) print: the document's `warnings` list, which
    the CLI makes (a noisy measured profile's first, then `capacity_warnings`); `capacity_warnings`
    for a document without one."""
    return doc["warnings"] if "warnings" in doc else capacity_warnings(doc)


def plan_warnings(doc: dict) -> list[str]:
    """plan's warnings (plan/search.plan's document): a validated policy whose queue grew through
    the held-out replay (`overload_line`)."""
    line = overload_line(doc["validation"])
    return [line] if line is not None else []
