"""The arrival process a capacity search replays (`--arrivals`): the trace's own gaps, or the
trace's requests, in order, at generated gaps of the same mean rate.

- `trace`: the trace's timestamps, rescaled by each probe's rate scale: its bursts are kept (Azure
  code 2023 has 17% of its gaps under 1 ms), and a limit that a burst breaks stays broken at every
  rate, since scaling stretches a burst no more than the rest.
- `poisson`: exponential gaps (a coefficient of variation of 1), seeded;
- `gamma:CV`: gamma gaps with coefficient of variation CV (shape 1 / CV^2): CV < 1 smoother than
  Poisson, CV > 1 burstier (ServeGen fits its clients' gaps with gamma and Weibull laws).
The generated gaps are scaled to sum to the trace's span (the first request at the trace's first
arrival, the last at its last), so the mean rate, the rate scales and the target mean the same in
every process, whatever the seed.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from odmactl.core.errors import ConfigError, not_one_of
from odmactl.sim.workload import Workload

ARRIVALS = ("trace", "poisson", "gamma:CV")
MIN_CV, MAX_CV = 0.01, 100.0


def parse_arrivals(text: str) -> tuple[str, float | None]:
    """`--arrivals` as (kind, CV): ("trace", None), ("poisson", None) or ("gamma", CV)."""
    value = text.strip().lower()
    if value in ("trace", "poisson"):
        return value, None
    if value.startswith("gamma:"):
        try:
            cv = float(value.split(":", 1)[1])
        except ValueError:
            cv = math.nan
        if math.isfinite(cv) and MIN_CV <= cv <= MAX_CV:
            return "gamma", cv
        raise ConfigError(f"--arrivals gamma:CV expects a coefficient of variation from {MIN_CV:g} to {MAX_CV:g}, "
                          f"got '{text}'")
    raise ConfigError(not_one_of("--arrivals", text, ARRIVALS))


def canonical(kind: str, cv: float | None) -> str:
    """The process as the JSON names it, whatever its spelling on the command line."""
    return kind if kind != "gamma" else f"gamma:{cv:g}"


def label(kind: str, cv: float | None, seed: int) -> str:
    """How the output names the process."""
    if kind == "trace":
        return "the trace's own gaps (bursts kept), rescaled"
    law = "exponential (Poisson)" if kind == "poisson" else f"gamma, CV {cv:g}"
    return f"{law} gaps at the trace's mean rate, seed {seed}"


def with_arrivals(w: Workload, kind: str, cv: float | None, seed: int) -> Workload:
    """The workload with its arrivals drawn from the process (the module docstring); `trace`
    leaves it as it is."""
    if kind == "trace" or w.size < 2:
        return w
    start, span = int(w.arrival_ps[0]), int(w.arrival_ps[-1] - w.arrival_ps[0])
    mean_gap = span / (w.size - 1)
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        gaps = rng.exponential(mean_gap, w.size - 1)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, mean_gap / shape, w.size - 1)
    total = float(gaps.sum())
    gaps = gaps * (span / total) if total > 0 else np.full(w.size - 1, mean_gap)
    arrival = np.minimum(start + np.round(np.concatenate([[0.0], np.cumsum(gaps)])).astype(np.int64), start + span)
    return dataclasses.replace(w, arrival_ps=arrival)
