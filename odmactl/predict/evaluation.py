"""Held-out evaluation of a length predictor, in DESIGN.md's metric names.

Everything is a function of four arrays (prompt tokens, realized output tokens, L_hat, u) and the
allocation settings, so the figures are exactly what the `odma` allocator would do with them.

Beside each bucket accuracy stands what the trivial predictor scores: a constant predictor that
always names the most common bucket of the training part (`constant_buckets`; ties go to the
smaller bucket). A predictor is worth its keep on a bucket accuracy only where it beats that
figure: on the shipped Alpaca sample 97.3% (max length 2,048) to 99.8% (4,096) of outputs fall in
S3's first bucket, so a `bucket_accuracy_s3` that high says nothing by itself. A constant predictor ranks nothing, so its Kendall tau is undefined (None, null in JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import kendalltau

from odmactl.rules.odma import reserved_kv_tokens
from odmactl.rules.s3 import s3_capacities, s3_classes

GAMMA_CURVE = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
NUM_DECILES = 10
UNIFORM_FACTOR = 2.0  # the u-blind reservation of the decile table: twice L_hat


@dataclass(frozen=True)
class EvalSettings:
    boundaries_tokens: tuple[int, ...]  # fitted quantile buckets over KV tokens (prompt + output)
    gamma: float
    tau: float
    max_model_len_tokens: int  # the large pool's block, and S3's maximum length
    s3_num_buckets: int = 10
    # the constant predictor's buckets (`constant_buckets` of the training part); None: the most
    # common bucket of the evaluated part itself, the best any constant predictor can score there
    constant_bucket: int | None = None  # a fitted bucket over KV tokens (len(boundaries): past the last)
    constant_bucket_s3: int | None = None  # an S3 class over output tokens

    def with_constant_from(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> EvalSettings:
        """These settings with the constant predictor fitted on (training) rows."""
        fitted, s3 = constant_buckets(prompt_tokens, output_tokens, self)
        return replace(self, constant_bucket=fitted, constant_bucket_s3=s3)


def _fitted_classes(kv_tokens: np.ndarray, boundaries_tokens: tuple[int, ...]) -> np.ndarray:
    """The fitted bucket of each KV length; a length past the last boundary is a class of its own."""
    return np.searchsorted(np.asarray(boundaries_tokens, dtype=np.int64), kv_tokens, side="left")


def _mode(classes: np.ndarray) -> int:
    """The most common class; a tie goes to the smallest."""
    return int(np.argmax(np.bincount(classes)))


def constant_buckets(prompt_tokens: np.ndarray, output_tokens: np.ndarray, s: EvalSettings) -> tuple[int, int]:
    """(fitted bucket, S3 class) that a constant predictor names: the most common of `s`'s fitted
    buckets over KV tokens (prompt + output) and of S3's classes over output tokens, in these rows."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    actual = np.asarray(output_tokens, dtype=np.int64)
    assert prompt.size == actual.size > 0
    s3_buckets = s3_capacities(s.max_model_len_tokens, s.s3_num_buckets)
    return _mode(_fitted_classes(prompt + actual, s.boundaries_tokens)), _mode(s3_classes(actual, s3_buckets))


def _reserve(prompt: np.ndarray, l_hat: np.ndarray, u: np.ndarray, s: EvalSettings, *, gamma: float,
             tau: float) -> tuple[np.ndarray, np.ndarray]:
    return reserved_kv_tokens(prompt, l_hat, u, s.boundaries_tokens, gamma=gamma, tau=tau,
                              max_tokens=s.max_model_len_tokens)


def reservation_metrics(prompt: np.ndarray, actual: np.ndarray, reserved: np.ndarray, large: np.ndarray,
                        s: EvalSettings, *, gamma: float, tau: float) -> dict:
    """For one (gamma, tau) and the reservation it gives (`_reserve`): under_rate (realized KV >
    the KV reserved at admission), and from the reservation each request ends with (an overflow
    migrates to a large-pool block of max_model_len tokens) the mean reserved/actual KV per request
    and kv_utilization (sum actual / sum reserved); plus the share routed to the large pool at
    admission."""
    actual_kv = prompt + actual
    under = actual_kv > reserved
    final = np.where(under, s.max_model_len_tokens, reserved)  # an overflow migrates to the large pool
    return {
        "gamma": gamma, "tau": tau,
        "under_rate": float(np.mean(under)),
        "reserved_over_actual": float(np.mean(final / actual_kv)),
        "kv_utilization": float(actual_kv.sum() / final.sum()),
        "routed_large_rate": float(np.mean(large)),
    }


def evaluate_predictions(prompt_tokens: np.ndarray, output_tokens: np.ndarray, l_hat: np.ndarray,
                         uncertainty: np.ndarray, s: EvalSettings, extra_gammas: tuple[float, ...] = ()) -> dict:
    """The held-out figures; the gamma curve covers GAMMA_CURVE and `extra_gammas` (the predictor's
    conformal coverage gamma), in increasing order."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    actual = np.asarray(output_tokens, dtype=np.int64)
    l_hat = np.asarray(l_hat, dtype=np.int64)
    u = np.asarray(uncertainty, dtype=np.float64)
    assert prompt.size == actual.size == l_hat.size == u.size > 0

    s3_buckets = s3_capacities(s.max_model_len_tokens, s.s3_num_buckets)
    s3_pred, s3_true = s3_classes(l_hat, s3_buckets), s3_classes(actual, s3_buckets)
    # fitted buckets over KV tokens; a length past the last boundary is a class of its own (large)
    fit_pred = _fitted_classes(prompt + l_hat, s.boundaries_tokens)
    fit_true = _fitted_classes(prompt + actual, s.boundaries_tokens)
    # the constant predictor: the training part's most common bucket, else the evaluated part's
    mode_of = "training part" if s.constant_bucket is not None and s.constant_bucket_s3 is not None else "held-out part"
    const_fit = s.constant_bucket if s.constant_bucket is not None else _mode(fit_true)
    const_s3 = s.constant_bucket_s3 if s.constant_bucket_s3 is not None else _mode(s3_true)
    # constant predictions (or lengths) rank nothing: tau-b is undefined (None), as for the baseline
    tau_b = kendalltau(l_hat, actual).statistic if np.unique(l_hat).size > 1 else None
    if tau_b is not None and not np.isfinite(tau_b):  # all actual lengths equal: nothing to rank either
        tau_b = None

    hedged, large = _reserve(prompt, l_hat, u, s, gamma=s.gamma, tau=s.tau)
    main = reservation_metrics(prompt, actual, hedged, large, s, gamma=s.gamma, tau=s.tau)
    curve = [reservation_metrics(prompt, actual, *_reserve(prompt, l_hat, u, s, gamma=g, tau=s.tau), s,
                                 gamma=g, tau=s.tau) for g in sorted(set(GAMMA_CURVE) | set(extra_gammas))]

    # u deciles: does u mean what it says? u is the headroom a request needs over L_hat, so under one
    # reservation for everyone that ignores u (UNIFORM_FACTOR x L_hat) the under_rate should rise with
    # u. (The fitted bucket of prompt + L_hat, "unhedged", is also shown; its rounding slack varies
    # with L_hat, which confounds it.)
    no_hedge, _ = _reserve(prompt, l_hat, u, s, gamma=0.0, tau=np.inf)
    order = np.argsort(u, kind="stable")
    deciles = []
    for d, rows in enumerate(np.array_split(order, NUM_DECILES)):
        if rows.size == 0:
            continue
        kv = prompt[rows] + actual[rows]
        deciles.append({"decile": d + 1, "rows": int(rows.size), "u_min": float(u[rows].min()),
                        "u_max": float(u[rows].max()),
                        "under_rate_uniform": float(np.mean(actual[rows] > UNIFORM_FACTOR * l_hat[rows])),
                        "under_rate_unhedged": float(np.mean(kv > no_hedge[rows])),
                        "under_rate": float(np.mean(kv > hedged[rows]))})
    return {
        "rows": int(prompt.size),
        "mae_tokens": float(np.mean(np.abs(l_hat - actual))),
        "kendall_tau": None if tau_b is None else float(tau_b),
        "bucket_accuracy_s3": float(np.mean(s3_pred == s3_true)),
        "bucket_accuracy": float(np.mean(fit_pred == fit_true)),
        "constant_bucket_accuracy_s3": float(np.mean(s3_true == const_s3)),
        "constant_bucket_accuracy": float(np.mean(fit_true == const_fit)),
        "constant_kendall_tau": None,  # a constant ranks nothing: tau-b is undefined
        "constant_predictor": {"bucket": int(const_fit), "bucket_s3": int(const_s3), "mode_of": mode_of},
        "under_rate": main["under_rate"],
        "reserved_over_actual": main["reserved_over_actual"],
        "kv_utilization": main["kv_utilization"],
        "routed_large_rate": main["routed_large_rate"],
        "gamma": s.gamma, "tau": s.tau,
        "boundaries_tokens": [int(b) for b in s.boundaries_tokens],
        "s3_bucket_width_tokens": s3_buckets[0],
        "gamma_curve": curve,
        "u_deciles": deciles,
    }
