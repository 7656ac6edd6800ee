"""From a canonical trace and the load options to the Workload a replay runs: arrivals shaped,
lengths predicted."""

from __future__ import annotations

import numpy as np
import polars as pl

from odmactl.core.errors import ConfigError
from odmactl.predict.source import predictions
from odmactl.run.spec import LoadOptions
from odmactl.sim.workload import CLOCK_LIMIT_PS, PS, Workload
from odmactl.trace.prefix import prefix_keys


def shape_arrivals(arrival_s: np.ndarray, load: LoadOptions) -> np.ndarray:
    """Arrival times in seconds after --offline / --rate."""
    n = arrival_s.size
    if load.offline:
        return np.zeros(n)
    if load.rate_per_s is None:
        return arrival_s - (arrival_s[0] if n else 0.0)
    span = float(arrival_s[-1] - arrival_s[0]) if n else 0.0
    if span > 0:
        return (arrival_s - arrival_s[0]) * ((n - 1) / span) / load.rate_per_s
    gaps = np.random.default_rng(load.seed).exponential(1.0 / load.rate_per_s, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def tenant_adapters(frame: pl.DataFrame) -> np.ndarray | None:
    """One LoRA adapter per tenant (a policy that serves adapters loads it for the tenant's
    requests): codes in order of first appearance, -1 where the tenant is empty (null or blank);
    None when the trace names no tenant."""
    if "tenant" not in frame.columns:
        return None
    tenant = frame["tenant"].cast(pl.String)
    names = tenant.drop_nulls().unique(maintain_order=True).to_list()  # in order of first appearance
    code_of = np.full(len(names) + 1, -1, dtype=np.int64)  # by position in `names`; the last: null
    codes = 0
    for k, name in enumerate(names):  # the distinct tenants only (a trace's rows may be millions)
        if name.strip():
            code_of[k] = codes
            codes += 1
    if not codes:
        return None
    position = tenant.cast(pl.Enum(names)).to_physical().cast(pl.Int64).fill_null(len(names)).to_numpy()
    return code_of[position]


def build_workload(frame: pl.DataFrame, load: LoadOptions, predictor: str) -> tuple[Workload, pl.DataFrame, str]:
    """(the workload, the frame it was built from after --skip and --limit, the predictor's label)."""
    if load.skip:
        if load.skip >= frame.height:
            raise ConfigError(f"--skip {load.skip:,} leaves none of the trace's {frame.height:,} requests")
        frame = frame.slice(load.skip)
    if load.limit is not None:
        frame = frame.head(min(load.limit, frame.height))
    arrival_s = shape_arrivals(frame["arrival_s"].to_numpy().astype(np.float64), load)
    if arrival_s.size and not arrival_s[-1] * PS < CLOCK_LIMIT_PS:
        raise ConfigError(f"the arrivals span {arrival_s[-1]:.4g} s ({arrival_s[-1] / 86400:.4g} days); the replay's "
                          f"clock holds {CLOCK_LIMIT_PS / PS / 86400:.0f} days of simulated time",
                          hint="replay fewer requests (--limit) or faster arrivals (--rate)")
    l_hat, u, label = predictions(frame, predictor)
    workload = Workload(
        adapters=tenant_adapters(frame),
        request_ids=frame["request_id"].to_list(),
        arrival_ps=np.round(arrival_s * PS).astype(np.int64),
        prompt_tokens=frame["prompt_tokens"].to_numpy().astype(np.int64),
        output_tokens=frame["output_tokens"].to_numpy().astype(np.int64),
        predicted_output_tokens=l_hat, uncertainty=u, prefix=prefix_keys(frame))
    return workload, frame, label
