"""Step-time model for one device running one model: decode, prefill and migration times.

Every iteration is a sequence of kernels, and the model adds up their times (they run one after the
other on the device). The figures come from the device profile: peaks ([memory], [compute]), the
scattered-read table ([bandwidth]) and what the kernels reach ([kernels], profiles.Kernels; the
derivation is in profiles/README.md, "Kernels"). For a batch of n requests holding c_r KV tokens:

decode:  t = gemm(n) + L * (attn_fixed + elem_fixed) + n * (L * (attn_per_request + elem_per_token) + row)
             + sum_r kv_read(c_r) + step_overhead + comm(n)
prefill: t = gemm_layers(P) + gemm_head(N) + L * (pre_fixed + elem_fixed) + P * (L * (pre_per_token + elem_per_token) + row)
             + 2 L H d * sum_p p^2 / (peak_flops * pre_efficiency) + step_overhead + comm(P)
         over N prompts of p tokens, P = sum_p p
mixed:   a chunked step (vLLM v1) of n decodes beside prompt chunks of c_j new tokens after x_j
         computed ones, C = sum_j c_j:
         t = gemm_layers(n + C) + gemm_head(n + J) + decode's terms but its GEMMs + L * pre_fixed
             + C * (L * (pre_per_token + elem_per_token) + row) + comm_per_token * C
             + 2 L H d * sum_j ((x_j + c_j)^2 - x_j^2) / (peak_flops * pre_efficiency)
         over the J chunks: the GEMMs run once on all the step's tokens, the decodes read their KV
         as a decode does, and each chunk's queries attend to its context and to themselves (the
         squares' difference counts that lower-triangle band, so a prompt's chunks add up to its
         whole prefill's attention). Without decodes it is the prefill formula over the chunks.
migration: t = 2 * bytes / sequential_bw   (read the old block, write the new one)

- gemm(m) = gemm_layers(m) + gemm_head(m), each a roofline over its weights W and flops per token F
  reached at the profile's GEMM efficiency e(m): max(W / peak_bw, F * m / peak_flops) / e(m). The
  layers' W is every weight but the embedding table and the head; the head (vocab x hidden, the
  logits) runs for the decode batch and for the last token of each prompt only.
- row: the embedding rows a step reads, hidden * weight bytes per token, at the sequential rate.
- kv_read: vLLM keeps K and V in separate per-layer tensors, one [block, kv_head] run of
  block_tokens * head_dim * dtype bytes per KV head (the key cache's x-interleave,
  [blocks, kv_heads, head_dim / x, block_size, x], keeps that run contiguous), and each head's kernel
  reads its own runs. So a paged request is 2 * kv_heads * L runs per block; a contiguous request
  (static, S3, ODMA) is 2 * kv_heads * L runs of its whole length. A run of b bytes costs
  b / stream_bw + access_s, the two-parameter form of the scattered-read table `eff(b)`:
  `stream_bw` is the table's rate at its longest run and `access_s` makes the form exact at the
  layout's own run (block_tokens tokens of one head; 16 for contiguous layouts, whose runs are long
  enough for it not to matter). When [kernels] gives the engine's measured paged-attention rate
  (decode_kv_efficiency), the table is scaled to reach it at its 4 KiB anchor run
  (profiles.KV_ANCHOR_RUN_BYTES), so the table sets the shape and the engine the level; no run
  streams faster than peak bandwidth (then the access cost alone keeps the anchor exact).
- Attention's quadratic prefill term counts QK^T and AV over the lower triangle: 2 * P^2 * heads *
  head_dim per layer.

Tensor parallelism over `tp` devices (vLLM's Megatron-style split, ModelProfile.shard): every
device holds one shard, runs the formulas above for it in lockstep with the others, and each layer
adds two all-reduces of the activations (after attention and after the MLP), `hidden_size` values
of 16 bits per token, with the ring formula of the profile's [interconnect]
(DeviceProfile.interconnect, `Interconnect.allreduce_s`):
           allreduce(S) = base_latency + 2 (tp - 1) * step_latency + 2 (tp - 1) / tp * S / link_bw
comm(n) = 2 * layers * allreduce(n * hidden * 2 B); migration: each device copies its shard.

A batch's time is linear in its KV tokens and its run count, and constant in everything else while
its size n is, which lets the replay sum many iterations in closed form (sim/segment.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odmactl.hw.profiles import KV_ANCHOR_RUN_BYTES, DeviceProfile, ModelProfile, gemm_efficiency

ACTIVATION_BYTES = 2  # the all-reduced activations are 16-bit (fp16 / bf16)
LOGITS_FP32_BYTES = 4  # the sampler's float32 copy of the logits
CONTIGUOUS_REFERENCE_BLOCK_TOKENS = 16  # the run at which a contiguous layout's access cost is fitted
PAGED_BLOCK_TOKENS = (8, 16, 32)  # the block sizes vLLM's CUDA attention kernels take (--block-size)


@dataclass(frozen=True)
class KvLayout:
    """How each request's KV lies in memory: `block_tokens` None is one contiguous run per KV head
    per layer for K and for V, an integer >= 1 one such run per block of that many tokens
    (vLLM-style paging)."""

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
class Gemms:
    """The GEMMs of one forward pass: the layers' weights and flops per token, the head's, the
    device's peaks and its GEMM efficiency table. `seconds(m, prompts)` is the layers at m tokens
    plus the head at `prompts` tokens (the decode batch, or a prefill's last tokens)."""

    layer_bytes: float
    layer_flops_per_token: float
    head_bytes: float
    head_flops_per_token: float
    peak_bw: float
    peak_flops: float
    tokens: tuple[float, ...]
    efficiency: tuple[float, ...]

    def roofline_s(self, weight_bytes: float, flops_per_token: float, m: float) -> float:
        memory_s = weight_bytes / self.peak_bw
        compute_s = flops_per_token * m / self.peak_flops
        return (memory_s if memory_s > compute_s else compute_s) / gemm_efficiency(self.tokens, self.efficiency, m)

    def seconds(self, m: float, prompts: float) -> float:
        return self.roofline_s(self.layer_bytes, self.layer_flops_per_token, m) + \
            self.roofline_s(self.head_bytes, self.head_flops_per_token, prompts)


@dataclass(frozen=True)
class DecodeStep:
    """One decode iteration's time and where it goes; `total_s` is their sum (the kernels run one
    after the other): the GEMMs (weights), the KV reads, the fixed and per-request costs of the
    attention and elementwise kernels with the embedding rows and the step overhead, and tensor
    parallelism's all-reduces."""

    gemm_s: float
    kv_s: float
    fixed_s: float
    comm_s: float

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.kv_s + self.fixed_s + self.comm_s


@dataclass(frozen=True)
class StepCoefficients:
    """The decode-step model in integer picoseconds, for the replay's exact arithmetic:
    step = gemm_ps[n] + fixed + per_seq * n + per_token * sum(kv tokens) + per_run * runs,
    where n is the batch, `gemm_ps[n]` its GEMMs (one entry per batch size up to the replay's
    max_num_seqs), the fixed and per-seq terms include tensor parallelism's all-reduces (0 on one
    device), and `runs` counts one per request (contiguous, `block_tokens` None) or one per started
    block (paged), each across all layers, KV heads, K and V."""

    gemm_ps: tuple[int, ...]
    fixed_ps: int
    per_seq_ps: int
    per_token_ps: int
    per_run_ps: int
    block_tokens: int | None

    def batch_ps(self, batch: int) -> int:
        """What a step of `batch` requests takes besides its KV reads."""
        return self.gemm_ps[batch] + self.fixed_ps + self.per_seq_ps * batch

    def runs(self, kv_tokens: int) -> int:
        if kv_tokens <= 0:
            return 0
        return 1 if self.block_tokens is None else -(-kv_tokens // self.block_tokens)

    def step_ps(self, kv_tokens: list[int], runs: list[int] | None = None) -> int:
        """One iteration over a batch, request by request (the replay's reference form); `runs`:
        each request's run count, where the policy counts them (else from the layout)."""
        if runs is None:
            runs = [self.runs(c) for c in kv_tokens]
        kv = sum(self.per_token_ps * c + self.per_run_ps * r for c, r in zip(kv_tokens, runs))
        return self.batch_ps(len(kv_tokens)) + kv


@dataclass(frozen=True)
class PrefillCoefficients:
    """The prefill model's constants (module docstring): one iteration over `prompts` prompts of
    `total_tokens` tokens whose squares sum to `squared_tokens` takes `seconds(...)`. The replay's
    compiled clock (odmactl/sim/prefill.py) does the same float operations in the same order."""

    gemms: Gemms
    attention_flops_per_square: float
    attention_efficiency: float
    fixed_s: float
    per_token_s: float
    attention_fixed_s: float = 0.0  # the prefill attention kernel's own fixed part of fixed_s (L * pre_fixed)

    def seconds(self, total_tokens: int, squared_tokens: int, prompts: int) -> float:
        total, squares = float(total_tokens), float(squared_tokens)
        attention_s = self.attention_flops_per_square * squares / (self.gemms.peak_flops * self.attention_efficiency)
        return self.gemms.seconds(total, float(prompts)) + attention_s + self.fixed_s + self.per_token_s * total

    def beside_decodes_s(self, decodes: int, total_tokens: int, squared_tokens: int, chunks: int) -> float:
        """What `chunks` prompt chunks of `total_tokens` new tokens (attention squares
        `squared_tokens`) add to a decode step of `decodes` requests, the GEMMs of both included:
        the mixed step is this plus the decode step's time less its own GEMMs (module docstring)."""
        total, squares = float(total_tokens), float(squared_tokens)
        attention_s = self.attention_flops_per_square * squares / (self.gemms.peak_flops * self.attention_efficiency)
        return self.gemms.seconds(float(decodes) + total, float(decodes + chunks)) + attention_s + \
            self.attention_fixed_s + self.per_token_s * total


def to_ps(seconds: float) -> int:
    return int(round(seconds * 1e12))


class CostModel:
    """Step times for `model` on `device`, or with `tp` > 1 for one shard of it on each of `tp`
    devices (`model` is then the shard, ModelProfile.shard); `compute_dtype` picks the peak rate
    (fp16 or bf16)."""

    def __init__(self, device: DeviceProfile, model: ModelProfile, compute_dtype: str = "fp16", tp: int = 1) -> None:
        self.device = device
        self.model = model
        self.tp = tp
        self._step_cache: dict = {}  # (layout, max_batch) -> StepCoefficients, made once (step_coefficients)
        kernels = device.kernel_figures
        layers = model.num_layers
        # two all-reduces per layer of hidden_size 16-bit values per token: fixed + per-token seconds
        link = device.interconnect_for(tp)
        self.comm_fixed_s = 2 * layers * link.allreduce_latency_s(tp) if link else 0.0
        self.comm_per_token_s = 2 * layers * link.allreduce_s_per_byte(tp) * model.hidden_size \
            * ACTIVATION_BYTES if link else 0.0
        self.peak_flops = device.peak_flops(compute_dtype)
        self.peak_bw = device.peak_bandwidth_bytes_per_s
        self.seq_bw = device.sequential_bandwidth_bytes_per_s
        # the scattered-read table, scaled to the engine's measured paged-attention rate when known
        table = device.bandwidth
        anchor = float(table.eff(KV_ANCHOR_RUN_BYTES))
        self.kv_scale = kernels.decode_kv_efficiency / anchor if kernels.decode_kv_efficiency else 1.0
        # no run reads faster than peak: where the scaled table would (H100, H200: vLLM 0.24's kernel
        # pages at 0.91 of peak, and the table's 23% gather cost is the 2023 kernel's), contiguous
        # runs stream at peak and the access cost still makes the anchor run exact
        self.stream_bw = min(self.peak_bw * table.efficiency[-1] * self.kv_scale, self.peak_bw)
        self.row_s = model.hidden_size * model.weight_bytes_per_value / self.seq_bw  # one embedding row
        self.gemms = Gemms(
            layer_bytes=float(model.layer_weight_bytes), layer_flops_per_token=2.0 * model.layer_active_params,
            head_bytes=float(model.head_params * model.weight_bytes_per_value),
            head_flops_per_token=2.0 * model.head_params, peak_bw=self.peak_bw, peak_flops=self.peak_flops,
            tokens=tuple(float(t) for t in kernels.gemm_tokens), efficiency=tuple(kernels.gemm_efficiency))
        overhead = device.step_overhead_s
        self.decode_fixed_s = layers * (kernels.decode_layer_fixed_s + kernels.elementwise_layer_fixed_s) + overhead
        self.decode_per_seq_s = layers * (kernels.decode_per_request_s + kernels.elementwise_per_token_s) + self.row_s
        self.prefill = PrefillCoefficients(
            gemms=self.gemms,
            attention_flops_per_square=2.0 * layers * model.num_attention_heads * model.head_dim,
            attention_efficiency=kernels.prefill_attention_efficiency,
            fixed_s=layers * (kernels.prefill_layer_fixed_s + kernels.elementwise_layer_fixed_s) + overhead
            + self.comm_fixed_s,
            per_token_s=layers * (kernels.prefill_per_token_s + kernels.elementwise_per_token_s) + self.row_s
            + self.comm_per_token_s,
            attention_fixed_s=layers * kernels.prefill_layer_fixed_s)

    # ------------------------------------------------------------------------------ KV reads

    def access_s(self, layout: KvLayout) -> float:
        """The fixed cost of one scattered run: exact, against the (scaled) table, at the layout's run."""
        block = layout.block_tokens or CONTIGUOUS_REFERENCE_BLOCK_TOKENS
        ref = block * self.model.kv_run_bytes_per_token
        table_s = ref / (float(self.device.bandwidth.eff(ref)) * self.kv_scale * self.peak_bw)
        return max(0.0, table_s - ref / self.stream_bw)

    def runs_per_block(self) -> int:
        """Runs one block (or one contiguous request) is read as: K and V of every KV head of every layer."""
        return 2 * self.model.num_kv_heads * self.model.num_layers

    def run_s(self, run_bytes: np.ndarray, layout: KvLayout) -> np.ndarray:
        """Time to read runs of these sizes at scattered offsets; an empty run costs nothing."""
        b = np.asarray(run_bytes, dtype=np.float64)
        return np.where(b > 0, b / self.stream_bw + self.access_s(layout), 0.0)

    def kv_read_s(self, kv_tokens: np.ndarray, layout: KvLayout) -> np.ndarray:
        """Per request: seconds to read its KV once, every layer, K and V of every KV head."""
        tokens = np.asarray(kv_tokens, dtype=np.float64)
        per_run_token = self.model.kv_run_bytes_per_token
        if layout.block_tokens is None:
            cost = self.run_s(tokens * per_run_token, layout)
        else:
            block = layout.block_tokens
            full, rest = np.floor_divide(tokens, block), np.mod(tokens, block)
            cost = full * self.run_s(block * per_run_token, layout) + self.run_s(rest * per_run_token, layout)
        return cost * self.runs_per_block()

    # ------------------------------------------------------------------------------ steps

    def gemm_s(self, batch: int) -> float:
        """The GEMMs of a decode step over `batch` requests (0 for an empty batch)."""
        return self.gemms.seconds(float(batch), float(batch)) if batch > 0 else 0.0

    def decode_step(self, kv_tokens: np.ndarray, layout: KvLayout) -> DecodeStep:
        """One decode iteration for a batch whose requests hold `kv_tokens` each."""
        tokens = np.asarray(kv_tokens)
        n = int(tokens.size)
        kv_s = float(self.kv_read_s(tokens, layout).sum())
        fixed_s = self.decode_fixed_s + self.decode_per_seq_s * n
        comm_s = self.comm_fixed_s + self.comm_per_token_s * n
        return DecodeStep(self.gemm_s(n), kv_s, fixed_s, comm_s)

    def step_coefficients(self, layout: KvLayout, max_batch: int = 256) -> StepCoefficients:
        """This model's decode step in integer picoseconds (each coefficient rounded once), for
        batches of up to `max_batch` requests; made once per layout and batch cap (a capacity
        search replays many small parts of a trace with the same model)."""
        key = (layout, max_batch)
        if key not in self._step_cache:
            self._step_cache[key] = self._step_coefficients(layout, max_batch)
        return self._step_cache[key]

    def _step_coefficients(self, layout: KvLayout, max_batch: int) -> StepCoefficients:
        return StepCoefficients(
            gemm_ps=tuple(to_ps(self.gemm_s(n)) for n in range(max_batch + 1)),
            fixed_ps=to_ps(self.decode_fixed_s + self.comm_fixed_s),
            per_seq_ps=to_ps(self.decode_per_seq_s + self.comm_per_token_s),
            per_token_ps=to_ps(self.model.kv_bytes_per_token_layer * self.model.num_layers / self.stream_bw),
            per_run_ps=to_ps(self.access_s(layout) * self.runs_per_block()),
            block_tokens=layout.block_tokens,
        )

    def decode_step_s(self, kv_tokens: np.ndarray, layout: KvLayout) -> float:
        return self.decode_step(kv_tokens, layout).total_s

    def prefill_s(self, prompt_tokens) -> float:
        """One prefill iteration over the given prompts (batched: the weights are read once)."""
        p = [int(x) for x in prompt_tokens]
        return self.prefill.seconds(sum(p), sum(x * x for x in p), len(p))

    def mixed_step_s(self, kv_tokens, layout: KvLayout, chunks) -> float:
        """One chunked step (vLLM v1): decodes of requests holding `kv_tokens` each, beside prompt
        `chunks` given as (tokens computed before, new tokens) pairs (module docstring, "mixed")."""
        pairs = [(int(x), int(c)) for x, c in chunks]
        total = sum(c for _, c in pairs)
        squares = sum((x + c) * (x + c) - x * x for x, c in pairs)
        tokens = np.asarray(kv_tokens)
        if tokens.size == 0:
            return self.prefill.seconds(total, squares, len(pairs))
        step = self.decode_step(tokens, layout)
        if not pairs:
            return step.total_s
        return step.total_s - step.gemm_s + self.prefill.beside_decodes_s(int(tokens.size), total, squares, len(pairs))

    def migration_s(self, num_bytes: float) -> float:
        """Copy a contiguous KV block into the large pool: read it and write it once each, each
        device its 1/tp shard of the `num_bytes` in parallel."""
        return 2.0 * num_bytes / self.tp / self.seq_bw

    # ------------------------------------------------------------------------------ activations, host link

    def activation_bytes(self, tokens: int, sequences: int) -> int:
        """The activation memory one iteration needs at its peak, over the `tp` devices: `tokens`
        tokens through the layers (a prefill's prompt tokens, or one per decoding request) of which
        `sequences` produce logits.

        Per token, the live tensors at a layer's peak, the MLP: the residual stream and its
        normalized copy (2 x hidden) beside the gate and up projections and their product
        (3 x intermediate, times the experts a token is routed to), 16-bit each; a layer's tensors
        are freed before the next runs, so one layer's worth is live. Per sequence, its logits:
        vocab values at 16 bits out of the head and the sampler's 32-bit copy. For Llama-3-8B at
        vLLM's profiling shape (8,192 tokens, 256 sequences) this is 0.96 GiB, against the 1.26 GiB
        peak PyTorch measured there (vLLM PR #10511's log, the devices' `activation_reserve`
        source): the allocator's caching and the attention kernel's workspace are not modelled."""
        m = self.model
        experts = m.num_experts_per_token if m.num_experts > 1 else 1
        per_token = (2 * m.hidden_size + 3 * m.intermediate_size * experts) * ACTIVATION_BYTES
        per_sequence = m.vocab_size * (ACTIVATION_BYTES + LOGITS_FP32_BYTES)
        return (tokens * per_token + sequences * per_sequence) * self.tp

    def host_link_s(self, num_bytes: float) -> float:
        """Move `num_bytes` of the group's KV or weights between host memory and the devices, each
        device its 1/tp share over its own host link (0 bytes: 0 s)."""
        if num_bytes <= 0:
            return 0.0
        link = self.device.host_link
        if link is None:
            raise ValueError(f"{self.device.name} has no [host_link]")
        return num_bytes / self.tp / link.bandwidth_bytes_per_s

    def kv_pool_bytes(self) -> int:
        """The pool over all `tp` devices: each keeps what its profile leaves beside its shard."""
        return self.device.kv_pool_bytes(self.model, self.tp)
