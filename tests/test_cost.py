"""The cost model against hand calculations from the shipped profiles' figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from odmactl.cost import CostModel, KvLayout
from odmactl.profiles import load_device, load_model

# DeepSeek-R1-Distill-Qwen-7B (28 layers, 4 KV heads x 128, bf16 weights) on MLU370-X4 (307.2 GB/s,
# 96 TFLOPS, sequential 0.88), the ODMA papers' deployment. Figures as written in the profile files.
PEAK_BW = 307.2e9
SEQ_EFF = 0.88
FLOPS = 96e12
PARAMS = 7_615_616_512
WEIGHT_BYTES = 2 * PARAMS
LAYERS = 28
PER_TOKEN_LAYER = 2 * 4 * 128 * 2  # K and V, 4 heads, 128 dims, fp16: 2,048 bytes
TABLE = {16 << 10: 0.8289, 64 << 10: 0.8667, 1 << 20: 0.8792, 2 << 20: 0.8796}


@pytest.fixture(scope="module")
def cost():
    return CostModel(load_device("mlu370-x4"), load_model("DeepSeek-R1-Distill-Qwen-7B"))


def test_decode_hand_calculation_contiguous_vs_paged(cost):
    batch, context = 32, 1000
    kv = np.full(batch, context)
    weights_s = WEIGHT_BYTES / (SEQ_EFF * PEAK_BW)
    compute_s = 2 * PARAMS * batch / FLOPS

    # contiguous: one run per layer of 1,000 x 2,048 = 2,048,000 bytes, between the 1 MiB and 2 MiB rows
    run = context * PER_TOKEN_LAYER
    frac = math.log2(run) - 20
    eff_run = TABLE[1 << 20] + (TABLE[2 << 20] - TABLE[1 << 20]) * frac
    kv_contig_s = batch * LAYERS * run / eff_run / PEAK_BW

    # paged, 16-token blocks: 62 full blocks of 32 KiB (halfway in log2 between the 16 and 64 KiB rows)
    # and one block holding 8 tokens = 16 KiB
    eff_32k = (TABLE[16 << 10] + TABLE[64 << 10]) / 2
    per_layer = 62 * 32768 / eff_32k + 8 * PER_TOKEN_LAYER / TABLE[16 << 10]
    kv_paged_s = batch * LAYERS * per_layer / PEAK_BW

    contiguous = cost.decode_step(kv, KvLayout.contiguous())
    paged = cost.decode_step(kv, KvLayout.paged(16))
    assert contiguous.weights_s == pytest.approx(weights_s, rel=1e-12)
    assert contiguous.compute_s == pytest.approx(compute_s, rel=1e-12)
    assert contiguous.kv_s == pytest.approx(kv_contig_s, rel=1e-9)
    assert paged.kv_s == pytest.approx(kv_paged_s, rel=1e-9)
    assert contiguous.bound == paged.bound == "memory"
    assert contiguous.total_s == pytest.approx(weights_s + kv_contig_s, rel=1e-9)
    assert paged.total_s == pytest.approx(weights_s + kv_paged_s, rel=1e-9)
    # the figures the issue asks about: about 63 ms a step either way; paging reads the KV 3.6% slower
    assert contiguous.total_s == pytest.approx(0.0632, abs=5e-4)
    assert paged.kv_s / contiguous.kv_s == pytest.approx(0.8796 / 0.8478, rel=2e-3)


def test_prefill_and_migration_hand_calculation(cost):
    prompts = np.array([512, 1500])
    flops = 2 * PARAMS * prompts.sum() + 2 * LAYERS * 28 * 128 * float((prompts**2).sum())
    memory_s = (WEIGHT_BYTES + prompts.sum() * LAYERS * PER_TOKEN_LAYER) / (SEQ_EFF * PEAK_BW)
    assert cost.prefill_s(prompts) == pytest.approx(max(flops / FLOPS, memory_s), rel=1e-12)
    assert flops / FLOPS > memory_s  # 2,012 prompt tokens are compute-bound on this device
    block = 1200 * LAYERS * PER_TOKEN_LAYER
    assert cost.migration_s(block) == pytest.approx(2 * block / (SEQ_EFF * PEAK_BW), rel=1e-12)


def test_small_batches_are_memory_bound_and_big_ones_hit_compute():
    cost = CostModel(load_device("h100-sxm"), load_model("Llama-3-8B"))
    small = cost.decode_step(np.full(1, 100), KvLayout.contiguous())
    assert small.bound == "memory"
    huge = cost.decode_step(np.full(4096, 16), KvLayout.contiguous())
    assert huge.bound == "compute" and huge.total_s == pytest.approx(2 * cost.model.active_params * 4096 / 989e12)


def test_paging_costs_more_on_lpddr_than_on_hbm_and_shrinks_with_block_size():
    model = load_model("Llama-3-8B")
    kv = np.full(16, 2000)
    ratios = {}
    for device in ("mlu370-x4", "a100-80gb-sxm"):
        cost = CostModel(load_device(device), model)
        base = cost.kv_read_bytes(kv, KvLayout.contiguous()).sum()
        ratios[device] = [cost.kv_read_bytes(kv, KvLayout.paged(b)).sum() / base for b in (1, 4, 16, 64)]
        assert ratios[device] == sorted(ratios[device], reverse=True)  # bigger blocks, longer runs, cheaper
        assert all(r > 1 for r in ratios[device])
    assert all(lp >= hb for lp, hb in zip(ratios["mlu370-x4"], ratios["a100-80gb-sxm"]))


def test_empty_requests_and_kv_precision():
    device = load_device("mlu370-x4")
    fp16 = CostModel(device, load_model("Mistral-7B"))
    int4 = CostModel(device, load_model("Mistral-7B", kv_dtype="int4"))
    kv = np.array([0, 300, 4000])
    assert fp16.kv_read_bytes(kv, KvLayout.contiguous())[0] == 0
    assert int4.decode_step(kv, KvLayout.contiguous()).kv_s < fp16.decode_step(kv, KvLayout.contiguous()).kv_s
    assert int4.kv_pool_bytes() == fp16.kv_pool_bytes()  # precision changes tokens per byte, not the pool
