"""The cost model against hand calculations from the shipped profiles' figures."""

from __future__ import annotations

import numpy as np
import pytest

from odmactl.hw.cost import CostModel, KvLayout, to_ps
from odmactl.hw.profiles import load_device, load_model
from odmactl.sim.prefill import PrefillClock, _round_half_even

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
    k = cost.device.kernels  # MLU370's [kernels]: the A100's figures, assumed (profiles/README.md)
    vocab, hidden = 152064, 3584
    head_bytes = 2 * vocab * hidden
    layer_bytes = WEIGHT_BYTES - 2 * head_bytes  # untied: the embedding table and the head are not the layers'
    gemm_s = (layer_bytes + head_bytes) / PEAK_BW / k.gemm_eff(batch)  # memory-bound at 32 tokens
    assert 2 * PARAMS * batch / FLOPS < layer_bytes / PEAK_BW
    fixed_s = LAYERS * (k.decode_layer_fixed_s + k.elementwise_layer_fixed_s)
    per_seq_s = LAYERS * (k.decode_per_request_s + k.elementwise_per_token_s) + hidden * 2 / (SEQ_EFF * PEAK_BW)

    # every layer's K and V of every KV head is a run: 2 x 4 x 28 runs a request (a block when paged);
    # a run costs run / stream + access, streaming at the 2 MiB row's rate, and the access cost
    # makes a 16-token per-head block (16 x 128 x 2 B = 4 KiB, a row of the table) exact
    stream_bw = TABLE[2 << 20] * PEAK_BW
    run = 16 * 128 * 2
    access_s = run / (0.7044 * PEAK_BW) - run / stream_bw
    runs = 2 * 4 * LAYERS
    kv_contig_s = batch * runs * (context * 256 / stream_bw + access_s)
    # paged, 16-token blocks: 62 full blocks and one holding 8 tokens
    kv_paged_s = batch * runs * (context * 256 / stream_bw + 63 * access_s)

    contiguous = cost.decode_step(kv, KvLayout.contiguous())
    paged = cost.decode_step(kv, KvLayout.paged(16))
    assert contiguous.gemm_s == pytest.approx(gemm_s, rel=1e-12)
    assert contiguous.fixed_s == pytest.approx(fixed_s + batch * per_seq_s, rel=1e-12)
    assert contiguous.kv_s == pytest.approx(kv_contig_s, rel=1e-9)
    assert paged.kv_s == pytest.approx(kv_paged_s, rel=1e-9)
    assert contiguous.total_s == pytest.approx(gemm_s + fixed_s + batch * per_seq_s + kv_contig_s, rel=1e-9)
    assert paged.total_s == pytest.approx(gemm_s + fixed_s + batch * per_seq_s + kv_paged_s, rel=1e-9)
    # about 88 ms a step either way; paging reads the KV about 25% slower (63 runs of 4 KiB a
    # head where contiguous reads one of 250 KiB), the step 2.9% slower
    assert contiguous.total_s == pytest.approx(0.0794, abs=5e-4)
    assert paged.kv_s / contiguous.kv_s == pytest.approx(1.246, abs=1e-3)


def test_integer_coefficients_agree_with_the_float_model(cost):
    for layout in (KvLayout.contiguous(), KvLayout.paged(16)):
        coeff = cost.step_coefficients(layout)
        kv = [0, 1, 15, 16, 17, 1000, 4097]
        assert coeff.step_ps(kv) * 1e-12 == pytest.approx(cost.decode_step_s(np.array(kv), layout), rel=1e-6)


def test_prefill_and_migration_hand_calculation(cost):
    prompts = np.array([512, 1500])
    k = cost.device.kernels
    vocab, hidden = 152064, 3584
    layer_params = PARAMS - 2 * vocab * hidden
    total = int(prompts.sum())
    layers_s = max(2 * layer_params / PEAK_BW, 2 * cost.model.layer_active_params * total / FLOPS) / k.gemm_eff(total)
    head_s = max(2 * vocab * hidden / PEAK_BW, 2 * vocab * hidden * 2 / FLOPS) / k.gemm_eff(2)  # the last token of each
    attention_s = 2 * LAYERS * 28 * 128 * float((prompts**2).sum()) / (FLOPS * k.prefill_attention_efficiency)
    fixed_s = LAYERS * (k.prefill_layer_fixed_s + k.elementwise_layer_fixed_s)
    per_token_s = LAYERS * (k.prefill_per_token_s + k.elementwise_per_token_s) + hidden * 2 / (SEQ_EFF * PEAK_BW)
    assert cost.prefill_s(prompts) == pytest.approx(layers_s + head_s + attention_s + fixed_s + per_token_s * total,
                                                     rel=1e-12)
    assert 2 * cost.model.layer_active_params * total / FLOPS > 2 * layer_params / PEAK_BW  # compute-bound GEMMs
    block = 1200 * LAYERS * PER_TOKEN_LAYER
    assert cost.migration_s(block) == pytest.approx(2 * block / (SEQ_EFF * PEAK_BW), rel=1e-12)


def test_small_batches_read_weights_and_big_ones_hit_compute():
    cost = CostModel(load_device("h100-sxm"), load_model("Llama-3-8B"))
    gemms, k = cost.gemms, cost.device.kernels
    assert cost.gemm_s(1) == pytest.approx((gemms.layer_bytes + gemms.head_bytes) / 3350e9 / k.gemm_eff(1), rel=1e-12)
    huge = cost.gemm_s(4096)
    flops = (gemms.layer_flops_per_token + gemms.head_flops_per_token) * 4096
    assert huge == pytest.approx(flops / 989e12 / k.gemm_eff(4096), rel=1e-12)


def test_paging_costs_more_on_lpddr_than_on_hbm_and_shrinks_with_block_size():
    model = load_model("Llama-3-8B")
    kv = np.full(16, 2000)
    ratios = {}
    for device in ("mlu370-x4", "a100-80gb-sxm"):
        cost = CostModel(load_device(device), model)
        base = cost.kv_read_s(kv, KvLayout.contiguous()).sum()
        ratios[device] = [cost.kv_read_s(kv, KvLayout.paged(b)).sum() / base for b in (1, 4, 16, 64)]
        assert ratios[device] == sorted(ratios[device], reverse=True)  # bigger blocks, longer runs, cheaper
        assert all(r > 1 for r in ratios[device])
    assert all(lp >= hb for lp, hb in zip(ratios["mlu370-x4"], ratios["a100-80gb-sxm"]))


def test_empty_requests_and_kv_precision():
    device = load_device("mlu370-x4")
    fp16 = CostModel(device, load_model("Mistral-7B"))
    int4 = CostModel(device, load_model("Mistral-7B", kv_dtype="int4"))
    kv = np.array([0, 300, 4000])
    assert fp16.kv_read_s(kv, KvLayout.contiguous())[0] == 0
    assert int4.decode_step(kv, KvLayout.contiguous()).kv_s < fp16.decode_step(kv, KvLayout.contiguous()).kv_s
    assert int4.kv_pool_bytes() == fp16.kv_pool_bytes()  # precision changes tokens per byte, not the pool


def test_replay_prefill_clock_equals_to_ps_of_prefill_s(cost):
    """The replay's prefill clock (compiled: C doubles) gives to_ps(prefill_s(prompts)) exactly,
    compute-bound and memory-bound batches alike."""
    rng = np.random.default_rng(3)
    clock = PrefillClock(cost.prefill)
    for _ in range(2000):
        prompts = rng.integers(1, 32_768, size=int(rng.integers(1, 64))) // int(rng.choice([1, 64, 4096]))
        prompts = np.maximum(prompts, 1)
        total, squares = int(prompts.sum()), int((prompts.astype(object) ** 2).sum())
        assert clock.ps(total, squares, prompts.size) == to_ps(cost.prefill_s(prompts))
    assert clock.ps(1, 1, 1) == to_ps(cost.prefill_s([1]))


def test_round_half_even_matches_python_round_at_ties_and_near_them():
    values = [0.0, 0.5, 1.5, 2.5, 3.5, 2.4999999999999996, 2.5000000000000004, 1e12 + 0.5, 2.0**52 + 1.0,
              2.0**53, 123456789.5, 123456790.5, 9.2e18]
    values += list(np.random.default_rng(5).uniform(0, 1e15, 1000))
    for v in values:
        assert _round_half_even(float(v)) == round(float(v)), v
    with pytest.raises(OverflowError):
        _round_half_even(2.0**63)
    with pytest.raises(OverflowError):
        _round_half_even(float("nan"))


def test_tensor_parallel_step_hand_calculation():
    """Issue 27, acceptance 3: DeepSeek-R1-Distill-Qwen-7B over four MLU370-X4 cards on PCIe 4.0.
    Each card holds a quarter of the heads, the MLP and the vocabulary, one of the 4 KV heads, and
    each layer adds two ring all-reduces of the batch's activations."""
    tp, hidden, inter, vocab = 4, 3584, 18944, 152064
    q_out, kv_out = 28 // tp * 128, 1 * 128  # 7 query heads and 1 KV head a card
    attention = hidden * q_out + 2 * hidden * kv_out + q_out * hidden + (q_out + 2 * kv_out)  # Qwen2's q/k/v biases
    per_layer = attention + 3 * hidden * (inter // tp) + 2 * hidden
    shard_params = LAYERS * per_layer + 2 * (vocab // tp) * hidden + hidden  # untied embedding and head
    device, model = load_device("mlu370-x4"), load_model("DeepSeek-R1-Distill-Qwen-7B")
    shard = model.shard(tp)
    assert shard.total_params == shard_params
    assert shard.kv_bytes_per_token == LAYERS * 2 * 1 * 128 * 2  # 14,336 bytes a card, 57,344 for the group
    cost = CostModel(device, shard, tp=tp)

    batch, context = 32, 1000
    link_bw, step_lat, base_lat = 31.5e9, 1.0e-6, 6.6e-6  # the profile's [interconnect]
    message = batch * hidden * 2  # bytes a layer all-reduces, twice
    allreduce = base_lat + 2 * (tp - 1) * step_lat + 2 * (tp - 1) / tp * message / link_bw
    comm_s = 2 * LAYERS * allreduce
    step = cost.decode_step(np.full(batch, context), KvLayout.contiguous())
    head = 2 * (vocab // tp) * hidden
    assert step.gemm_s == pytest.approx((2 * shard_params - head) / PEAK_BW / device.kernels.gemm_eff(batch), rel=1e-12)
    assert step.comm_s == pytest.approx(comm_s, rel=1e-12)
    assert comm_s == pytest.approx(1.317e-3, abs=1e-6)  # 56 all-reduces of 229 KB over PCIe: 1.3 ms a step
    # the replay's integer coefficients carry the same all-reduce terms
    coeff = cost.step_coefficients(KvLayout.contiguous())
    assert coeff.step_ps([context] * batch) * 1e-12 == pytest.approx(step.total_s, rel=1e-6)
    # prefill all-reduces every prompt token's activations; a migration copies a shard a card
    prompts = np.array([512, 1500])
    no_comm = CostModel(device, shard, tp=1)
    prefill_comm = 2 * LAYERS * (base_lat + 2 * (tp - 1) * step_lat + 2 * (tp - 1) / tp * prompts.sum() * hidden * 2 / link_bw)
    assert cost.prefill_s(prompts) - no_comm.prefill_s(prompts) == pytest.approx(prefill_comm, rel=1e-9)
    assert cost.migration_s(4096) == pytest.approx(2 * 1024 / (SEQ_EFF * PEAK_BW), rel=1e-12)
    # the group's pool: what each card leaves beside its shard, four times
    per_card = int(24e9 * 0.9 - 2 * shard_params - 3.05 * 2**30)
    assert cost.kv_pool_bytes() == 4 * per_card


def test_tensor_parallelism_that_does_not_divide_the_model_is_an_error():
    from odmactl.core.errors import OdmaError, ProfileError

    model = load_model("DeepSeek-R1-Distill-Qwen-7B")
    with pytest.raises(ProfileError, match="does not divide its 28 attention heads"):
        model.shard(8)
    assert model.shard(2).num_kv_heads == 2 and model.shard(4).num_kv_heads == 1
    with pytest.raises(OdmaError, match="no \\[interconnect\\]"):
        load_device("cloud-ai-100-ultra").interconnect_for(2)
