"""Options every reader receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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
