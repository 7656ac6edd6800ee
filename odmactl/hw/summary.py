"""Profiles as documents: a device's figures with the KV pool it leaves each model, a model's shape
with its KV bytes per token at every precision (`profiles list` / `profiles show`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from odmactl.hw.cost import PAGED_BLOCK_TOKENS, CostModel, KvLayout
from odmactl.hw.profiles import KV_DTYPE_BITS, DeviceProfile, ModelProfile

FULL_POOL_BATCH = 256  # requests sharing a full pool in `paged_vs_contiguous`: vLLM's default max_num_seqs


def device_summary(device: DeviceProfile, models: list[ModelProfile]) -> dict:
    """A device profile's figures and derived quantities (KV pool per model at its KV dtype)."""
    bw = device.bandwidth
    pools = []
    for m in models:
        pool = device.kv_pool_bytes(m)
        pools.append({"model": m.name, "kv_dtype": m.kv_dtype, "weight_bytes": m.weight_bytes, "kv_pool_bytes": pool,
                      "kv_pool_tokens": pool // m.kv_bytes_per_token})
    return {
        "name": device.name, "description": device.description, "file": str(device.path), "measured": device.measured,
        "memory_type": device.memory_type, "capacity_bytes": device.capacity_bytes,
        "peak_bandwidth_bytes_per_s": device.peak_bandwidth_bytes_per_s,
        "sequential_efficiency": bw.sequential_efficiency,
        "sequential_bandwidth_bytes_per_s": device.sequential_bandwidth_bytes_per_s,
        "peak_fp16_flops": device.peak_fp16_flops, "peak_bf16_flops": device.peak_bf16_flops,
        "ridge_flops_per_byte": device.peak_fp16_flops / device.peak_bandwidth_bytes_per_s,
        "memory_fraction": device.memory_fraction, "activation_reserve_bytes": device.activation_reserve_bytes,
        "usable_bytes": device.usable_bytes, "step_overhead_s": device.step_overhead_s,
        "bandwidth_table": [{"chunk_bytes": c, "efficiency": e} for c, e in zip(bw.chunk_bytes, bw.efficiency)],
        "kv_pool": pools, "sources": dict(device.sources), "engine": device.engine,
        "kernels": dataclasses.asdict(device.kernels) if device.kernels is not None else None,
        "measurement": dict(device.measurement) if device.measurement else None,
        "calibration": device.calibration,
        "interconnect": None if device.interconnect is None else {
            "kind": device.interconnect.kind, "bandwidth_bytes_per_s": device.interconnect.bandwidth_bytes_per_s,
            "step_latency_s": device.interconnect.step_latency_s, "base_latency_s": device.interconnect.base_latency_s},
        "host_link": None if device.host_link is None else {
            "kind": device.host_link.kind, "bandwidth_bytes_per_s": device.host_link.bandwidth_bytes_per_s},
    }


def model_summary(model: ModelProfile) -> dict:
    return {
        "name": model.name, "path": str(model.path), "model_type": model.model_type, "num_layers": model.num_layers,
        "hidden_size": model.hidden_size, "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "intermediate_size": model.intermediate_size,
        "vocab_size": model.vocab_size, "num_experts": model.num_experts,
        "num_experts_per_token": model.num_experts_per_token, "total_params": model.total_params,
        "active_params": model.active_params, "weight_dtype": model.weight_dtype, "weight_bytes": model.weight_bytes,
        "max_position_embeddings": model.max_position_embeddings,
        "kv_bytes_per_token": {d: model.with_kv_dtype(d).kv_bytes_per_token for d in KV_DTYPE_BITS},
    }


def paged_vs_contiguous(device: DeviceProfile, model: ModelProfile) -> dict:
    """One decode step at a full KV pool (tp 1): FULL_POOL_BATCH requests (fewer when the pool holds
    fewer tokens) sharing the pool's tokens equally, read paged at each of PAGED_BLOCK_TOKENS
    against contiguous; the ratios of the KV reads and of the whole step."""
    cost = CostModel(device, model, compute_dtype=device.compute_dtype)
    pool_tokens = cost.kv_pool_bytes() // model.kv_bytes_per_token
    batch = int(min(FULL_POOL_BATCH, pool_tokens))
    context = int(pool_tokens // batch) if batch else 0
    kv = np.full(batch, context)
    contiguous = cost.decode_step(kv, KvLayout.contiguous())
    rows = []
    for block in PAGED_BLOCK_TOKENS:
        paged = cost.decode_step(kv, KvLayout.paged(block))
        rows.append({"block_tokens": block, "run_bytes": block * model.kv_run_bytes_per_token,
                     "paged_step_s": paged.total_s, "kv_ratio": paged.kv_s / contiguous.kv_s if contiguous.kv_s else None,
                     "step_ratio": paged.total_s / contiguous.total_s if contiguous.total_s else None})
    return {"model": model.name, "kv_dtype": model.kv_dtype, "kv_pool_tokens": int(pool_tokens), "batch": batch,
            "context_tokens": context, "contiguous_step_s": contiguous.total_s,
            "contiguous_kv_s": contiguous.kv_s, "paged": rows}
