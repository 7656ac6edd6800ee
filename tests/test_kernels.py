"""The [kernels] tables and the step model built on them (issue 29): GEMM efficiency by batch, the
head on the last prompt token, embedding rows, per-head paged KV runs, and the comparison with
NVIDIA aiconfigurator's measured vLLM databases (skipped without the `aic` extra)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from odmactl.core.errors import ProfileError
from odmactl.hw import aic
from odmactl.hw.cost import CostModel, KvLayout
from odmactl.hw.profiles import load_device, load_model, parse_device
from odmactl.hw.summary import paged_vs_contiguous

GPUS = ("a100-80gb-sxm", "h100-sxm", "h200")
needs_aic = pytest.mark.skipif(not aic.available(), reason="needs the aic extra (pip install 'odmactl[aic]')")


def test_gpu_profiles_carry_kernel_figures():
    for name in GPUS:
        k = load_device(name).kernels
        assert k is not None and k.decode_kv_efficiency is not None
        assert k.gemm_tokens[0] == 1 and list(k.gemm_tokens) == sorted(k.gemm_tokens)
    mlu = load_device("mlu370-x4").kernels
    assert mlu is not None and mlu.decode_kv_efficiency is None  # the LPDDR table as it is
    assert load_device("cloud-ai-100-ultra").kernels is None  # the flat figures


def test_gemm_time_by_hand():
    """Decode at batch 1 on A100: the layers' and the head's weights at peak bandwidth over the
    GEMM efficiency at 1 token; at 8 tokens the efficiency table's entry for 8."""
    device, model = load_device("a100-80gb-sxm"), load_model("Llama-3-8B")
    cost = CostModel(device, model, compute_dtype=device.compute_dtype)
    k = device.kernels
    layer_bytes = (model.total_params - 2 * 128256 * 4096) * 2  # untied: embedding and head left out
    head_bytes = 128256 * 4096 * 2
    assert cost.gemms.layer_bytes == layer_bytes
    expected = (layer_bytes + head_bytes) / device.peak_bandwidth_bytes_per_s / k.gemm_efficiency[0]
    assert cost.gemm_s(1) == pytest.approx(expected, rel=1e-12)
    i8 = k.gemm_tokens.index(8)
    assert cost.gemm_s(8) == pytest.approx((layer_bytes + head_bytes) / device.peak_bandwidth_bytes_per_s
                                           / k.gemm_efficiency[i8], rel=1e-12)
    # between entries the efficiency is linear in tokens
    e = k.gemm_eff(3)
    assert e == pytest.approx(k.gemm_efficiency[1] + (k.gemm_efficiency[2] - k.gemm_efficiency[1]) * 0.5)


def test_prefill_by_hand_head_on_the_last_token_only():
    """One 1,024-token prompt: layers' GEMMs at 1,024 tokens (compute-bound), the head for one
    token, attention's causal flops, fixed and per-token kernel costs, embedding rows."""
    device, model = load_device("a100-80gb-sxm"), load_model("Llama-3-8B")
    cost = CostModel(device, model, compute_dtype=device.compute_dtype)
    k, peak, bw = device.kernels, device.peak_flops(device.compute_dtype), device.peak_bandwidth_bytes_per_s
    p, layers = 1024, model.num_layers
    layer_flops = 2.0 * model.layer_active_params * p
    gemm = max(model.layer_weight_bytes / bw, layer_flops / peak) / k.gemm_eff(p)
    head = max(128256 * 4096 * 2 / bw, 2.0 * 128256 * 4096 / peak) / k.gemm_eff(1)
    attention = 2.0 * layers * 32 * 128 * p * p / (peak * k.prefill_attention_efficiency)
    fixed = layers * (k.prefill_layer_fixed_s + k.elementwise_layer_fixed_s)
    per_token = layers * (k.prefill_per_token_s + k.elementwise_per_token_s) + 4096 * 2 / device.sequential_bandwidth_bytes_per_s
    assert cost.prefill_s([p]) == pytest.approx(gemm + head + attention + fixed + per_token * p, rel=1e-12)
    # two prompts of 512: the same layer GEMMs, the head for two tokens, half the attention (2 x 512^2)
    two = cost.prefill_s([512, 512])
    head2 = max(128256 * 4096 * 2 / bw, 2.0 * 128256 * 4096 * 2 / peak) / k.gemm_eff(2)
    assert two == pytest.approx(gemm + head2 + attention / 2 + fixed + per_token * p, rel=1e-12)


@pytest.mark.parametrize("name", ["DeepSeek-R1-Distill-Qwen-7B", "Llama-2-7B"])
def test_paged_and_contiguous_kv_read_by_hand_on_mlu370(name):
    """One decode step's KV reads on MLU370-X4 at block size 16: every layer's K and V of every KV
    head is its own run, of 16 tokens x 128 dims x 2 B = 4 KiB per block when paged, of the whole
    length when contiguous; a run of b bytes costs b / stream_bw + access_s, the two-parameter form
    of the table, exact at 4 KiB."""
    device, model = load_device("mlu370-x4"), load_model(name)
    cost = CostModel(device, model)
    table = device.bandwidth
    peak = device.peak_bandwidth_bytes_per_s
    stream_bw = peak * table.efficiency[-1]
    run = 16 * model.head_dim * 2
    assert run == 4096
    eff_4k = table.efficiency[table.chunk_bytes.index(4096)]
    access_s = run / (eff_4k * peak) - run / stream_bw
    runs_per_block = 2 * model.num_kv_heads * model.num_layers
    batch, context = 8, 1000  # 62 full blocks and one of 8 tokens
    per_token_run = model.head_dim * 2
    contiguous = batch * runs_per_block * (context * per_token_run / stream_bw + access_s)
    paged = batch * runs_per_block * (context * per_token_run / stream_bw + 63 * access_s)
    kv = np.full(batch, context)
    assert cost.decode_step(kv, KvLayout.contiguous()).kv_s == pytest.approx(contiguous, rel=1e-12)
    assert cost.decode_step(kv, KvLayout.paged(16)).kv_s == pytest.approx(paged, rel=1e-12)
    # the replay's integer coefficients agree
    for layout in (KvLayout.contiguous(), KvLayout.paged(16)):
        coeff = cost.step_coefficients(layout, max_batch=batch)
        assert coeff.step_ps([context] * batch) * 1e-12 == pytest.approx(cost.decode_step_s(kv, layout), rel=1e-6)


def test_mha_pays_more_for_paging_than_gqa():
    """At a full pool, Llama-2-7B (32 KV heads) spends more of its step on KV than the Qwen model
    (4 KV heads), so paging's per-run cost weighs more: its paged/contiguous step ratio is higher
    at every block size, and smaller blocks cost more."""
    device = load_device("mlu370-x4")
    qwen = paged_vs_contiguous(device, load_model("DeepSeek-R1-Distill-Qwen-7B"))
    llama = paged_vs_contiguous(device, load_model("Llama-2-7B"))
    for q, m in zip(qwen["paged"], llama["paged"]):
        assert m["step_ratio"] > q["step_ratio"] > 1.0
    ratios = [r["step_ratio"] for r in qwen["paged"]]
    assert ratios == sorted(ratios, reverse=True)  # 8 > 16 > 32


def test_kv_efficiency_scales_the_table_to_the_measured_rate():
    """With decode_kv_efficiency, a 16-token per-head paged run (4 KiB) reads at exactly that share of peak."""
    device, model = load_device("h100-sxm"), load_model("Llama-3-8B")
    cost = CostModel(device, model)
    run = 4096
    seconds = run / cost.stream_bw + cost.access_s(KvLayout.paged(16))
    assert run / seconds / device.peak_bandwidth_bytes_per_s == pytest.approx(device.kernels.decode_kv_efficiency, rel=1e-9)


def test_kernels_table_errors_name_the_key(tmp_path):
    import tomllib
    base = tomllib.loads(load_device("h100-sxm").path.read_text())
    cases = [
        (lambda d: d["kernels"]["gemm"].__setitem__(1, {"tokens": 1, "efficiency": 0.5}), "kernels.gemm[1].tokens"),
        (lambda d: d["kernels"]["gemm"][0].__setitem__("efficiency", 1.5), "kernels.gemm[0].efficiency"),
        (lambda d: d["kernels"]["decode_attention"].__setitem__("layer_fixed", "2 ms"), "kernels.decode_attention.layer_fixed"),
        (lambda d: d["kernels"]["elementwise"].__setitem__("per_token", "0.1 GB"), "kernels.elementwise.per_token"),
        (lambda d: d["kernels"].__setitem__("bogus", 1), "kernels.bogus"),
        (lambda d: d["kernels"].pop("prefill_attention"), "kernels.prefill_attention"),
        (lambda d: d["kernels"]["decode_attention"].__setitem__("kv_efficiency", 5e-324),
         "kernels.decode_attention.kv_efficiency"),
        (lambda d: d["kernels"]["gemm"][2].__setitem__("efficiency", 0.001), "kernels.gemm[2].efficiency"),
        (lambda d: d["kernels"].__setitem__("gemm", []), "kernels.gemm"),
    ]
    for mutate, key in cases:
        data = json.loads(json.dumps(base))
        mutate(data)
        with pytest.raises(ProfileError) as info:
            parse_device(data, tmp_path / "bad.toml")
        assert info.value.key == key, (key, info.value)


def test_profiles_show_prints_the_block_size_table(cli):
    result = cli("profiles", "show", "mlu370-x4", "--model", "Llama-2-7B", "--json")
    assert result.code == 0
    doc = json.loads(result.out)["paged_vs_contiguous"]
    assert [r["block_tokens"] for r in doc["paged"]] == [8, 16, 32]
    assert doc["batch"] == 256
    result = cli("profiles", "show", "mlu370-x4", "--model", "Llama-2-7B")
    assert result.code == 0 and "paged /" in result.out
    result = cli("profiles", "show", "Llama-2-7B", "--model", "Llama-2-7B")
    assert result.code == 1 and "--model goes with a device" in result.err


def test_kernels_command_without_the_extra(cli, monkeypatch):
    monkeypatch.setattr(aic, "available", lambda: False)
    result = cli("profiles", "kernels", "a100-80gb-sxm")
    assert result.code == 1 and "odmactl[aic]" in result.err
    result = cli("profiles", "kernels", "mlu370-x4")
    assert result.code == 1


@needs_aic
@pytest.mark.parametrize("name", GPUS)
def test_shipped_kernels_are_the_derivation(name):
    """The shipped [kernels] tables are what `odmactl profiles kernels` derives from the database."""
    device = load_device(name)
    derived = aic.derive(device, load_model(aic.MODEL), aic.Estimator(aic.system_of(device))).kernels
    for field in dataclasses.fields(derived):
        got, want = getattr(device.kernels, field.name), getattr(derived, field.name)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-15), field.name


@needs_aic
@pytest.mark.parametrize("name", GPUS)
def test_step_times_within_ten_percent_of_aiconfigurator(name):
    """Acceptance: Llama-3-8B, tp 1, decode at B = 1, 8, 32, 128 with 1k context and prefill at 1k
    and 4k tokens within 10% of aiconfigurator's vLLM database (its estimator's totals)."""
    device = load_device(name)
    cost = CostModel(device, load_model(aic.MODEL), compute_dtype=device.compute_dtype)
    rows = aic.compare(cost, aic.Estimator(aic.system_of(device)))
    assert len(rows) == 6
    for row in rows:
        assert 0.9 <= row.ratio <= 1.1, (name, row)


def test_the_kernels_source_is_valid_toml_whatever_the_path():
    import tomllib

    text = aic._quote("by `odmactl profiles kernels dev/a\nb \"c\" \\ d.toml`")
    assert tomllib.loads(f"source = {text}")["source"] == "by `odmactl profiles kernels dev/a\nb \"c\" \\ d.toml`"


def test_no_run_streams_faster_than_peak():
    """On H100 and H200 the scaled table would read a contiguous run above peak; it is held there,
    and the 4 KiB anchor run still reads at the measured paged rate."""
    for name in GPUS:
        device = load_device(name)
        cost = CostModel(device, load_model("Llama-3-8B"))
        assert cost.stream_bw <= device.peak_bandwidth_bytes_per_s
        run = 4096
        seconds = run / cost.stream_bw + cost.access_s(KvLayout.paged(16))
        assert run / seconds / device.peak_bandwidth_bytes_per_s == pytest.approx(device.kernels.decode_kv_efficiency)


@needs_aic
def test_a_profile_whose_peaks_no_kernel_reaches_is_refused(tmp_path):
    import tomllib
    data = tomllib.loads(load_device("h100-sxm").path.read_text())
    data["memory"]["peak_bandwidth"]["value"] = "3350000000 TB/s"
    data["compute"]["peak_fp16"]["value"] = data["compute"]["peak_bf16"]["value"] = "989000000000 TFLOPS"
    device = parse_device(data, tmp_path / "huge.toml")
    with pytest.raises(ProfileError, match="no real peaks give"):
        aic.derive(device, load_model(aic.MODEL), aic.Estimator("h100_sxm"))
