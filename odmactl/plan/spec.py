"""What `odmactl plan` fixes before any work: the serving spec and the search's settings."""

from __future__ import annotations

from dataclasses import dataclass

from odmactl.capacity.slo import Slo
from odmactl.core.errors import ConfigError, named_twice, not_one_of
from odmactl.core.limits import HOLDOUT_RANGE, MAX_REPLAYS, MAX_WORKERS, check_whole
from odmactl.run.executors import EXECUTORS
from odmactl.run.spec import ServingSpec
from odmactl.sim.metrics import LATENCY_LIMIT_SECONDS, latency_limit_ok

OBJECTIVES = ("tps", "utilization", "capacity")
DEFAULT_BASELINES = ("paged", "s3")


@dataclass(frozen=True)
class PlanSpec(ServingSpec):
    """`odmactl plan`: the serving spec (the predictor is required: a fit artifact or oracle) and
    the search's objective, constraints, split and executors."""

    predictor: str = "oracle"
    objective: str = "tps"
    max_overflow_rate: float = 0.005  # --max-migration-rate: (migrations + preemptions) / requests
    max_rejection_rate: float = 0.0  # --max-rejection-rate: rejected / requests (prompts past max_model_len)
    ttft_p99_s: float | None = None
    holdout: float = 0.3
    replays: int = 12
    workers: int = 1
    executor: str = "process"
    slo: Slo | None = None  # --objective capacity: the latency SLO the sustainable rate is found at
    # --baselines: the registered policies validated beside the recommendation, besides static's
    # slots (always there, odmactl/run/serving.static_baselines); never odma, the policy planned
    baselines: tuple[str, ...] = DEFAULT_BASELINES

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.objective not in OBJECTIVES:
            raise ConfigError(not_one_of("--objective", self.objective, OBJECTIVES))
        if not 0.0 <= self.max_overflow_rate <= 1.0:
            raise ConfigError(f"--max-migration-rate must be in [0, 1], got {self.max_overflow_rate}")
        if not 0.0 <= self.max_rejection_rate < 1.0:
            raise ConfigError(f"--max-rejection-rate must be in [0, 1), got {self.max_rejection_rate}")
        if self.ttft_p99_s is not None and not latency_limit_ok(self.ttft_p99_s):
            raise ConfigError(f"--ttft-p99 expects {LATENCY_LIMIT_SECONDS} (as check's limits), got {self.ttft_p99_s}")
        for name in ("max_overflow_rate", "max_rejection_rate"):  # -0.0 would be written to the config as such
            object.__setattr__(self, name, getattr(self, name) + 0.0)
        low, high = HOLDOUT_RANGE
        if not low <= self.holdout <= high:
            raise ConfigError(f"--holdout must be between {low} and {high} (a share of the trace), got {self.holdout}")
        check_whole(self.replays, 1, MAX_REPLAYS, "--replays")
        check_whole(self.workers, 1, MAX_WORKERS, "--workers")
        if self.executor not in EXECUTORS:
            raise ConfigError(not_one_of("--executor", self.executor, EXECUTORS))
        from odmactl.allocator import ALLOCATORS

        if not self.baselines:
            raise ConfigError("--baselines names no policy", hint="e.g. --baselines paged,s3")
        for name in self.baselines:
            if name not in ALLOCATORS or name in ("odma", "static"):
                others = [p for p in ALLOCATORS if p not in ("odma", "static")]
                raise ConfigError(f"--baselines: '{name}' is not a baseline (choose from: {', '.join(others)}; static's "
                                  "slots are always compared, odma is the policy planned)")
        if (twice := named_twice("--baselines", self.baselines)) is not None:
            raise ConfigError(twice)
        if self.objective == "capacity" and self.slo is None:
            raise ConfigError("--objective capacity needs --slo (e.g. --slo ttft_p99=2s,tpot_p99=100ms)")
        if self.objective != "capacity" and self.slo is not None:
            raise ConfigError("--slo applies to --objective capacity only")
