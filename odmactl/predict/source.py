"""Where a replay's predicted lengths come from: `none`, `oracle` or an `odmactl fit` artifact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from odmactl.core.errors import PredictorError
from odmactl.predict.settings import PREDICTOR_CHOICES

__all__ = ["PREDICTOR_CHOICES", "predictions"]


def predictions(frame: pl.DataFrame, predictor: str) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(L_hat, u, label): `none` (no prediction), `oracle` (the realized lengths, u = 0) or the
    artifact folder `predictor` (torch is imported only then)."""
    if predictor == "none":
        return None, None, "none"
    if predictor == "oracle":
        return frame["output_tokens"].to_numpy().astype(np.float64), np.zeros(frame.height), "oracle"
    from odmactl.predict.artifact import read_artifact

    model = read_artifact(Path(predictor))
    l_hat, u = (a.astype(np.float64) for a in model.predict(frame))
    bad = ~(np.isfinite(l_hat) & np.isfinite(u))
    if bad.any():
        raise PredictorError(f"predicted a non-finite length or uncertainty for {int(bad.sum()):,} requests (the first is "
                             f"request {frame['request_id'][int(np.argmax(bad))]!r})", file=predictor,
                             hint="refit with `odmactl fit`")
    return l_hat, u, str(predictor)
