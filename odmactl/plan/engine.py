"""A plan in a serving engine's terms: the [engine.vllm] and [engine.odma] tables of the config.

Every value is derived from the deployment plan replayed (device and model profiles, tp, KV pool,
max_model_len, scheduler) and the recommended allocator settings, never copied from elsewhere:

[engine.vllm] (vLLM's and Cambricon-vLLM's engine arguments, `vllm serve MODEL <serve_args>`):
  engine                   the engine version replayed (rules/engines.py): vllm-v0 (vLLM before v1,
                           Cambricon-vLLM 0.6.2) or vllm-v1; the settings below are for it
  enable_chunked_prefill   as replayed: true under vllm-v1 (always on there), false under vllm-v0
                           (written `--enable-chunked-prefill False`: vLLM 0.6 turns it on by
                           itself for long contexts)
  enable_prefix_caching    as replayed (--prefix-caching, [scheduler] prefix_caching, else the
                           engine's default: on in v1, off in 0.6); odmactl caches prefixes for
                           paged on a trace with prefix hashes (allocator/prefix.py), and a
                           trace without them replays the same either way
  tensor_parallel_size     tp
  max_model_len            the max_model_len replayed
  max_num_seqs             the scheduler's batch cap
  max_num_batched_tokens   the scheduler's prefill budget of one iteration
  block_size               the paged baseline's block (16 tokens, vLLM's default on CUDA)
  num_gpu_blocks_override  the KV pool in blocks: pool tokens // block_size. Under tensor parallelism
                           every worker holds the same block count, each for its share of the KV
                           heads, so the count is the group's pool tokens over the block size. It
                           replaces the block count vLLM profiles from gpu_memory_utilization, in
                           v0 (vllm/worker/worker.py determine_num_available_blocks, then
                           CacheConfig) and in v1 (vllm/v1/core/kv_cache_utils.py
                           get_num_blocks: the override wins, with a log line); either way the
                           memory must still hold those blocks, which gpu_memory_utilization
                           below leaves room for
  gpu_memory_utilization   the share of one device's memory the engine may take: its weights shard,
                           the activation reserve and its share of the KV pool, over the device's
                           capacity (rounded down to 4 places: never more than plan assumed; the
                           block count fixes the pool itself)
  kv_cache_dtype           "auto" for 16-bit KV, "fp8" for fp8; int8, int4 and Oaken have no vLLM
                           KV cache type: then only the first five are written, with a `note`
                           (the block count and memory share hold only at that precision)

[engine.odma] (an engine with ODMA's allocator: one contiguous block per request):
  kv_pool_bytes, kv_bytes_per_token   the pool and a token's KV bytes over the tp group
  large_pool_bytes, main_pool_bytes    the large pool as the allocator sizes it, and the rest
  large_block_tokens                  what one large-bucket block holds: "prompt + N" under an
                                      output cap of N (max_tokens), else max_model_len
  large_pool_blocks                   without a cap, the large pool in max_model_len blocks; with
                                      one, in blocks of the longest prompt the plan saw + N
  large_spill                         whether a large block that finds the large pool full at
                                      admission is carved from the main pool ([allocator]
                                      large_spill, docs/policies.md)
  scheduler, aging_s                  the scheduler (the papers' task pool, or vLLM's fcfs) and the
                                      task pool's starvation bound
  bucket_block_bytes                  the starting bucket table in bytes: each [allocator]
                                      boundary's block (the allocator refits it online)
"""

from __future__ import annotations

import shlex

from odmactl.allocator import AllocatorConfig
from odmactl.allocator.odma import large_pool_bytes
from odmactl.core.errors import ConfigError
from odmactl.rules.engines import ENGINES, seqs_problem
from odmactl.rules.odma import large_slot_tokens
from odmactl.run.serving import Serving

VLLM_KV_CACHE_DTYPE = {"fp16": "auto", "bf16": "auto", "fp8": "fp8"}
VLLM_ARGS = ("tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
             "num_gpu_blocks_override", "gpu_memory_utilization", "kv_cache_dtype")
VLLM_FLAGS = ("enable_chunked_prefill", "enable_prefix_caching")  # v1's booleans: --x or --no-x


def vllm_settings(setup: Serving, kv_dtype: str, max_len: int, max_num_seqs: int, max_num_batched_tokens: int,
                  block: int, engine: str, prefix_caching: bool = False) -> dict:
    """[engine.vllm]: the launch settings the plan corresponds to (the module docstring), with the
    paged baseline's block of `block` tokens, for `engine` (a name in rules/engines.ENGINES). A
    combination that engine refuses is a ConfigError (the replay refused it first: run/replay.py)."""
    version = ENGINES[engine]
    problem = seqs_problem(max_num_seqs, max_num_batched_tokens) or version.block_problem(block)
    if problem is not None:
        raise ConfigError(problem)
    device = setup.device
    per_device_bytes = setup.model.weight_bytes + device.activation_reserve_bytes + setup.pool_bytes / setup.tp
    utilization = int(per_device_bytes / device.capacity_bytes * 10_000) / 10_000
    out: dict = {"engine": engine, "enable_chunked_prefill": version.chunked, "enable_prefix_caching": prefix_caching,
                 "tensor_parallel_size": setup.tp, "max_model_len": max_len, "max_num_seqs": max_num_seqs,
                 "max_num_batched_tokens": max_num_batched_tokens, "block_size": block}
    if kv_dtype not in VLLM_KV_CACHE_DTYPE:  # its blocks at 16 bits would not fit: no memory settings, no command
        out["note"] = (f"vLLM has no {kv_dtype} KV cache: the pool and block count of this plan hold only in an "
                       f"engine that stores KV at {kv_dtype}")
        return out
    out.update(num_gpu_blocks_override=setup.pool_tokens // block, gpu_memory_utilization=utilization,
               kv_cache_dtype=VLLM_KV_CACHE_DTYPE[kv_dtype])
    if version.chunked:  # v1's boolean flags (argparse BooleanOptionalAction): --x / --no-x
        flags = [f"--{'' if out[key] else 'no-'}{key.replace('_', '-')}" for key in VLLM_FLAGS]
    else:  # 0.6's StoreBoolean takes a value; prefix caching is off unless --enable-prefix-caching is given
        flags = ["--enable-chunked-prefill False"] + (["--enable-prefix-caching"] if prefix_caching else [])
    out["serve_args"] = " ".join([f"--{key.replace('_', '-')} {shlex.quote(str(out[key]))}" for key in VLLM_ARGS]
                                 + flags)
    return out


def odma_settings(setup: Serving, allocator: AllocatorConfig, max_new_tokens: int | None = None,
                  longest_prompt_tokens: int = 0, scheduler: str | None = None, aging_s: float | None = None) -> dict:
    """[engine.odma]: the pools, the large block, the starting bucket table in bytes and the
    scheduler (the module docstring)."""
    max_len = allocator.max_model_len_tokens
    large = large_pool_bytes(setup.pool_bytes, setup.bytes_per_token, allocator, max_new_tokens or 0)
    block_tokens = large_slot_tokens(longest_prompt_tokens, max_new_tokens, max_len)
    out = {"kv_pool_bytes": setup.pool_bytes, "kv_bytes_per_token": setup.bytes_per_token,
           "main_pool_bytes": setup.pool_bytes - large, "large_pool_bytes": large,
           "large_block_tokens": f"prompt + {max_new_tokens}, at most {max_len}" if max_new_tokens else max_len,
           "large_pool_blocks": large // (block_tokens * setup.bytes_per_token),
           "large_spill": allocator.large_spill,
           "bucket_block_bytes": [b * setup.bytes_per_token for b in allocator.boundaries_tokens]}
    if scheduler is not None:
        out["scheduler"] = scheduler
        if scheduler == "task_pool" and aging_s is not None:
            out["aging_s"] = aging_s
    return out
