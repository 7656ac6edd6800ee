"""What a command that replays fixes before any work: one serving spec (the deployment) that
replay's, check's and plan's specs extend, and how the load is shaped. Every numeric setting is
checked here, where it enters, with a message naming its flag."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from odmactl.core.errors import ConfigError, not_one_of
from odmactl.core.limits import MAX_NUM_SEQS, MAX_REQUESTS, MAX_TOKENS, MAX_TP, check_seed, check_whole
from odmactl.hw.cost import PAGED_BLOCK_TOKENS
from odmactl.rules.engines import ENGINES


def _positive_int(value: object, flag: str, high: int | None) -> None:
    """None, or a whole number from 1 to `high` (None: no upper limit here)."""
    if value is not None:
        check_whole(value, 1, value if high is None and isinstance(value, int) else high, flag)


@dataclass(frozen=True)
class LoadOptions:
    """`offline`: everything arrives at t=0; `rate_per_s`: timestamps rescaled to this mean rate
    (Poisson arrivals, seeded, for a trace without timestamps); `skip`: leave out the first N
    requests (the part plan validated on starts after its search part); `limit`: then the first N."""

    rate_per_s: float | None = None
    offline: bool = False
    limit: int | None = None
    seed: int = 0
    skip: int = 0

    def __post_init__(self) -> None:
        if self.rate_per_s is not None and not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise ConfigError(f"--rate must be > 0 requests/s, got {self.rate_per_s}")
        if self.offline and self.rate_per_s is not None:
            raise ConfigError("--offline and --rate exclude each other")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1):
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        check_seed(self.seed)
        check_whole(self.skip, 0, MAX_REQUESTS, "--skip")


def papers_static(max_new_tokens: int) -> dict[str, object]:
    """static's [allocator] settings for a slot of prompt + `max_new_tokens`: Cambricon-vLLM's
    pre-allocation under vLLM's max_tokens, the ODMA papers' baseline."""
    return {"static_slot": "prompt_plus_max_new", "max_new_tokens": max_new_tokens}


@dataclass(frozen=True)
class ServingSpec:
    """The deployment a replay models: a model on a device profile (on `tp` of them, tensor
    parallel) at a KV precision, its KV pool (None: what the profile leaves), max_model_len and the
    batch caps (None: derived or the config's), and where predicted lengths come from (a fit
    artifact, `oracle` or `none`; None: the config's [plan] predictor where the command reads a
    config). A config planned for another deployment is refused unless `allow_mismatch`."""

    device: str
    model: str
    kv_dtype: str = "fp16"
    predictor: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_pool_bytes: int | None = None
    tp: int = 1  # tensor parallelism: the model split over this many devices of the profile
    allow_mismatch: bool = False  # run a config's settings on another deployment than its [plan] (a warning)
    block_size_tokens: int | None = None  # --block-size: the paged policy's block (None: the config's, else 16)
    max_new_tokens: int | None = None  # --max-new-tokens: vLLM's max_tokens; static then reserves prompt + this
    engine: str | None = None  # --engine: the engine version replayed (None: the config's, else the device's)
    prefix_caching: bool | None = None  # --prefix-caching / --no-prefix-caching (None: the config's, else the engine's)

    def allocator_overrides(self) -> dict[str, object]:
        """The [allocator] settings the command line sets over a config's: paged's block size.
        (--max-new-tokens caps the outputs, the scheduler's setting; static's slot follows the cap
        in force, `papers_static`.)"""
        return {} if self.block_size_tokens is None else {"block_size_tokens": self.block_size_tokens}

    def __post_init__(self) -> None:
        _positive_int(self.max_model_len, "--max-model-len", MAX_TOKENS)
        _positive_int(self.max_num_seqs, "--max-num-seqs", MAX_NUM_SEQS)
        _positive_int(self.max_num_batched_tokens, "--max-num-batched-tokens", MAX_TOKENS)
        check_whole(self.tp, 1, MAX_TP, "--tp")
        _positive_int(self.kv_pool_bytes, "--kv-pool (in bytes)", None)  # the profile bounds it
        _positive_int(self.max_new_tokens, "--max-new-tokens", MAX_TOKENS)
        if self.engine is not None and self.engine not in ENGINES:
            raise ConfigError(not_one_of("--engine", self.engine, ENGINES))
        if self.block_size_tokens is not None and self.block_size_tokens not in PAGED_BLOCK_TOKENS:
            raise ConfigError(not_one_of("--block-size", self.block_size_tokens, PAGED_BLOCK_TOKENS)
                              + " (the block sizes vLLM's attention kernels take)")


@dataclass(frozen=True)
class ReplaySpec(ServingSpec):
    """`odmactl replay` and `check`: the serving spec, the config whose tables apply, the load, and
    whether time advances in closed form (fast-forward) or token by token."""

    config: Path | None = None
    load: LoadOptions = LoadOptions()
    fast_forward: bool = True
