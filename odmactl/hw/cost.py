"""Step-time model for one device running one model: decode, prefill and migration times.

decode:    t = max(weight_bytes / seq_bw + sum_r kv_read_s(r), 2 * active_params * batch / peak_flops)
               + step_overhead
           kv_read_s(r) = sum over the request's runs of (run_bytes / stream_bw + access_s)
prefill:   t = max((2 * active_params * P + 2 * layers * heads * head_dim * P^2) summed over prompts / peak_flops,
                   (weight_bytes + new KV bytes) / sequential_bw) + step_overhead
migration: t = 2 * bytes / sequential_bw   (read the old block, write the new one)

Tensor parallelism over `tp` devices (vLLM's Megatron-style split, ModelProfile.shard): every
device holds one shard, runs the formulas above for it in lockstep with the others, and each layer
adds two all-reduces of the activations (after attention and after the MLP), `hidden_size` values
of 16 bits per token, with the ring formula of the profile's [interconnect]
(DeviceProfile.interconnect, `Interconnect.allreduce_s`):
           allreduce(S) = base_latency + 2 (tp - 1) * step_latency + 2 (tp - 1) / tp * S / link_bw
decode:    + 2 * layers * allreduce(batch * hidden * 2 B)    (not overlapped with the step)
prefill:   + 2 * layers * allreduce(prompt tokens * hidden * 2 B)
migration: each device copies its shard of the block, so bytes / tp per device.

DecodeStep.overhead_s carries the all-reduces. `eff(c)` is the device's bandwidth table: the share
of peak bandwidth reached reading runs of c bytes at scattered offsets. The model reads it in its two-parameter form, a run of c bytes costing
`c / stream_bw + access_s` (a fixed cost per scattered access plus streaming): `stream_bw` is the
table's rate at its longest run (the table stays flat beyond it) and `access_s` makes the form exact
at the reference run, one 16-token paged block of this model in one layer. So the model agrees with
the table on both runs the paged-versus-contiguous comparison turns on, and a batch's KV time is
linear in its tokens plus its run count, which lets the replay sum many iterations in closed form
(sim/loop.py). A contiguous request (static, S3, ODMA) is one run per layer of
`tokens * kv_bytes_per_token_layer` bytes; a paged request is one run per block per layer. Weights
stream in one sequential pass, so they read at the sequential efficiency (DESIGN.md writes them at
peak; that would read a contiguous KV run slower than the weights beside it). The causal attention
term of prefill counts QK^T and AV over the lower triangle: 2 * P^2 * heads * head_dim per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odmactl.hw.profiles import DeviceProfile, ModelProfile

ACTIVATION_BYTES = 2  # the all-reduced activations are 16-bit (fp16 / bf16)


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


@dataclass(frozen=True)
class StepCoefficients:
    """The decode-step model in integer picoseconds, for the replay's exact arithmetic:
    step = max(weights + per_token * sum(kv tokens) + per_run * runs, compute_per_seq * batch)
           + overhead + comm_fixed + comm_per_seq * batch,
    where `runs` counts one per request (contiguous, `block_tokens` None) or one per started block
    (paged), each across all layers, and the comm terms are tensor parallelism's all-reduces (0
    on one device)."""

    weights_ps: int
    per_token_ps: int
    per_run_ps: int
    compute_per_seq_ps: int
    overhead_ps: int
    block_tokens: int | None
    comm_fixed_ps: int = 0
    comm_per_seq_ps: int = 0

    def batch_overhead_ps(self, batch: int) -> int:
        """What a step of `batch` requests adds outside the max: the fixed overhead and the all-reduces."""
        return self.overhead_ps + self.comm_fixed_ps + self.comm_per_seq_ps * batch

    def runs(self, kv_tokens: int) -> int:
        if kv_tokens <= 0:
            return 0
        return 1 if self.block_tokens is None else -(-kv_tokens // self.block_tokens)

    def step_ps(self, kv_tokens: list[int]) -> int:
        """One iteration over a batch, request by request (the replay's reference form)."""
        memory = self.weights_ps + sum(self.per_token_ps * c + self.per_run_ps * self.runs(c) for c in kv_tokens)
        return max(memory, self.compute_per_seq_ps * len(kv_tokens)) + self.batch_overhead_ps(len(kv_tokens))


@dataclass(frozen=True)
class PrefillCoefficients:
    """The prefill model's constants: one iteration over prompts of p_i tokens takes
    max(flops / peak_flops, memory_bytes / seq_bw) + overhead_s, with
    flops = flops_per_token * sum(p_i) + flops_per_square * sum(p_i ** 2) (attention is quadratic in
    each prompt) and memory_bytes = weight_bytes + kv_bytes_per_token * sum(p_i) (weights read once
    for the batch), plus tensor parallelism's all-reduces, comm_fixed_s + comm_per_token_s * sum(p_i)
    (0 on one device). `seconds` is the reference; the replay's compiled clock
    (odmactl/sim/prefill.py) does the same float operations in the same order."""

    flops_per_token: float
    flops_per_square: float
    weight_bytes: int
    kv_bytes_per_token: int
    peak_flops: float
    seq_bw: float
    overhead_s: float
    comm_fixed_s: float = 0.0
    comm_per_token_s: float = 0.0

    def seconds(self, total_tokens: int, squared_tokens: int) -> float:
        total, squares = float(total_tokens), float(squared_tokens)
        flops = self.flops_per_token * total + self.flops_per_square * squares
        memory_bytes = self.weight_bytes + total * self.kv_bytes_per_token
        return max(flops / self.peak_flops, memory_bytes / self.seq_bw) + self.overhead_s + \
            (self.comm_fixed_s + self.comm_per_token_s * total)


def to_ps(seconds: float) -> int:
    return int(round(seconds * 1e12))


class CostModel:
    """Step times for `model` on `device`, or with `tp` > 1 for one shard of it on each of `tp`
    devices (`model` is then the shard, ModelProfile.shard); `compute_dtype` picks the peak rate
    (fp16 or bf16); `reference_block_tokens` is the paged block at which the run cost matches the
    table exactly."""

    def __init__(self, device: DeviceProfile, model: ModelProfile, compute_dtype: str = "fp16",
                 reference_block_tokens: int = 16, tp: int = 1) -> None:
        self.device = device
        self.model = model
        self.tp = tp
        # two all-reduces per layer of hidden_size 16-bit values per token: fixed + per-token seconds
        link = device.interconnect_for(tp)
        self.comm_fixed_s = 2 * model.num_layers * link.allreduce_latency_s(tp) if link else 0.0
        self.comm_per_token_s = 2 * model.num_layers * link.allreduce_s_per_byte(tp) * model.hidden_size \
            * ACTIVATION_BYTES if link else 0.0
        self.peak_flops = device.peak_flops(compute_dtype)
        self.peak_bw = device.peak_bandwidth_bytes_per_s
        self.seq_bw = device.sequential_bandwidth_bytes_per_s
        table = device.bandwidth
        self.stream_bw = self.peak_bw * table.efficiency[-1]
        ref = reference_block_tokens * model.kv_bytes_per_token_layer
        self.access_s = max(0.0, ref / (float(table.eff(ref)) * self.peak_bw) - ref / self.stream_bw)
        self.prefill = PrefillCoefficients(
            flops_per_token=2.0 * model.active_params,
            flops_per_square=2.0 * model.num_layers * model.num_attention_heads * model.head_dim,
            weight_bytes=model.weight_bytes, kv_bytes_per_token=model.kv_bytes_per_token,
            peak_flops=self.peak_flops, seq_bw=self.seq_bw, overhead_s=device.step_overhead_s,
            comm_fixed_s=self.comm_fixed_s, comm_per_token_s=self.comm_per_token_s)

    def run_s(self, run_bytes: np.ndarray) -> np.ndarray:
        """Time to read runs of these sizes at scattered offsets; an empty run costs nothing."""
        b = np.asarray(run_bytes, dtype=np.float64)
        return np.where(b > 0, b / self.stream_bw + self.access_s, 0.0)

    def kv_read_s(self, kv_tokens: np.ndarray, layout: KvLayout) -> np.ndarray:
        """Per request: seconds to read its KV once, every layer."""
        tokens = np.asarray(kv_tokens, dtype=np.float64)
        per_layer = self.model.kv_bytes_per_token_layer
        if layout.block_tokens is None:
            cost = self.run_s(tokens * per_layer)
        else:
            block = layout.block_tokens
            full, rest = np.floor_divide(tokens, block), np.mod(tokens, block)
            cost = full * self.run_s(block * per_layer) + self.run_s(rest * per_layer)
        return cost * self.model.num_layers

    def weights_s(self) -> float:
        return self.model.weight_bytes / self.seq_bw

    def decode_step(self, kv_tokens: np.ndarray, layout: KvLayout) -> DecodeStep:
        """One decode iteration for a batch whose requests hold `kv_tokens` each."""
        tokens = np.asarray(kv_tokens)
        kv_s = float(self.kv_read_s(tokens, layout).sum())
        compute_s = 2.0 * self.model.active_params * tokens.size / self.peak_flops
        comm_s = self.comm_fixed_s + self.comm_per_token_s * tokens.size
        return DecodeStep(self.weights_s(), kv_s, compute_s, self.device.step_overhead_s + comm_s)

    def step_coefficients(self, layout: KvLayout) -> StepCoefficients:
        """This model's decode step in integer picoseconds (each coefficient rounded once)."""
        layers = self.model.num_layers
        return StepCoefficients(
            weights_ps=to_ps(self.weights_s()),
            per_token_ps=to_ps(self.model.kv_bytes_per_token_layer * layers / self.stream_bw),
            per_run_ps=to_ps(self.access_s * layers),
            compute_per_seq_ps=to_ps(2.0 * self.model.active_params / self.peak_flops),
            overhead_ps=to_ps(self.device.step_overhead_s),
            block_tokens=layout.block_tokens,
            comm_fixed_ps=to_ps(self.comm_fixed_s),
            comm_per_seq_ps=to_ps(self.comm_per_token_s),
        )

    def decode_step_s(self, kv_tokens: np.ndarray, layout: KvLayout) -> float:
        return self.decode_step(kv_tokens, layout).total_s

    def prefill_s(self, prompt_tokens) -> float:
        """One prefill iteration over the given prompts (batched: the weights are read once)."""
        p = [int(x) for x in prompt_tokens]
        return self.prefill.seconds(sum(p), sum(x * x for x in p))

    def migration_s(self, num_bytes: float) -> float:
        """Copy a contiguous KV block into the large pool: read it and write it once each, each
        device its 1/tp shard of the `num_bytes` in parallel."""
        return 2.0 * num_bytes / self.tp / self.seq_bw

    def kv_pool_bytes(self) -> int:
        """The pool over all `tp` devices: each keeps what its profile leaves beside its shard."""
        return self.device.kv_pool_bytes(self.model, self.tp)
