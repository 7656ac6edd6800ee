"""Train / held-out splits of a trace that never leak a prompt across the two sides."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from odmactl.core.errors import TraceError, not_one_of

SPLITS = ("prompt", "time")


@dataclass(frozen=True)
class Split:
    """Row positions (into the trace frame, ascending) of the two sides. Invariant: no prompt
    (the text, or the request id where there is no text) has rows on both sides."""

    train_rows: np.ndarray
    test_rows: np.ndarray
    by: str
    holdout: float
    seed: int
    dropped_rows: int  # time split: training rows removed because their prompt recurs later

    def to_dict(self) -> dict:
        return {"by": self.by, "holdout": self.holdout, "seed": self.seed, "train_rows": int(self.train_rows.size),
                "test_rows": int(self.test_rows.size), "dropped_leaking_rows": self.dropped_rows}


def prompt_keys(frame: pl.DataFrame) -> pl.Series:
    """What "the same prompt" means: the prompt text when there is one, else the request id."""
    return frame.select(pl.coalesce(pl.lit("t:") + pl.col("prompt_text"), pl.lit("r:") + pl.col("request_id")))[:, 0]


def split_trace(frame: pl.DataFrame, holdout: float, by: str = "prompt", seed: int = 0) -> Split:
    """"prompt": a seeded random `holdout` share of the distinct prompts (all their rows) is held
    out; "time": the last `holdout` share of rows by arrival is held out and earlier rows with a
    held-out prompt are dropped from training."""
    if by not in SPLITS:
        raise TraceError(not_one_of("--split-by", by, SPLITS))
    if not 0.0 < holdout < 1.0:
        raise TraceError(f"--holdout must be a fraction between 0 and 1, got {holdout}")
    keys = prompt_keys(frame)
    codes = keys.rank("dense").to_numpy().astype(np.int64) - 1  # ids in sorted key order: deterministic
    num_groups = int(codes.max()) + 1 if codes.size else 0
    if num_groups < 2:
        raise TraceError(f"the trace has {num_groups} distinct prompt(s); a held-out split needs at least 2")
    dropped = 0
    if by == "prompt":
        take = min(max(1, math.ceil(holdout * num_groups)), num_groups - 1)
        test_group = np.zeros(num_groups, dtype=bool)
        test_group[np.random.default_rng(seed).permutation(num_groups)[:take]] = True
        is_test = test_group[codes]
        is_train = ~is_test
    else:
        cut = min(max(1, math.floor((1.0 - holdout) * codes.size)), codes.size - 1)
        is_test = np.arange(codes.size) >= cut
        test_group = np.zeros(num_groups, dtype=bool)
        test_group[codes[cut:]] = True
        is_train = ~is_test & ~test_group[codes]
        dropped = int((~is_test).sum() - is_train.sum())
    train = np.flatnonzero(is_train)
    if not train.size:
        raise TraceError(f"the {by} split leaves no training rows: every early prompt recurs in the held-out part")
    return Split(train, np.flatnonzero(is_test), by, holdout, seed, dropped)
