"""What `odmactl plan` fixes before any work: the serving spec and the search's settings."""

from __future__ import annotations

from dataclasses import dataclass

from odmactl.core.errors import ConfigError
from odmactl.run.spec import ServingSpec

OBJECTIVES = ("tps", "utilization")
EXECUTORS = ("process", "ray")


@dataclass(frozen=True)
class PlanSpec(ServingSpec):
    """`odmactl plan`: the serving spec (the predictor is required: a fit artifact or oracle) and
    the search's objective, constraints, split and executors."""

    predictor: str = "oracle"
    objective: str = "tps"
    max_overflow_rate: float = 0.005  # --max-migration-rate: (migrations + preemptions) / requests
    ttft_p99_s: float | None = None
    holdout: float = 0.3
    replays: int = 12
    workers: int = 1
    executor: str = "process"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective expects one of {', '.join(OBJECTIVES)}, got '{self.objective}'")
        if not 0.0 <= self.max_overflow_rate <= 1.0:
            raise ConfigError(f"--max-migration-rate must be in [0, 1], got {self.max_overflow_rate}")
        if self.ttft_p99_s is not None and not self.ttft_p99_s > 0:
            raise ConfigError(f"--ttft-p99 must be > 0 seconds, got {self.ttft_p99_s}")
        if not 0.05 <= self.holdout <= 0.8:
            raise ConfigError(f"--holdout must be between 0.05 and 0.8 (a share of the trace), got {self.holdout}")
        if self.replays < 1:
            raise ConfigError(f"--replays must be >= 1, got {self.replays}")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"--executor expects one of {', '.join(EXECUTORS)}, got '{self.executor}'")
