"""Device and model profiles: derived figures against DESIGN.md, sources, and clear errors."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from odmactl.core.errors import ProfileError
from odmactl.core.units import parse_quantity
from odmactl.hw.profiles import Kernels, device_paths, load_device, load_model, model_dirs, read_device, read_model

# DESIGN.md "Device and model facts": layers, heads, kv heads, head dim, params (B), active (B), KV bytes/token fp16
DESIGN_MODELS = {
    "DeepSeek-R1-Distill-Qwen-7B": (28, 28, 4, 128, 7.62, 7.62, 57_344),
    "Llama-2-7B": (32, 32, 32, 128, 6.74, 6.74, 524_288),
    "Llama-3-8B": (32, 32, 8, 128, 8.03, 8.03, 131_072),
    "Mistral-7B": (32, 32, 8, 128, 7.24, 7.24, 131_072),
    "Mixtral-8x7B": (32, 32, 8, 128, 46.7, 12.9, 131_072),
    # not in DESIGN.md's table: Meta's model card gives 13B; 2 * 40 layers * 40 heads * 128 * 2 B per token
    "Llama-2-13B": (40, 40, 40, 128, 13.0, 13.0, 819_200),
}
# DESIGN.md device table: capacity (bytes), peak bandwidth (B/s), fp16 dense (FLOP/s)
DESIGN_DEVICES = {
    "MLU370-X4": (24e9, 307.2e9, 96e12), "MLU370-X8": (48e9, 614.4e9, 96e12),
    "A100-80GB-SXM": (80e9, 2039e9, 312e12), "H100-SXM": (80e9, 3350e9, 989e12),
    "H200": (141e9, 4.8e12, 989e12), "Cloud-AI-100-Ultra": (128e9, 548e9, 290e12),
}


@pytest.mark.parametrize("name", sorted(DESIGN_MODELS))
def test_model_figures_match_design_table(name):
    layers, heads, kv_heads, head_dim, params_b, active_b, kv_fp16 = DESIGN_MODELS[name]
    m = load_model(name)
    assert (m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (layers, heads, kv_heads, head_dim)
    assert m.kv_bytes_per_token == kv_fp16
    assert m.total_params == pytest.approx(params_b * 1e9, rel=0.01)
    assert m.active_params == pytest.approx(active_b * 1e9, rel=0.01)
    assert m.weight_bytes == 2 * m.total_params


def test_kv_bytes_per_token_for_every_precision():
    m = load_model("llama-3-8b")  # names are case-insensitive
    values = 2 * 32 * 8 * 128  # K and V, all layers
    assert m.with_kv_dtype("bf16").kv_bytes_per_token == values * 2
    assert m.with_kv_dtype("fp8").kv_bytes_per_token == values
    assert m.with_kv_dtype("int8").kv_bytes_per_token == values
    assert m.with_kv_dtype("int4").kv_bytes_per_token == values // 2
    # Oaken: 4.8 bits per value plus 3 groups x (min, max) x 16 bits per K or V vector of 8 * 128 values
    assert m.with_kv_dtype("oaken").kv_bytes_per_token == math.ceil(32 * 2 * (1024 * 4.8 + 96) / 8)
    with pytest.raises(ProfileError, match="unknown KV dtype"):
        m.with_kv_dtype("fp4")


@pytest.mark.parametrize("name, vector, published", [("Llama-2-7B", 4096, 4.82), ("Llama-2-13B", 5120, 4.82)])
def test_oaken_effective_bits_reproduce_the_paper(name, vector, published):
    """Oaken (seeds/002) Table 2 reports 4.82 effective bits for Llama2-7B and 13B."""
    m = load_model(name, kv_dtype="oaken")
    bits = m.kv_bytes_per_token_layer * 8 / m.kv_values_per_token_layer
    assert round(bits, 2) == published
    assert m.kv_values_per_token_layer == 2 * vector


def test_every_shipped_device_loads_with_a_source_for_every_figure():
    names = {read_device(p).name for p in device_paths() if p.parent.name == "devices"}
    assert set(DESIGN_DEVICES) <= names
    for path in device_paths():
        d = read_device(path)
        for key in ("memory.type", "memory.capacity", "memory.peak_bandwidth", "compute.peak_fp16",
                    "budget.memory_fraction", "budget.activation_reserve", "bandwidth.scattered", "bandwidth.sequential"):
            assert len(d.sources[key]) > 20, (path.name, key)
        if d.measured:
            assert {"date", "device", "torch", "command"} <= set(d.measurement)
            assert all("measured" in d.sources[k] for k in ("memory.peak_bandwidth", "compute.peak_fp16"))


@pytest.mark.parametrize("name", sorted(DESIGN_DEVICES))
def test_device_figures_match_design_table(name):
    capacity, bandwidth, fp16 = DESIGN_DEVICES[name]
    d = load_device(name)
    assert (d.capacity_bytes, d.peak_bandwidth_bytes_per_s, d.peak_fp16_flops) == pytest.approx((capacity, bandwidth, fp16))
    expected_memory = {"MLU": "LPDDR5", "A10": "HBM2e", "H10": "HBM3", "H20": "HBM3e", "Clo": "LPDDR4X"}[name[:3]]
    assert d.memory_type == expected_memory


@pytest.mark.parametrize("name", sorted(DESIGN_DEVICES))
def test_bandwidth_tables_follow_their_stated_derivation(name):
    """Each shipped table says `eff(c) = S * c / (c + A B) [* c / (c + B B)]`; recompute it from that text."""
    d = load_device(name)
    source = d.sources["bandwidth.scattered"]
    match = re.search(r"eff\(c\) = ([0-9.]+) \* c / \(c \+ ([0-9.]+) B\)(?: \* c / \(c \+ ([0-9.]+) B\))?", source)
    assert match, source
    seq, a = float(match.group(1)), float(match.group(2))
    b = float(match.group(3)) if match.group(3) else 0.0
    assert seq == d.bandwidth.sequential_efficiency
    c = np.asarray(d.bandwidth.chunk_bytes, dtype=float)
    np.testing.assert_allclose(d.bandwidth.efficiency, seq * c / (c + a) * c / (c + b), atol=6e-4)
    assert list(d.bandwidth.chunk_bytes) == [64 * 4**i for i in range(8)] + [2 << 20]


def test_lpddr_tables_sit_below_hbm_at_every_run_length():
    hbm = load_device("a100-80gb-sxm").bandwidth
    for name in ("mlu370-x4", "cloud-ai-100-ultra"):
        lpddr = load_device(name).bandwidth
        assert all(x <= y for x, y in zip(lpddr.efficiency, hbm.efficiency))


def test_eff_interpolates_in_log_size_and_scales_below_the_table():
    table = load_device("mlu370-x4").bandwidth
    c, e = table.chunk_bytes, table.efficiency
    assert table.eff(c).tolist() == pytest.approx(list(e))
    mid = math.sqrt(c[3] * c[4])  # halfway in log2 between 4 KiB and 16 KiB
    assert float(table.eff(mid)) == pytest.approx((e[3] + e[4]) / 2)
    assert float(table.eff(32)) == pytest.approx(e[0] / 2)  # a fixed cost per access: half the run, half the rate
    assert float(table.eff(64 << 20)) == pytest.approx(e[-1])


def test_kv_pool_is_capacity_times_fraction_minus_weights_and_reserve():
    d, m = load_device("mlu370-x4"), load_model("DeepSeek-R1-Distill-Qwen-7B")
    expected = 24e9 * 0.9 - 7_615_616_512 * 2 - 3.05 * 2**30
    assert d.kv_pool_bytes(m) == int(expected)
    assert d.kv_pool_bytes(load_model("Mixtral-8x7B")) == 0  # 93 GB of weights do not fit in 24 GB


def test_units_parse_and_reject():
    assert parse_quantity("24 GB", "bytes") == 24e9
    assert parse_quantity("2 GiB", "bytes") == 2 * 2**30
    assert parse_quantity("4.8 TB/s", "bandwidth") == 4.8e12
    assert parse_quantity("96 TFLOPS", "flops") == 96e12
    assert parse_quantity("12 us", "seconds") == pytest.approx(12e-6)
    with pytest.raises(ValueError, match="'GB/s' is a unit of bandwidth"):
        parse_quantity("24 GB/s", "bytes")
    with pytest.raises(ValueError, match="not a unit odmactl knows"):
        parse_quantity("24 gigs", "bytes")
    with pytest.raises(ValueError, match="a string with its unit"):
        parse_quantity(24, "bytes")


# ------------------------------------------------------------------------------- bad device files

def _edit(tmp_path: Path, old: str, new: str, name: str = "mlu370-x4") -> Path:
    text = load_device(name).path.read_text(encoding="utf-8")
    assert old in text, old
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


BAD_DEVICES = [
    ("missing key", 'capacity = { value = "24 GB", source', 'capacity_x = { value = "24 GB", source', "memory.capacity", "missing"),
    ("wrong unit", 'value = "307.2 GB/s"', 'value = "307.2 GB"', "memory.peak_bandwidth.value", "unit of bytes"),
    ("unitless", 'value = "96 TFLOPS", source = "Cambricon MLU370-X4 product page, FP16',
     'value = 96, source = "Cambricon MLU370-X4 product page, FP16', "compute.peak_fp16.value", "string with its unit"),
    ("zero capacity", 'value = "24 GB"', 'value = "0 GB"', "memory.capacity.value", "impossible value"),
    ("fraction above one", "value = 0.9,", "value = 1.5,", "budget.memory_fraction.value", "(0, 1]"),
    ("reserve too large", 'value = "3.05 GiB"', 'value = "30 GiB"', "budget.activation_reserve", "not below the usable"),
    ("efficiency above one", "efficiency = 0.0280", "efficiency = 1.2", "bandwidth.scattered[0].efficiency", "(0, 1]"),
    ("chunks out of order", 'chunk = "256 B"', 'chunk = "32 B"', "bandwidth.scattered[1].chunk", "strictly increasing"),
    ("memory type", 'type = { value = "LPDDR5"', 'type = { value = "SRAM"', "memory.type", "expected one of"),
    ("unknown key", "measured = false", "measured = false\nmeasurd = true", "measurd", "unknown key"),
    ("no source", '{ value = "24 GB", source = "Cambricon MLU370-X4 product page; ODMA (seeds/000 §IV, seeds/001 §4): 24 GB LPDDR5, 307.2 GB/s per card" }',
     '{ value = "24 GB" }', "memory.capacity.source", "missing"),
    ("format", 'format = "odmactl-device/1"', 'format = "odmactl-device/9"', "format", "expected 'odmactl-device/1'"),
    ("measured without record", "measured = false", "measured = true", "measurement", "missing"),
    ("one kernel table of three", 'decode_attention = { layer_fixed = "19.768 us", per_request = "0.0764 us" }\n',
     "", "kernels.decode_attention", "together, or none of them"),
]


@pytest.mark.parametrize("label, old, new, key, message", BAD_DEVICES, ids=[b[0] for b in BAD_DEVICES])
def test_bad_device_file_names_file_and_key(tmp_path, cli, label, old, new, key, message):
    path = _edit(tmp_path, old, new)
    with pytest.raises(ProfileError) as info:
        read_device(path)
    assert info.value.file == str(path) and info.value.key == key, str(info.value)
    assert message in str(info.value)
    result = cli("profiles", "show", path)
    assert result.code == 1
    assert str(path) in result.err and key in result.err and "Traceback" not in result.err


def test_broken_toml_and_unknown_names(tmp_path, cli):
    path = tmp_path / "broken.toml"
    path.write_text('format = "odmactl-device/1"\nname = \n', encoding="utf-8")
    with pytest.raises(ProfileError, match="not valid TOML"):
        read_device(path)
    result = cli("profiles", "show", "no-such-device")
    assert result.code == 1 and "neither a device nor a model" in result.err
    with pytest.raises(ProfileError, match="unknown device 'tpu'"):
        load_device("tpu")
    with pytest.raises(ProfileError, match="unknown model"):
        load_model("gpt-5")


# -------------------------------------------------------------------------------- bad model configs

def _config(tmp_path: Path, edit) -> Path:
    src = next(p for p in model_dirs() if p.name == "Llama-3-8B") / "config.json"
    raw = json.loads(src.read_text(encoding="utf-8"))
    edit(raw)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    return model_dir


BAD_CONFIGS = [
    ("missing layers", lambda r: r.pop("num_hidden_layers"), "num_hidden_layers", "missing"),
    ("string heads", lambda r: r.update(num_attention_heads="32"), "num_attention_heads", "positive integer"),
    ("zero kv heads", lambda r: r.update(num_key_value_heads=0), "num_key_value_heads", "positive integer"),
    ("tied as text", lambda r: r.update(tie_word_embeddings="false"), "tie_word_embeddings", "true or false"),
    ("kv heads do not divide", lambda r: r.update(num_key_value_heads=5), "num_key_value_heads", "not a multiple"),
    ("unsupported architecture", lambda r: r.update(model_type="bert"), "model_type", "not one odmactl can size"),
    ("experts", lambda r: r.update(num_local_experts=2, num_experts_per_tok=4), "num_experts_per_tok", "exceeds"),
]


@pytest.mark.parametrize("label, edit, key, message", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_bad_model_config_names_file_and_key(tmp_path, label, edit, key, message):
    model_dir = _config(tmp_path, edit)
    with pytest.raises(ProfileError) as info:
        read_model(model_dir)
    assert info.value.file == str(model_dir / "config.json") and info.value.key == key
    assert message in str(info.value)


def test_model_from_a_local_hf_directory(tmp_path, cli):
    model_dir = tmp_path / "my-model"
    shutil.copytree(next(p for p in model_dirs() if p.name == "Mistral-7B"), model_dir)
    m = load_model(model_dir)
    assert m.name == "my-model" and m.kv_bytes_per_token == 131_072
    (model_dir / "config.json").write_text("{ not json", encoding="utf-8")
    result = cli("profiles", "show", model_dir)
    assert result.code == 1 and "not valid JSON" in result.err and "config.json" in result.err


def test_profiles_cli_list_and_show_json(cli):
    result = cli("profiles", "list", "--json")
    assert result.code == 0
    listing = json.loads(result.out)
    assert {d["name"] for d in listing["devices"]} >= set(DESIGN_DEVICES)
    assert {m["name"] for m in listing["models"]} >= set(DESIGN_MODELS)
    shown = json.loads(cli("profiles", "show", "MLU370-X4", "--json").out)
    pools = {p["model"]: p for p in shown["kv_pool"]}
    deepseek = pools["DeepSeek-R1-Distill-Qwen-7B"]
    assert deepseek["kv_pool_tokens"] == deepseek["kv_pool_bytes"] // 57_344
    assert shown["sequential_bandwidth_bytes_per_s"] == pytest.approx(307.2e9 * 0.88)
    model = json.loads(cli("profiles", "show", "mixtral-8x7b", "--json").out)
    assert model["kv_bytes_per_token"]["fp16"] == 131_072 and model["num_experts_per_token"] == 2
    text = cli("profiles", "show", "h100-sxm")
    assert text.code == 0 and "Kwon et al." in text.out


def test_an_installed_wheel_carries_the_shipped_profiles(tmp_path):
    """profiles/ sits beside the package in the repository; a wheel must carry it (as the data
    package odmactl._profiles), or every --device and --model name fails after `pip install`."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(root / name, src / name)
    built = ("__pycache__", "*.so", "*.c", "_native_build.py")  # what an in-place build leaves beside the sources
    for name in ("odmactl", "profiles"):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns(*built))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "wheel"), str(src)],
                   check=True, capture_output=True)
    wheel = next((tmp_path / "wheel").glob("odmactl-*.whl"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "ODMACTL_PROFILES"}
    env["PYTHONPATH"] = str(site)
    probe = ("import json; from odmactl.hw.profiles import profiles_dir, device_paths, model_dirs, load_device, load_model;"
             "print(json.dumps([str(profiles_dir()), [p.relative_to(profiles_dir()).as_posix() for p in device_paths()],"
             " [d.name for d in model_dirs()], load_device('mlu370-x4').name,"
             " load_model('DeepSeek-R1-Distill-Qwen-7B').kv_bytes_per_token]));"
             "from odmactl.core import native; print(json.dumps(native.status()))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    first, second = out.stdout.splitlines()
    where, devices, models, device, kv_bytes = json.loads(first)
    assert Path(where) == site / "odmactl" / "_profiles"
    # the wheel lists its packages by name: every module of the checkout must be in it
    modules = sorted(p.relative_to(root).as_posix() for p in (root / "odmactl").rglob("*.py")
                     if p.name != "_native_build.py")
    installed = sorted(p.relative_to(site).as_posix() for p in (site / "odmactl").rglob("*.py"))
    assert modules == [m for m in installed if not m.endswith("/_native_build.py")]
    # and it carries the compiled core, built from these sources (setup.py; a build without a C
    # compiler would install the pure-Python package, which this machine does not need)
    assert set(json.loads(second).values()) == {"compiled"}
    shipped = root / "profiles"
    assert devices == [p.relative_to(shipped).as_posix() for p in device_paths()] and devices
    assert models == [d.name for d in model_dirs()] and models
    assert device == load_device("mlu370-x4").name and kv_bytes == 57_344


def test_a_kernels_table_of_gemm_rows_alone_keeps_the_rest_flat(tmp_path):
    """What `odmactl calibrate` writes: measured GEMM rows, no attention or elementwise figures;
    those are then the flat ones (no fixed costs, the KV table as it is)."""
    text = load_device("mlu370-x4").path.read_text(encoding="utf-8")
    start = text.index("decode_attention = {")
    end = text.index("\n", text.index("elementwise = {")) + 1
    path = tmp_path / "gemm-only.toml"
    path.write_text(text[:start] + text[end:], encoding="utf-8")
    full, gemm_only = load_device("mlu370-x4"), read_device(path)
    flat = Kernels.flat(gemm_only.bandwidth.sequential_efficiency)
    assert gemm_only.kernels.gemm_efficiency == full.kernels.gemm_efficiency
    assert gemm_only.kernels.gemm_tokens == full.kernels.gemm_tokens
    assert gemm_only.kernels.decode_layer_fixed_s == flat.decode_layer_fixed_s == 0.0
    assert gemm_only.kernels.elementwise_per_token_s == 0.0 and gemm_only.kernels.decode_kv_efficiency is None
    assert gemm_only.kernels.prefill_attention_efficiency == flat.prefill_attention_efficiency
