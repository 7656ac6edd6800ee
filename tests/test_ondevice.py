"""On-device replay on the CPU torch device: the bytes each step reads are exactly the running
requests' KV as the layout places it, the replay itself equals the virtual one under --stepping,
--scale keeps the pool's tokens, and bad options are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from odmactl.allocator import make_allocator
from odmactl.device.ondevice import GEMM_ALIGN, StepProbe, StepShape, expand_runs, split_runs, step_time_fit
from odmactl.hw.profiles import load_model
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.workload import Workload

SAMPLES = Path(__file__).resolve().parents[1] / "traces"
PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "devices" / "measured" / "cpu-xeon-2vcpu.toml")
TINY = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 4096, "max_position_embeddings": 8192,
        "torch_dtype": "float16", "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


@pytest.fixture(scope="module")
def small_trace(conv_sample_head):
    return conv_sample_head(24)


def _owned_bytes(alloc, a, model, block_tokens, kv: int) -> set[int]:
    """The bytes of request a's first kv tokens, from the layout's definition, byte by byte."""
    bpt, bpl = model.kv_bytes_per_token, int(model.kv_bytes_per_token_layer)
    out: set[int] = set()
    if block_tokens is None:
        out.update(range(a.offset_bytes, a.offset_bytes + kv * bpt))
        return out
    for t in range(kv):
        block = a.block_ids[t // block_tokens]
        for layer in range(model.num_layers):
            start = block * alloc.block_bytes + (layer * block_tokens + t % block_tokens) * bpl
            out.update(range(start, start + bpl))
    return out


def _read_bytes(probe: StepProbe, allocations, kv_tokens) -> list[int]:
    """The bytes of the probe's runs, as offsets into the arena; and the same read through the
    embedding_bag rows (the CPU reader), which must be the same bytes."""
    groups = probe._runs(allocations, kv_tokens)
    read = [b for starts, lens, _ in groups for s, n in zip(starts.tolist(), lens.tolist())
            for b in range(4 * s, 4 * (s + n))]
    bag: list[int] = []
    base = probe.arena.buffer.data_ptr()
    for rows, idx, _ in probe._bag_reads(groups):
        width = rows.shape[1] * 4
        for r in idx.tolist():
            start = rows[r].data_ptr() - base
            bag.extend(range(start, start + width))
    assert bag == read
    return read


@pytest.mark.parametrize("policy", ["static", "paged", "s3", "odma"])
def test_each_step_reads_exactly_the_running_requests_kv(tiny_model, policy):
    model = load_model(tiny_model)
    bpt = model.kv_bytes_per_token
    alloc = make_allocator(policy, 1000 * bpt, bpt, {"max_model_len_tokens": 96, "block_size_tokens": 16,
                                                     "large_pool_fraction": 0.25},
                           arena="torch", device="cpu")
    probe = StepProbe(alloc.arena, model, 16 if policy == "paged" else None, StepShape.of(model, 8, 64, 96))
    rng = np.random.default_rng(3)
    live = []
    for i in range(3):
        prompt = int(rng.integers(5, 40))
        a = alloc.reserve(f"r{i}", prompt, 30, 0.1)
        assert a is not None
        kv = prompt + int(rng.integers(0, 25))
        assert alloc.extend(a, kv)
        live.append((a, kv))
    allocations, kv_tokens = [a for a, _ in live], [kv for _, kv in live]
    read = _read_bytes(probe, allocations, kv_tokens)
    want: set[int] = set()
    for a, kv in live:
        want |= _owned_bytes(alloc, a, model, 16 if policy == "paged" else None, kv)
    assert len(read) == len(set(read)) == len(want) and set(read) == want  # each byte once, nothing else
    seconds = probe.step(allocations, kv_tokens, modelled_ps=10**9)
    assert seconds > 0 and probe.measured_s == [seconds] and probe.modelled_ps == [10**9]
    # beside two prompt chunks (16 new tokens after 40, and a whole 30-token prompt), then a prefill alone
    probe.step(allocations, kv_tokens, modelled_ps=2 * 10**9, chunks=[(40, 16), (0, 30)])
    probe.step([], [], modelled_ps=3 * 10**9, chunks=[(0, 64)])
    assert probe.batch == [3, 3, 0] and probe.chunk_tokens == [0, 46, 64]
    assert probe.kv_bytes == [sum(kv_tokens) * bpt] * 2 + [0]
    with pytest.raises(ValueError, match="exceeds"):  # a chunk past the attention scratch
        probe.step([], [], modelled_ps=1, chunks=[(90, 16)])


def test_step_shape_counts_the_model_s_gemm_weights(tiny_model):
    """The probe's GEMMs read the layers' weights and the head, not the embedding table (the model's
    gemm_layers and gemm_head); its buffers are what StepShape.device_bytes counts."""
    model = load_model(tiny_model)
    shape = StepShape.of(model, max_batch=8, max_chunk_tokens=64, max_context_tokens=96)
    assert shape.layers == 4 and shape.head_columns == TINY["vocab_size"]
    left = model.layer_weight_bytes - shape.layers * shape.layer_columns * shape.hidden * 2  # rounded to GEMM_ALIGN
    assert shape.layer_columns % GEMM_ALIGN == 0 and 0 <= left < shape.layers * GEMM_ALIGN * shape.hidden * 2
    alloc = make_allocator("static", 1000 * model.kv_bytes_per_token, model.kv_bytes_per_token,
                           {"max_model_len_tokens": 96}, arena="torch", device="cpu")
    probe = StepProbe(alloc.arena, model, None, shape)
    assert probe.weight_bytes == model.layer_weight_bytes - left + model.head_params * 2 < model.weight_bytes
    held = sum(t.numel() * t.element_size() for t in (probe.layer_weights, probe.head_weights, probe.activations,
                                                      probe.product, probe.queries, probe.keys, probe.values))
    queries = probe.queries.numel() * 2  # the attention's output, as large, is counted too
    assert held + queries == shape.device_bytes


def test_a_shared_prefix_s_blocks_lead_a_paged_request_s_reads(tiny_model):
    """With prefix caching a paged request's KV starts in the cached prefix blocks it hit, which
    are not in its own allocation (allocator/prefix.PrefixCache.hit_blocks): the probe reads those
    first, then its own."""
    from array import array
    from types import SimpleNamespace

    model = load_model(tiny_model)
    bpt = model.kv_bytes_per_token
    alloc = make_allocator("paged", 1000 * bpt, bpt, {"max_model_len_tokens": 96, "block_size_tokens": 16},
                           arena="torch", device="cpu")
    probe = StepProbe(alloc.arena, model, 16, StepShape.of(model, 4, 64, 96))
    own = SimpleNamespace(block_ids=array("q", [5, 6, 7]))
    lead = [array("q", [1, 2])]
    (starts, lens, _), (tail_starts, tail_lens, _) = probe._runs([own], [4 * 16 + 3], lead)
    layer_words = 16 * int(model.kv_bytes_per_token_layer) // 4
    blocks = sorted({int(x) // (layer_words * model.num_layers) for x in starts})
    assert blocks == [1, 2, 5, 6] and (lens == layer_words).all()
    assert {int(x) // (layer_words * model.num_layers) for x in tail_starts} == {7} and tail_lens.sum() > 0


def test_cli_on_device_with_prefix_caching_hits(cli, tiny_model, tmp_path):
    """The Mooncake sample's prompts share prefixes: paged's on-device replay, every hit's blocks
    read, equals the virtual one (this crashed before the probe read the shared blocks)."""
    trace = tmp_path / "moon.parquet"
    assert cli("ingest", SAMPLES / "mooncake_conversation_sample.jsonl.gz", "--out", trace).code == 0
    common = ["--model", tiny_model, "--compare", "static,paged", "--predictor", "oracle", "--kv-pool", "64 MiB",
              "--limit", "8", "--engine", "vllm-v1", "--json"]
    r = cli("replay", trace, "--device", "cpu", "--on-device", "--profile", PROFILE, *common)
    assert r.code == 0, r.err
    device = json.loads(r.out)
    r = cli("replay", trace, "--device", PROFILE, "--stepping", *common)
    virtual = json.loads(r.out)
    assert device["results"]["paged"]["metrics"]["prefill_tokens_saved"] > 0
    for policy in ("static", "paged"):
        assert device["results"][policy]["metrics"] == virtual["results"][policy]["metrics"]


def test_probe_needs_token_by_token_stepping(tiny_model):
    model = load_model(tiny_model)
    bpt = model.kv_bytes_per_token
    alloc = make_allocator("odma", 1000 * bpt, bpt, {"max_model_len_tokens": 96, "large_pool_fraction": 0.25},
                           arena="torch", device="cpu")
    probe = StepProbe(alloc.arena, model, None, StepShape.of(model, 4, 64, 96))
    empty = Workload([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="fast_forward"):
        Replay(empty, alloc, None, 96, SchedulerSettings(fast_forward=True), probe=probe)


def test_cli_on_device_cpu_matches_the_virtual_stepping_replay(cli, tiny_model, small_trace, tmp_path):
    common = ["--model", tiny_model, "--compare", "static,paged,s3,odma", "--predictor", "oracle",
              "--kv-pool", "64 MiB", "--max-model-len", "4096"]
    out = tmp_path / "device.json"
    r = cli("replay", small_trace, "--device", "cpu", "--on-device", "--profile", PROFILE, *common, "--out", out)
    assert r.code == 0, r.err
    assert "measured total" in r.out and "modelled total" in r.out
    doc = json.loads(out.read_text())
    assert "run on cpu" in doc["time_advance"]
    r = cli("replay", small_trace, "--device", PROFILE, "--stepping", *common, "--json")
    assert r.code == 0, r.err
    virtual = json.loads(r.out)
    assert doc["kv_pool_bytes"] == virtual["kv_pool_bytes"]
    for policy, result in doc["results"].items():
        assert result["metrics"] == virtual["results"][policy]["metrics"], policy  # the clock is the model's
        assert result["metrics"]["completed"] == 24
        measured = result["on_device"]
        assert measured["torch_device"] == "cpu" and measured["layers"] == measured["layers_full"] == 4
        metrics = result["metrics"]
        assert measured["decode_steps"] + measured["mixed_steps"] == metrics["decode_iterations"] > 0
        assert measured["prefill_steps"] + measured["mixed_steps"] == metrics["prefill_iterations"] > 0
        steps = measured["all_steps"]
        assert steps["steps"] == metrics["decode_iterations"] + measured["prefill_steps"]
        assert steps["measured_s"] > 0 and steps["modelled_s"] > 0 and measured["decode_only"]["steps"] > 0
        assert len(measured["series"]["measured_s"]) == len(measured["series"]["modelled_s"]) > 0
        assert result["allocator"]["arena"] == "torch"


def test_cli_on_device_scale_keeps_the_pool_tokens(cli, tiny_model, small_trace):
    args = ["replay", small_trace, "--model", tiny_model, "--policy", "odma", "--predictor", "oracle",
            "--kv-pool", "33554433 B", "--limit", "6", "--json"]  # 32 MiB + 1 byte: rounded to whole tokens
    r = cli(*args, "--device", "cpu", "--on-device", "--profile", PROFILE, "--scale", "0.5")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    measured = doc["results"]["odma"]["on_device"]
    assert measured["layers"] == 2 and measured["layers_full"] == 4
    full = load_model(tiny_model)
    half = full.scaled(0.5)
    assert doc["kv_bytes_per_token"] == half.kv_bytes_per_token == full.kv_bytes_per_token // 2
    assert doc["kv_pool_bytes"] // doc["kv_bytes_per_token"] == (32 << 20) // full.kv_bytes_per_token
    assert half.weight_bytes < full.weight_bytes


def test_cli_on_device_errors(cli, tiny_model, small_trace, tmp_path):
    base = ["replay", small_trace, "--model", tiny_model, "--predictor", "oracle", "--out", tmp_path / "x.json"]
    for args, words in [
        (["--device", "mlu370-x4", "--on-device"], "--device expects one of"),
        (["--device", PROFILE, "--scale", "0.5"], "--on-device"),
        (["--device", PROFILE, "--profile", PROFILE], "--on-device"),
        (["--device", "cpu", "--on-device", "--profile", PROFILE, "--scale", "0"], "--scale"),
        (["--device", "cpu", "--on-device", "--profile", PROFILE, "--kv-pool", "12 GB/s"], "--kv-pool"),
        (["--device", "cpu", "--on-device", "--profile", PROFILE, "--kv-pool", "100 TiB"], "does not fit"),
        (["--device", "cpu", "--on-device", "--profile", PROFILE, "--kv-dtype", "oaken", "--kv-pool", "8 MiB"],
         "4-byte words; oaken KV has 177.6 bytes"),
        (["--device", "cpu", "--on-device", "--profile", PROFILE, "--kv-dtype", "oaken", "--kv-pool", "8 MiB"],
         "use --kv-dtype fp16, bf16, fp8, int8 or int4"),  # the dtypes that give this model whole words
        (["--device", "cpu", "--on-device", "--profile", "h200"], "--kv-pool"),  # a pool no layer count fits
        (["--device", "cpu", "--on-device", "--profile", PROFILE, "--tp", "0"], "--tp"),  # the value, not "no --tp"
    ]:
        r = cli(*base, *args)
        assert r.code == 1 and words in r.err and "Traceback" not in r.err, (args, r.err)
    assert not (tmp_path / "x.json").exists()


def test_step_time_fit_recovers_the_terms_and_refuses_what_it_cannot_separate():
    rng = np.random.default_rng(3)
    batch = rng.integers(1, 257, 400).astype(np.float64)
    kv_bytes = rng.uniform(1e8, 2e10, 400)
    steps = 5e-3 + 2e-6 * batch + kv_bytes / 2.5e12 + rng.normal(0, 1e-5, 400)
    fit = step_time_fit(steps, batch, kv_bytes)
    assert fit["fixed_s"] == pytest.approx(5e-3, rel=0.02)
    assert fit["per_request_s"] == pytest.approx(2e-6, rel=0.1)
    assert fit["kv_bytes_per_s"] == pytest.approx(2.5e12, rel=0.01)
    assert fit["r2"] > 0.99 and fit["residual_rms_s"] < 2e-5
    assert step_time_fit(steps[:7], batch[:7], kv_bytes[:7]) is None  # too few steps
    full = np.full(400, 256.0)  # a batch that never changes is the intercept's twin
    assert step_time_fit(steps, full, kv_bytes) is None


def test_runs_expand_to_their_indices_and_split_into_tiles_that_cover_them():
    rng = np.random.default_rng(5)
    starts = np.cumsum(rng.integers(0, 50, 40)) * 7
    lens = rng.integers(0, 60, 40)
    idx = expand_runs(starts, lens)
    assert idx.tolist() == [s + k for s, n in zip(starts.tolist(), lens.tolist()) for k in range(n)]
    tile_starts, tile_lens = split_runs(starts, lens, 16)
    assert (tile_lens > 0).all() and (tile_lens <= 16).all()
    assert expand_runs(tile_starts, tile_lens).tolist() == idx.tolist()  # the tiles are the runs, in order
    assert split_runs(np.zeros(0, np.int64), np.zeros(0, np.int64), 16)[0].size == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton run reader needs a CUDA device")
def test_triton_run_reader_sums_each_tile():
    from odmactl.device.runread import read_tiles

    words = torch.randn(1 << 20, device="cuda")
    starts, lens = split_runs(np.array([0, 5008, 100000, 700000], np.int64),
                              np.array([3000, 8192, 20000, 16], np.int64), 8192)
    sums = torch.empty(starts.size, device="cuda")
    read_tiles(words, torch.from_numpy(starts).cuda(), torch.from_numpy(lens).cuda(), sums, 16)
    want = torch.stack([words[s:s + n].sum() for s, n in zip(starts.tolist(), lens.tolist())])
    torch.testing.assert_close(sums, want, rtol=1e-4, atol=1e-3)
