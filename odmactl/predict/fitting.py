"""The `odmactl fit` job: split without leaks, train the predictor, fit quantile buckets on the
training part, evaluate on the held-out part, and describe the result (the artifact's extra tables
and the command's JSON)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.core.errors import TraceError
from odmactl.core.limits import HOLDOUT_RANGE, MAX_BUCKETS, MAX_GAMMA, check_seed, check_whole
from odmactl.predict.evaluation import EvalSettings
from odmactl.predict.predictor import UPPER_QUANTILE, LengthPredictor, PredictorSettings, ProgressFn
from odmactl.rules.buckets import quantile_boundaries
from odmactl.trace.splits import split_trace


@dataclass(frozen=True)
class FitRequest:
    num_buckets: int = 4
    holdout: float = 0.2
    split_by: str = "prompt"
    seed: int = 0
    gamma: float = 0.2
    tau: float = 0.8
    granularity_tokens: int = 16

    def __post_init__(self) -> None:
        check_whole(self.num_buckets, 1, MAX_BUCKETS, "--buckets")
        low, high = HOLDOUT_RANGE
        if not low <= self.holdout <= high:
            raise TraceError(f"--holdout must be between {low} and {high} (a share of the trace), got {self.holdout}")
        check_seed(self.seed)
        if not (math.isfinite(self.gamma) and 0 <= self.gamma <= MAX_GAMMA):
            raise TraceError(f"--gamma must be a number from 0 to {MAX_GAMMA:g}, got {self.gamma}")
        if not (math.isfinite(self.tau) and self.tau >= 0):
            raise TraceError(f"--tau must be a finite number >= 0, got {self.tau}")


@dataclass
class FitOutcome:
    predictor: LengthPredictor
    summary: dict  # deterministic: the same trace, settings and seed give the same summary

    def artifact_tables(self) -> dict:
        """What the artifact records beside the predictor: the trace, split, buckets and evaluation."""
        return {key: self.summary[key] for key in ("trace", "split", "buckets", "evaluation")}


def run_fit(frame: pl.DataFrame, trace_name: str, settings: PredictorSettings, request: FitRequest, *,
            encoder_dir: Path | None = None, progress: ProgressFn | None = None) -> FitOutcome:
    split = split_trace(frame, request.holdout, request.split_by, request.seed)
    train, test = frame[split.train_rows], frame[split.test_rows]
    predictor = LengthPredictor.fit(train, settings, seed=request.seed, encoder_dir=encoder_dir, progress=progress)
    kv_tokens = (train["prompt_tokens"].cast(pl.Int64) + train["output_tokens"].cast(pl.Int64)).to_numpy()
    boundaries = quantile_boundaries(kv_tokens, request.num_buckets, granularity_tokens=request.granularity_tokens,
                                     max_tokens=settings.max_model_len_tokens)
    evaluation = predictor.evaluate(test, EvalSettings(boundaries, request.gamma, request.tau,
                                                       settings.max_model_len_tokens, settings.s3_num_buckets))
    summary = {
        "trace": trace_name,
        "family": settings.family, "mode": settings.mode,
        "split": split.to_dict(),
        "buckets": {"num_buckets": request.num_buckets, "granularity_tokens": request.granularity_tokens,
                    "boundaries_tokens": [int(b) for b in boundaries],
                    "over": "KV tokens (prompt + output) of the training part"},
        "training": predictor.state.training,
        "uncertainty": ({"u": "headroom: (L_hi / L_hat - 1) / (headroom_scale - 1), clipped to [0, 1]",
                         "upper_quantile": UPPER_QUANTILE, "headroom_scale": predictor.state.headroom_scale,
                         "coverage_gamma": predictor.state.coverage_gamma} if settings.mode == "odma"
                        else {"u": "normalised class entropy"}),
        "evaluation": evaluation,
        "held_out_output_tokens": _describe(test["output_tokens"].to_numpy()),
    }
    return FitOutcome(predictor, summary)


def _describe(values: np.ndarray) -> dict:
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)), "max": int(values.max())}
