"""A latency SLO as `odmactl capacity --slo` takes it: `ttft_p99=2s,tpot_p99=100ms`."""

from __future__ import annotations

from dataclasses import dataclass

from odmactl.core.errors import ConfigError, did_you_mean
from odmactl.core.units import QuantityError, format_seconds, parse_quantity
from odmactl.sim.metrics import LATENCY_LIMIT_MAX_S, LATENCY_LIMIT_MIN_S, LATENCY_METRICS, latency_limit_ok

METRICS = LATENCY_METRICS  # the replay's latency metrics, in seconds
SLO_TIME = "a time such as 2s or 100ms"  # what a limit reads as, in the flag's own form
MAX_LISTED = 5  # the mistakes of one --slo named in its message; the rest are counted


@dataclass(frozen=True)
class Slo:
    """Upper limits in seconds on latency metrics of a replay. Invariant: at least one limit, each
    metric one of METRICS, each limit `latency_limit_ok`."""

    limits_s: tuple[tuple[str, float], ...]

    @classmethod
    def parse(cls, text: str) -> Slo:
        """The limits of `text`; every item that does not read is named in one ConfigError
        (numbered where there are several), so a flag with two mistakes is mended in one go."""
        limits: dict[str, float] = {}
        named: set[str] = set()  # every metric mentioned, read or not: a second mention is "twice"
        problems: list[str] = []
        unknown = False
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            metric, sep, value = item.partition("=")
            metric = metric.strip()
            if not sep:
                problems.append(f"--slo expects METRIC=TIME pairs such as ttft_p99=2s, got '{item}'")
                continue
            if metric not in METRICS:
                near = did_you_mean(metric, METRICS)
                problems.append(f"--slo: unknown metric '{metric}'" + (f"; {near}" if near else ""))
                unknown = True
                continue
            if metric in named:
                problems.append(f"--slo names {metric} twice")
                continue
            named.add(metric)
            try:
                seconds = parse_quantity(value.strip(), "seconds", expected=SLO_TIME)
            except QuantityError as exc:  # its guess in the flag's own form: ttft_p99=2s
                guess = exc.suggested(space="")
                if guess and exc.number == value.strip():  # no unit: a TPOT of 100 is 100ms, a TTFT of 2 is 2s
                    number = exc.number.rstrip(".") or exc.number  # "2." as 2
                    guess = f"{number}ms or {metric}={number}s"
                problems.append(f"--slo {metric}: {exc.problem}" + (f"; did you mean {metric}={guess}?" if guess else ""))
                continue
            if not latency_limit_ok(seconds):
                problems.append(f"--slo {metric}: expected a time from {LATENCY_LIMIT_MIN_S * 1e3:g} ms to "
                                f"{LATENCY_LIMIT_MAX_S:,.0f} s, got '{value.strip()}'")
            limits[metric] = seconds
        if problems:
            hint = f"metrics: {', '.join(METRICS)}" if unknown else None
            if len(problems) == 1:
                raise ConfigError(problems[0], hint=hint)
            listed = [f"{k}. {p.removeprefix('--slo').lstrip(': ')}" for k, p in enumerate(problems[:MAX_LISTED], 1)]
            more = f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
            raise ConfigError(f"--slo has {len(problems)} mistakes: " + "; ".join(listed) + more, hint=hint)
        if not limits:
            raise ConfigError("--slo names no limit", hint="e.g. --slo ttft_p99=2s,tpot_p99=100ms")
        return cls(tuple(limits.items()))

    @classmethod
    def from_flags(cls, values: list[str]) -> Slo:
        """Every --slo a command line gives, as one: `--slo ttft_p99=2s --slo tpot_p99=100ms` is
        `--slo ttft_p99=2s,tpot_p99=100ms`, and a metric named in two is refused as in one (a
        repeated flag would otherwise drop the earlier limits)."""
        return cls.parse(",".join(values))

    def failures(self, metrics: dict) -> list[tuple[str, float, float]]:
        """(metric, value, limit) for every limit `metrics` exceeds. A latency no request had (None:
        TPOT where every reply is one token) breaks no limit; a replay that completed too few
        requests is refused before its latencies are judged (capacity/search.py `too_few_served`)."""
        return [(m, float(metrics[m]), limit) for m, limit in self.limits_s
                if metrics[m] is not None and metrics[m] > limit]

    @property
    def label(self) -> str:
        return ", ".join(f"{m} <= {format_seconds(limit)}" for m, limit in self.limits_s)

    @property
    def flag(self) -> str:
        """The SLO as --slo takes it."""
        return ",".join(f"{m}={format_seconds(limit, space='')}" for m, limit in self.limits_s)
