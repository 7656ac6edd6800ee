"""The search space of `odmactl plan` (its module docstring lists it): the candidates, and the
hedge tables that candidates with a hedge reserve by."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from odmactl.allocator.odma import NEVER, tau_setting
from odmactl.predict.source import PREDICTOR_CHOICES
from odmactl.rules.buckets import LEVEL_SHAPES, shaped_levels
from odmactl.rules.hedge import HedgeTable, fit_hedge_tables
from odmactl.sim.workload import Workload

BUCKETS = (4, 6, 8, 12, 16, 32, 64, 128, 256)
GAMMAS = (0.0, 0.25, 0.5, 1.0, 2.0)
COVERAGE_FRACTIONS = (0.5, 0.7, 0.85, 1.0, 1.2)  # of the predictor's coverage gamma
TAUS = (0.5, 0.8, math.inf)
HEDGE_GROUPS = (8, 16, 32)  # hedge tables (odmactl/rules/hedge.py): groups of L_hat
HEDGE_LIMIT_FRACTIONS = (0.3, 0.5, 0.7, 1.0)  # of the migration-rate limit, the share a table may outgrow where fitted
HEDGE_FIT_SHARE = 2 / 3  # a table is fitted on this earlier share of the search part, measured on the rest
LARGE_FRACTIONS = (0.05, 0.1, 0.2)  # the bounds' large pool; the config's is sized from the replay's peak
TOP_QUANTILES = (0.95, 0.99, 1.0)  # the top regular bucket's level; the tail past it goes to the large pool
REFITS = ((10_000, 1_000), (2_000, 200))


@dataclass(frozen=True)
class Candidate:
    """One point of the search space; `allocator_table()` is its [allocator] settings."""

    num_buckets: int
    levels: str
    gamma: float
    tau: float
    large_pool_fraction: float
    refit_window: int
    refit_every: int
    hedge_groups: int = 0  # > 0: a hedge table over this many groups of L_hat replaces gamma
    hedge_limit: float = 0.0  # the share of requests the table may outgrow where it is fitted
    max_model_len_tokens: int = 0  # > 0: a max_model_len cap below plan's default (`model_len_caps`); 0: the default
    top_quantile: float = 1.0

    def quantile_levels(self) -> tuple[float, ...]:
        return shaped_levels(self.num_buckets, self.levels, self.top_quantile)

    @property
    def boundary_key(self) -> tuple[int, str, float, int, int, int]:
        """What its boundaries over a workload depend on: candidates that share it share them."""
        return (self.num_buckets, self.levels, self.top_quantile, self.refit_window, self.refit_every,
                self.max_model_len_tokens)

    def allocator_table(self) -> dict:
        """Its [allocator] settings as a config writes them: the levels by their shape's name, tau
        "never" when infinite (AllocatorConfig reads both)."""
        return {"num_buckets": self.num_buckets, "top_quantile": self.top_quantile, "quantile_levels": self.levels,
                "gamma": self.gamma, "tau": tau_setting(self.tau),
                "large_pool_fraction": self.large_pool_fraction, "refit_window": self.refit_window,
                "refit_every": self.refit_every}

    @property
    def label(self) -> str:
        tau = f"{self.tau:g}" if math.isfinite(self.tau) else NEVER
        large = f"{self.large_pool_fraction:.0%}"
        hedge = f"hedge={self.hedge_groups}@{self.hedge_limit:.2%}" if self.hedge_groups else f"gamma={self.gamma:g}"
        cap = f" max_len={self.max_model_len_tokens}" if self.max_model_len_tokens else ""
        return (f"B={self.num_buckets} {self.levels}@{self.top_quantile:g} {hedge} tau={tau} "
                f"large={large} refit={self.refit_window}/{self.refit_every}{cap}")


def candidate_grid(coverage_gamma: float | None = None, max_overflow_rate: float | None = None) -> list[Candidate]:
    """The gamma candidates, and with a fitted predictor (`coverage_gamma`) and a migration-rate
    limit also the hedge-table candidates (tau never: the table hedges by L_hat instead of u)."""
    gammas = list(GAMMAS)
    if coverage_gamma is not None and coverage_gamma > 0:
        gammas += [g for g in (round(f * coverage_gamma, 3) for f in COVERAGE_FRACTIONS) if g not in gammas]
    grid = [Candidate(b, lv, g, t, f, w, e, top_quantile=q) for b in BUCKETS for lv in LEVEL_SHAPES
            for q in TOP_QUANTILES for g in gammas for t in TAUS for f in LARGE_FRACTIONS for w, e in REFITS]
    if coverage_gamma is not None and max_overflow_rate:
        grid += [Candidate(b, lv, 0.0, math.inf, f, w, e, k, round(share * max_overflow_rate, 6), top_quantile=q)
                 for b in BUCKETS for lv in LEVEL_SHAPES for q in TOP_QUANTILES for k in HEDGE_GROUPS
                 for share in HEDGE_LIMIT_FRACTIONS for f in LARGE_FRACTIONS for w, e in REFITS]
    return grid


CAP_ROUND_TOKENS = 1024  # a max_model_len cap is rounded up to this
MAX_UNSERVED_SHARE = 0.5  # no cap leaves more of the requests past it (plan refuses such a trace, too)


def model_len_caps(kv_tokens: np.ndarray, default_len: int, max_rejection_rate: float) -> list[int]:
    """The max_model_len values plan searches: its default, then, when some requests may go
    unserved (--max-rejection-rate r > 0, taken as at most MAX_UNSERVED_SHARE), caps below it that
    leave at most r and r/2 of the search part's requests past them (rejected, or truncated at the
    cap): the (1 - r) and (1 - r/2) quantiles of their KV tokens, rounded up to CAP_ROUND_TOKENS. A lower cap shrinks the large
    pool's blocks, which is where a long tail costs ODMA the most."""
    caps = [default_len]
    allowed = min(max_rejection_rate, MAX_UNSERVED_SHARE)
    if allowed > 0 and kv_tokens.size:
        for share in (allowed, allowed / 2):
            q = float(np.quantile(kv_tokens, 1.0 - share, method="higher"))
            cap = -(-int(q) // CAP_ROUND_TOKENS) * CAP_ROUND_TOKENS
            if CAP_ROUND_TOKENS <= cap < default_len and cap not in caps:
                caps.append(cap)
    return caps


def coverage_gamma(predictor: str) -> float | None:
    """The fitted predictor's conformal coverage gamma (None for "oracle", or an s3-mode predictor)."""
    from pathlib import Path

    from odmactl.predict.artifact import read_manifest

    if predictor in PREDICTOR_CHOICES:
        return None

    manifest = read_manifest(Path(predictor))
    if manifest["settings"].get("mode") != "odma":
        return None
    return float(manifest["state"]["coverage_gamma"])


def workload_lengths(w: Workload, max_len: int,
                     max_new_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the bounds and the hedge fits read of a workload: prompt tokens, realized KV tokens
    (capped at max_len, outputs at `max_new_tokens`), the output tokens generated within both, and
    L_hat (at least 1, at most the cap: the replay's prediction, sim/batch.py)."""
    assert w.predicted_output_tokens is not None, "plan needs predictions"
    prompt = w.prompt_tokens.astype(np.int64)
    kv = w.kv_tokens(max_len, max_new_tokens)
    l_hat = np.maximum(w.predicted_output_tokens, 1.0)
    if max_new_tokens is not None:
        l_hat = np.minimum(l_hat, float(max_new_tokens))
    return prompt, kv, kv - np.minimum(prompt, kv), l_hat


def fit_hedges(w: Workload, max_len: int, candidates: list[Candidate],
               max_new_tokens: int | None = None) -> dict[tuple[int, float], HedgeTable]:
    """The hedge tables of the candidates' (groups, limit) pairs, fitted on workload `w`'s
    predictions and realized lengths (one fit per group count serves all its limits)."""
    prompt, _, output, l_hat = workload_lengths(w, max_len, max_new_tokens)
    limits: dict[int, dict[float, None]] = {}
    for c in candidates:
        if c.hedge_groups:
            limits.setdefault(c.hedge_groups, {})[c.hedge_limit] = None
    return {(k, limit): table for k, wanted in limits.items()
            for limit, table in fit_hedge_tables(l_hat, prompt, output, max_len=max_len, groups=k,
                                                 limits=tuple(wanted)).items()}


def with_hedge(c: Candidate, hedges: dict[tuple[int, float], HedgeTable]) -> dict:
    """The candidate's [allocator] settings, with its hedge table when it has one."""
    table = c.allocator_table()
    if c.hedge_groups:
        hedge = hedges[(c.hedge_groups, c.hedge_limit)]
        table.update(hedge_edges=list(hedge.edges), hedge_output_tokens=list(hedge.output_tokens))
    return table
