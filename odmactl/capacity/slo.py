"""A latency SLO as `odmactl capacity --slo` takes it: `ttft_p99=2s,tpot_p99=100ms`."""

from __future__ import annotations

from dataclasses import dataclass

from odmactl.core.errors import ConfigError, did_you_mean
from odmactl.core.units import QuantityError, format_seconds, parse_quantity
from odmactl.sim.metrics import LATENCY_LIMIT_MAX_S, LATENCY_METRICS, latency_limit_ok

METRICS = LATENCY_METRICS  # the replay's latency metrics, in seconds


@dataclass(frozen=True)
class Slo:
    """Upper limits in seconds on latency metrics of a replay. Invariant: at least one limit, each
    metric one of METRICS, each limit `latency_limit_ok`."""

    limits_s: tuple[tuple[str, float], ...]

    @classmethod
    def parse(cls, text: str) -> Slo:
        limits: dict[str, float] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            metric, sep, value = item.partition("=")
            metric = metric.strip()
            if not sep:
                raise ConfigError(f"--slo expects METRIC=TIME pairs such as ttft_p99=2s, got '{item}'")
            if metric not in METRICS:
                near = did_you_mean(metric, METRICS)
                raise ConfigError(f"--slo: unknown metric '{metric}'" + (f"; {near}" if near else ""),
                                  hint=f"one of {', '.join(METRICS)}")
            if metric in limits:
                raise ConfigError(f"--slo names {metric} twice")
            try:
                seconds = parse_quantity(value.strip(), "seconds")
            except QuantityError as exc:  # its guess in the flag's own form: ttft_p99=2s
                guess = exc.suggested(space="")
                if guess and exc.number == value.strip():  # no unit: a TPOT of 100 is 100ms, a TTFT of 2 is 2s
                    guess = f"{exc.number}ms or {metric}={exc.number}s"
                raise ConfigError(f"--slo {metric}: {exc.problem}"
                                  + (f"; did you mean {metric}={guess}?" if guess else "")) from None
            if not latency_limit_ok(seconds):
                raise ConfigError(f"--slo {metric} must be a time > 0 and at most {LATENCY_LIMIT_MAX_S:,.0f} s, "
                                  f"got '{value.strip()}'")
            limits[metric] = seconds
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
