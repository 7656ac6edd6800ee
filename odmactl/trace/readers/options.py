"""Options every reader receives."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from odmactl.core.errors import TraceError
from odmactl.core.limits import check_seed
from odmactl.trace.schema import ProgressFn


@dataclass(frozen=True)
class ReadOptions:
    """What the user said about how to read sources. `column_map` is canonical -> source column;
    `tokenizer_dir` None means the shipped default tokenizer; the servegen fields bound generation."""

    column_map: dict[str, str] = field(default_factory=dict)
    tokenizer_dir: Path | None = None
    seed: int = 0
    start_s: float = 0.0
    duration_s: float | None = None
    rate_scale: float = 1.0
    progress: ProgressFn | None = None

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise TraceError(f"--start must be a finite number of seconds >= 0, got {self.start_s}")
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise TraceError(f"--duration must be a finite number of seconds > 0, got {self.duration_s}")
        if not (math.isfinite(self.rate_scale) and self.rate_scale > 0):
            raise TraceError(f"--rate-scale must be a finite number > 0, got {self.rate_scale}")
