"""Step-time model for one device running one model: decode, prefill and migration times.

decode:    t = max((weight_bytes / eff_seq + sum_r kv_read_bytes(r)) / peak_bw,
                   2 * active_params * batch / peak_flops) + step_overhead
           kv_read_bytes(r) = sum over the request's runs of run_bytes / eff(run_bytes)
prefill:   t = max((2 * active_params * P + 2 * layers * heads * head_dim * P^2) summed over prompts / peak_flops,
                   (weight_bytes + new KV bytes) / sequential_bw) + step_overhead
migration: t = 2 * bytes / sequential_bw   (read the old block, write the new one)

`eff(c)` is the device's bandwidth table: the share of peak bandwidth reached reading runs of c bytes
at scattered offsets. A contiguous request (static, S3, ODMA) is one run per layer of
`tokens * kv_bytes_per_token_layer` bytes; a paged request is one run per block per layer. Weights
stream in one sequential pass, so they read at the sequential efficiency (DESIGN.md writes them at
peak; that would read a contiguous KV run slower than the weights beside it). The causal attention
term of prefill counts QK^T and AV over the lower triangle: 2 * P^2 * heads * head_dim per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odmactl.profiles import DeviceProfile, ModelProfile


@dataclass(frozen=True)
class KvLayout:
    """How each request's KV lies in memory: `block_tokens` None is one contiguous run per layer,
    an integer >= 1 is one run per block of that many tokens per layer (vLLM-style paging)."""

    block_tokens: int | None = None

    def __post_init__(self) -> None:
        assert self.block_tokens is None or self.block_tokens >= 1, self.block_tokens

    @classmethod
    def contiguous(cls) -> KvLayout:
        return cls(None)

    @classmethod
    def paged(cls, block_tokens: int = 16) -> KvLayout:
        return cls(block_tokens)

    @property
    def label(self) -> str:
        return "contiguous" if self.block_tokens is None else f"paged ({self.block_tokens}-token blocks)"


@dataclass(frozen=True)
class DecodeStep:
    """One decode iteration's time and where it goes; `total_s` = max(memory_s, compute_s) + overhead_s."""

    weights_s: float
    kv_s: float
    compute_s: float
    overhead_s: float

    @property
    def memory_s(self) -> float:
        return self.weights_s + self.kv_s

    @property
    def total_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.overhead_s

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


class CostModel:
    """Step times for `model` on `device`; `compute_dtype` picks the peak rate (fp16 or bf16)."""

    def __init__(self, device: DeviceProfile, model: ModelProfile, compute_dtype: str = "fp16") -> None:
        self.device = device
        self.model = model
        self.peak_flops = device.peak_flops(compute_dtype)
        self.peak_bw = device.peak_bandwidth_bytes_per_s
        self.seq_bw = device.sequential_bandwidth_bytes_per_s

    def kv_read_bytes(self, kv_tokens: np.ndarray, layout: KvLayout) -> np.ndarray:
        """Per request: bytes at peak bandwidth that take as long as reading its KV once (bytes / eff)."""
        tokens = np.asarray(kv_tokens, dtype=np.float64)
        per_layer = self.model.kv_bytes_per_token_layer
        eff = self.device.bandwidth.eff

        def run_cost(run_bytes):  # an empty run costs 0: eff() stays positive at 0 bytes
            return run_bytes / eff(run_bytes)

        if layout.block_tokens is None:
            cost = run_cost(tokens * per_layer)
        else:
            block = layout.block_tokens
            full, rest = np.floor_divide(tokens, block), np.mod(tokens, block)
            cost = full * run_cost(block * per_layer) + run_cost(rest * per_layer)
        return cost * self.model.num_layers

    def decode_step(self, kv_tokens: np.ndarray, layout: KvLayout) -> DecodeStep:
        """One decode iteration for a batch whose requests hold `kv_tokens` each."""
        tokens = np.asarray(kv_tokens)
        weights_s = self.model.weight_bytes / self.seq_bw
        kv_s = float(self.kv_read_bytes(tokens, layout).sum()) / self.peak_bw
        compute_s = 2.0 * self.model.active_params * tokens.size / self.peak_flops
        return DecodeStep(weights_s, kv_s, compute_s, self.device.step_overhead_s)

    def decode_step_s(self, kv_tokens: np.ndarray, layout: KvLayout) -> float:
        return self.decode_step(kv_tokens, layout).total_s

    def prefill_s(self, prompt_tokens: np.ndarray) -> float:
        """One prefill iteration over the given prompts (batched: the weights are read once)."""
        p = np.asarray(prompt_tokens, dtype=np.float64)
        m = self.model
        flops = 2.0 * m.active_params * p.sum() + 2.0 * m.num_layers * m.num_attention_heads * m.head_dim * (p * p).sum()
        memory_bytes = m.weight_bytes + p.sum() * m.kv_bytes_per_token
        return max(flops / self.peak_flops, memory_bytes / self.seq_bw) + self.device.step_overhead_s

    def migration_s(self, num_bytes: float) -> float:
        """Copy a contiguous KV block into the large pool: read it and write it once each."""
        return 2.0 * num_bytes / self.seq_bw

    def kv_pool_bytes(self) -> int:
        return self.device.kv_pool_bytes(self.model)
