"""What a replay's reader must not miss, as plain lines: a config applied to another deployment
than it was planned for, a policy whose queue grew through the run (overload), and for check a
latency judged from a handful of requests. The console, the markdown summary and the JUnit XML
print the same lines (on stderr with --json); replay's and check's JSON list them as `warnings`."""

from __future__ import annotations

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
