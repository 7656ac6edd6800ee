"""The scheduler's settings in vLLM's terms, and how a replay advances time."""

from __future__ import annotations

from dataclasses import dataclass

from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_NUM_SEQS, MAX_TOKENS, whole_number_problem
from odmactl.rules.engines import ENGINES, V0_MIN_BATCHED_TOKENS, VLLM_V0
from odmactl.sim.schedulers import DEFAULT_SCHEDULER, SCHEDULERS

MAX_AGING_S = 86_400 * 365  # a year: longer is no bound at all


@dataclass(frozen=True)
class SchedulerSettings:
    """The batch caps, in vLLM's terms, the scheduler that applies them, and how time advances.

    `policy` names the scheduler (sim/schedulers: "fcfs", vLLM 0.6's first come, first served;
    "task_pool", the ODMA papers' Task Pool); None: each KV policy's own (its `scheduler`: odma's
    is "task_pool", the others' "fcfs"). `aging_s` is the task pool's starvation bound: a request
    that has waited longer and does not fit stops admission of anyone younger.
    `engine` is the engine version whose schedule the replay runs (rules/engines.py): "vllm-v0",
    whole-prompt prefill iterations between decode iterations, or "vllm-v1", one token budget a
    step, decodes first and prompts chunked into the rest.
    `max_num_seqs` is the most requests in a batch, `max_num_batched_tokens` the token budget of
    one iteration (vllm-v0: of a prefill), defaulting as vLLM 0.6's does without chunked prefill
    (vllm/config.py, SchedulerConfig): max(max_model_len, 2048). (A command fills both from the
    engine's defaults on its device where neither a flag nor a config sets them: run/replay.py.) `max_new_tokens` is vLLM's per-request
    `max_tokens` (SamplingParams): a request stops after that many output tokens (counted as
    truncated, like one that reaches max_model_len); None: no cap. `fast_forward` sums the decode
    iterations between events in closed form (False: token by token, the reference).
    `prefix_caching` is vLLM's enable_prefix_caching (None: the engine's default; it applies to
    `paged` on a trace with prefix hashes, allocator/prefix.py).

    Invariant (checked): `policy` is a registered scheduler; `max_num_seqs`,
    `max_num_batched_tokens` and `max_new_tokens` (None: the defaults above) are whole numbers
    >= 1, so every iteration admits or runs at least one request; `series_points` >= 2.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: max(max_model_len, V0_MIN_BATCHED_TOKENS)
    max_new_tokens: int | None = None
    policy: str | None = None
    aging_s: float = 2.0
    fast_forward: bool = True
    series_points: int = 512
    engine: str = VLLM_V0
    prefix_caching: bool | None = None  # None: the engine's default (rules/engines.py)

    @property
    def caches_prefixes(self) -> bool:
        """Whether the engine runs with automatic prefix caching (vLLM's enable_prefix_caching)."""
        return ENGINES[self.engine].prefix_caching if self.prefix_caching is None else self.prefix_caching

    @property
    def chunked(self) -> bool:
        """Whether the engine chunks prompts into a step's budget beside the decodes (vLLM v1)."""
        return ENGINES[self.engine].chunked

    def policy_for(self, allocator_cls) -> str:
        """The scheduler a replay of this KV policy (its class) runs: `policy`, else the policy's own."""
        return self.policy or getattr(allocator_cls, "scheduler", DEFAULT_SCHEDULER)

    def batched_tokens(self, max_model_len: int) -> int:
        """The token budget of one iteration."""
        return self.max_num_batched_tokens or max(max_model_len, V0_MIN_BATCHED_TOKENS)

    def __post_init__(self) -> None:
        for key, low, high in (("max_num_seqs", 1, MAX_NUM_SEQS), ("max_num_batched_tokens", 1, MAX_TOKENS),
                               ("max_new_tokens", 1, MAX_TOKENS), ("series_points", 2, 1 << 20)):
            value = getattr(self, key)
            problem = None if value is None else whole_number_problem(value, low, high)
            if problem is not None:
                raise ConfigError(problem, key=key)
        if isinstance(self.aging_s, bool) or not isinstance(self.aging_s, (int, float)) \
                or not 0 <= self.aging_s <= MAX_AGING_S:
            raise ConfigError(f"expected seconds from 0 to {MAX_AGING_S:,}, got {self.aging_s!r}", key="aging_s")
        if self.prefix_caching is not None and not isinstance(self.prefix_caching, bool):
            raise ConfigError(f"expected true or false, got {self.prefix_caching!r}", key="prefix_caching")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r} (choose from: {', '.join(ENGINES)})", key="engine")
        if self.policy is not None and self.policy not in SCHEDULERS:
            raise ConfigError(f"unknown scheduler {self.policy!r} (choose from: {', '.join(SCHEDULERS)})", key="policy")
