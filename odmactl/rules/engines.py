"""The serving engines a replay models, by version, and the rules each applies that a plan must
respect: how it schedules (whole prompts, or chunked with decodes first), its default batch caps
on a device, the block sizes its attention kernels take and the flags it runs with.

- `vllm-v0`: vLLM before v1 and Cambricon-vLLM 0.6.2 (the ODMA papers' engine). An iteration runs
  either whole prompts (prefill) or one token of every running request (decode); the prefill token
  budget defaults to max(max_model_len, 2048) and the batch cap to 256 (vllm/config.py
  `SchedulerConfig`, 0.6.x: `max_num_batched_tokens = max(max_model_len, 2048)` without chunked
  prefill; vllm/engine/arg_utils.py `max_num_seqs = 256`). Block sizes 8, 16 and 32 (arg_utils.py
  `--block-size` choices, 0.6.x).
- `vllm-v1`: vLLM v1 (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`): one token budget per
  step, spent on the running requests first (one token per decode, the rest of a prompt being
  chunked), then on waiting prompts, chunked to what is left. Chunked prefill is always on and
  prefix caching on by default (arg_utils.py `_set_default_args_v1`). The batch caps default by
  device (arg_utils.py `EngineArgs.get_batch_defaults`, `vllm serve`'s OPENAI_API_SERVER
  context): a device with at least 70 GiB whose name does not contain "a100" (H100, H200, MI300x)
  gets 8,192 tokens and 1,024 sequences, any other 2,048 and 256 (PR #17885: a larger budget
  lowered A100 throughput). Block sizes: multiples of 16 (vllm/v1/attention/backends/
  flash_attn.py `get_supported_kernel_block_sizes` -> MultipleOf(16); FlashInfer takes 16, 32,
  64), so 8 is refused.

Automatic prefix caching (`enable_prefix_caching`): off by default in vLLM 0.6 (arg_utils.py,
0.6.x: `enable_prefix_caching: bool = False`), on by default in v1 (above). odmactl replays it for
`paged` where the trace carries prefix hashes (allocator/prefix.py).

Both refuse `max_num_seqs` above `max_num_batched_tokens` (vllm/config.py
`SchedulerConfig._verify_args`: "max_num_batched_tokens (...) must be greater than or equal to
max_num_seqs (...)").
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM_V0 = "vllm-v0"
VLLM_V1 = "vllm-v1"
GIB = 1 << 30
V0_MIN_BATCHED_TOKENS = 2048  # vLLM 0.6: max(max_model_len, this) without chunked prefill
LARGE_DEVICE_BYTES = 70 * GIB  # vLLM v1's get_batch_defaults: at least this much memory (and not an A100)


@dataclass(frozen=True)
class Engine:
    """One engine version: `chunked` (vLLM v1's schedule: decodes first, prompts chunked into the
    budget left) or whole-prompt prefills, and the block sizes its attention kernels take (the
    module docstring cites where each rule is read from)."""

    name: str
    chunked: bool
    block_sizes: tuple[int, ...]
    prefix_caching: bool  # enable_prefix_caching's default

    def batch_defaults(self, capacity_bytes: float, device_name: str, max_model_len: int) -> tuple[int, int]:
        """(max_num_seqs, max_num_batched_tokens) this engine starts with on a device of
        `capacity_bytes` named `device_name` at `max_model_len` (the module docstring)."""
        if not self.chunked:
            return 256, max(max_model_len, V0_MIN_BATCHED_TOKENS)
        if capacity_bytes >= LARGE_DEVICE_BYTES and "a100" not in device_name.lower():
            return 1024, 8192
        return 256, 2048

    def block_problem(self, block_tokens: int) -> str | None:
        """Why this engine refuses paged blocks of `block_tokens` tokens (None: it takes them)."""
        if block_tokens in self.block_sizes:
            return None
        return (f"{self.name} takes blocks of {', '.join(map(str, self.block_sizes))} tokens, not {block_tokens}"
                + (" (its CUDA attention backends take multiples of 16: vllm/v1/attention/backends/flash_attn.py)"
                   if self.chunked else ""))


ENGINES: dict[str, Engine] = {
    VLLM_V0: Engine(VLLM_V0, chunked=False, block_sizes=(8, 16, 32), prefix_caching=False),
    VLLM_V1: Engine(VLLM_V1, chunked=True, block_sizes=(16, 32), prefix_caching=True),
}
DEFAULT_ENGINE = VLLM_V0  # a device profile that names none: the schedule odmactl replayed before v1 existed


def seqs_problem(max_num_seqs: int, max_num_batched_tokens: int) -> str | None:
    """vLLM's refusal of a batch cap above the token budget (None: accepted)."""
    if max_num_seqs <= max_num_batched_tokens:
        return None
    return (f"max_num_seqs ({max_num_seqs:,}) is above max_num_batched_tokens ({max_num_batched_tokens:,}), which vLLM "
            "refuses: max_num_batched_tokens must be greater than or equal to max_num_seqs (vllm/config.py "
            "SchedulerConfig)")
