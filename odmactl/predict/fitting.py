"""The `odmactl fit` job: split without leaks, train the predictor, fit quantile buckets on the
training part, evaluate on the held-out part, and describe the result (the artifact's extra tables
and the command's JSON). With several seeds (`fit --seeds N`) the job is repeated with seeds seed,
seed + 1, ..., and the headline figures are summarised over them (`over_seeds`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.core.errors import ConfigError, TraceError
from odmactl.core.limits import HOLDOUT_RANGE, MAX_BUCKETS, MAX_GAMMA, MAX_SEED, MAX_SEEDS, check_seed, check_whole
from odmactl.predict.evaluation import EvalSettings
from odmactl.predict.predictor import UPPER_QUANTILE, LengthPredictor, PredictorSettings, ProgressFn
from odmactl.rules.buckets import quantile_boundaries
from odmactl.trace.splits import split_trace

# the figures `over_seeds` summarises, and the per-seed margins of a predictor over the constant one
SEED_METRICS = ("kendall_tau", "bucket_accuracy", "constant_bucket_accuracy", "bucket_accuracy_s3",
                "constant_bucket_accuracy_s3")
SEED_MARGINS = {"bucket_accuracy_over_constant": ("bucket_accuracy", "constant_bucket_accuracy"),
                "bucket_accuracy_s3_over_constant": ("bucket_accuracy_s3", "constant_bucket_accuracy_s3")}


U_MEANING = {  # odma mode's u, by the `uncertainty` setting (predictor.py's docstring)
    "entropy": "entropy: the classification head's softmax entropy over log(classes), in [0, 1] (the papers')",
    "headroom": "headroom: (L_hi / L_hat - 1) / (headroom_scale - 1), clipped to [0, 1]"}

@dataclass(frozen=True)
class FitRequest:
    num_buckets: int = 4
    holdout: float = 0.2
    split_by: str = "prompt"
    seed: int = 0
    gamma: float = 0.2
    tau: float = 0.8
    granularity_tokens: int = 16
    seeds: int = 1  # fits with seeds seed, seed + 1, ..., seed + seeds - 1 (run_fits)

    def __post_init__(self) -> None:
        check_whole(self.seeds, 1, MAX_SEEDS, "--seeds")
        check_whole(self.num_buckets, 1, MAX_BUCKETS, "--buckets")
        low, high = HOLDOUT_RANGE
        if not low <= self.holdout <= high:
            raise TraceError(f"--holdout must be between {low} and {high} (a share of the trace), got {self.holdout}")
        check_seed(self.seed)
        if self.seed + self.seeds - 1 > MAX_SEED:
            raise ConfigError(f"--seed {self.seed:,} with --seeds {self.seeds} runs past the largest seed, {MAX_SEED:,}")
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
    eval_settings = EvalSettings(boundaries, request.gamma, request.tau, settings.max_model_len_tokens,
                                 settings.s3_num_buckets).with_constant_from(train["prompt_tokens"].to_numpy(),
                                                                             train["output_tokens"].to_numpy())
    evaluation = predictor.evaluate(test, eval_settings)
    summary = {
        "trace": trace_name,
        "family": settings.family, "mode": settings.mode,
        "split": split.to_dict(),
        "buckets": {"num_buckets": request.num_buckets, "granularity_tokens": request.granularity_tokens,
                    "boundaries_tokens": [int(b) for b in boundaries],
                    "over": "KV tokens (prompt + output) of the training part"},
        "training": predictor.state.training,
        "uncertainty": ({"u": U_MEANING[predictor.uncertainty], "kind": predictor.uncertainty,
                         "upper_quantile": UPPER_QUANTILE, "headroom_scale": predictor.state.headroom_scale,
                         "coverage_gamma": predictor.state.coverage_gamma} if settings.mode == "odma"
                        else {"u": "normalised class entropy"}),
        "evaluation": evaluation,
        "held_out_output_tokens": _describe(test["output_tokens"].to_numpy()),
    }
    return FitOutcome(predictor, summary)


def run_fits(frame: pl.DataFrame, trace_name: str, settings: PredictorSettings, request: FitRequest, *,
             encoder_dir: Path | None = None, progress: ProgressFn | None = None) -> FitOutcome:
    """`run_fit` once per seed (request.seed, request.seed + 1, ...): the outcome is the first
    seed's predictor and summary, with `over_seeds` added (`summarise_seeds`)."""
    first, evaluations, splits = None, [], []
    for k in range(request.seeds):
        seed = request.seed + k
        outcome = run_fit(frame, trace_name, settings, replace(request, seed=seed, seeds=1), encoder_dir=encoder_dir,
                          progress=_labelled(progress, f" (seed {seed}, {k + 1} of {request.seeds})")
                          if progress and request.seeds > 1 else progress)
        first = first or outcome
        evaluations.append(outcome.summary["evaluation"])
        splits.append(outcome.summary["split"])
    first.summary["over_seeds"] = summarise_seeds([request.seed + k for k in range(request.seeds)], evaluations,
                                                  splits)
    return first


def summarise_seeds(seeds: list[int], evaluations: list[dict], splits: list[dict]) -> dict:
    """Mean, sample standard deviation (ddof=1; None for one seed) and per-seed values of the
    SEED_METRICS and SEED_MARGINS over the fits; the constant predictor's Kendall tau is undefined
    whatever the seed. A time split holds out the same rows whatever the seed, so there the seeds
    vary the training alone (initialisation, shuffling, the held-back validation prompts)."""
    def stats(values: list[float | None]) -> dict:
        if any(v is None or not math.isfinite(v) for v in values):
            return {"mean": None, "sd": None, "per_seed": values}
        arr = np.asarray(values, dtype=np.float64)
        return {"mean": float(arr.mean()), "sd": float(arr.std(ddof=1)) if arr.size > 1 else None,
                "per_seed": [float(v) for v in values]}

    metrics = {name: stats([ev[name] for ev in evaluations]) for name in SEED_METRICS}
    for name, (model, constant) in SEED_MARGINS.items():
        metrics[name] = stats([ev[model] - ev[constant] for ev in evaluations])
    metrics["constant_kendall_tau"] = {"mean": None, "sd": None, "per_seed": [None] * len(seeds)}
    return {"count": len(seeds), "seeds": seeds, "sd": "sample standard deviation (ddof=1)",
            "split_by": splits[0]["by"], "split_varies_with_seed": splits[0]["by"] == "prompt",
            "test_rows": [s["test_rows"] for s in splits], "metrics": metrics}


def _labelled(progress: ProgressFn, suffix: str) -> ProgressFn:
    def update(label: str, done: int, total: int) -> None:
        progress(label + suffix, done, total)
    return update


def _describe(values: np.ndarray) -> dict:
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)), "max": int(values.max())}
