"""The replay engine: closed-form fast-forward against token-by-token stepping, conservation on the
Azure conv trace for every policy, determinism, and the `odmactl replay` command."""

from __future__ import annotations

import json
import random
from array import array

import numpy as np
import polars as pl
import pytest
from conftest import SAMPLES

from odmactl.allocator import ALLOCATORS, make_allocator
from odmactl.cli import main
from odmactl.hw.cost import CostModel, KvLayout, StepCoefficients
from odmactl.hw.profiles import load_device, load_model
from odmactl.render.json import to_json
from odmactl.run.replay import run_policies
from odmactl.run.spec import LoadOptions, ReplaySpec
from odmactl.run.replay import deployment_of
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.segment import Segment
from odmactl.sim.workload import PS, Workload
from odmactl.trace.schema import read_trace

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


@pytest.fixture(scope="module")
def conv_sample(tmp_path_factory) -> pl.DataFrame:
    out = tmp_path_factory.mktemp("conv") / "conv.parquet"
    assert main(["ingest", str(SAMPLES / "azure_conv_2023_sample.csv.gz"), "--out", str(out)]) == 0
    return read_trace(out)


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel(load_device(DEVICE), load_model(MODEL))


def test_segment_sums_equal_step_by_step_sums():
    _segment_sums_equal_step_by_step_sums(random.Random(7), scale=1)


def test_segment_occupancy_past_64_bits_equals_step_by_step_sums():
    """Blocks x ps past 2**60 in one segment: advance sums occupancy as Python integers, not C ones."""
    largest = _segment_sums_equal_step_by_step_sums(random.Random(11), scale=10**4, cases=60)
    assert largest > 2**62


def _segment_sums_equal_step_by_step_sums(rng: random.Random, scale: int, cases: int = 400) -> int:
    """Random segments against `StepCoefficients.step_ps` summed iteration by iteration; returns the
    largest occupancy sum seen."""
    largest = 0
    for _ in range(cases):
        block = rng.choice([None, 1, 4, 16])
        gemm_ps = tuple(sorted(rng.randint(0, 10**6) * scale for _ in range(13)))  # by batch size 0..12
        coeff = StepCoefficients(gemm_ps=gemm_ps, fixed_ps=rng.randint(0, 99), per_seq_ps=rng.randint(0, 10**4) * scale,
                                 per_token_ps=rng.randint(1, 999) * scale, per_run_ps=rng.randint(0, 5000) * scale,
                                 block_tokens=block)
        v = [rng.randint(1, 200) * min(scale, 1000) for _ in range(rng.randint(1, 12))]
        period = block or 1
        runs = [sum(coeff.runs(x + i) for x in v) for i in range(period + 1)]
        seg = Segment(coeff)
        seg.runs[:] = array("q", runs)
        seg.reset(len(v), sum(v))
        k = rng.randint(1, 80)
        limit = runs[0] + rng.randint(0, 60)
        elapsed = held = 0
        first = k
        for j in range(k):
            dt = coeff.step_ps([x + j for x in v])
            elapsed += dt
            blocks = sum(coeff.runs(x + j + 1) for x in v)
            held += blocks * dt
            if blocks > limit and first == k:
                first = j
        assert seg.elapsed_ps(k) == elapsed
        if block is not None:
            assert seg.held_runs_ps(k) == held
            assert seg.first_over(limit, k) == first
        deadline = rng.randint(1, elapsed + 10)
        expected = next((j for j in range(1, k + 1) if seg.elapsed_ps(j) >= deadline), k)
        assert seg.iterations_until(deadline, k) == expected
        largest = max(largest, held)
    return largest


def _workload(frame: pl.DataFrame, l_hat=None, u=None, offline=False) -> Workload:
    arrival = np.zeros(frame.height) if offline else frame["arrival_s"].to_numpy()
    return Workload(frame["request_id"].to_list(), np.round(arrival * PS).astype(np.int64),
                    frame["prompt_tokens"].to_numpy().astype(np.int64), frame["output_tokens"].to_numpy().astype(np.int64),
                    l_hat, u)


def case_workload(frame: pl.DataFrame, predictor: str, offline: bool) -> Workload:
    """A CASES workload: no prediction, the true lengths, or half of them (every mistake charged)."""
    out = frame["output_tokens"].to_numpy().astype(np.float64)
    l_hat = u = None
    if predictor == "oracle":
        l_hat, u = out, np.zeros(frame.height)
    elif predictor == "half":
        l_hat, u = np.maximum(out // 2, 1), np.random.default_rng(0).uniform(0, 1, frame.height)
    return _workload(frame, l_hat, u, offline)


def _replay(workload, cost, policy, pool_tokens, config, fast_forward, max_len=8192, max_num_seqs=256):
    bpt = cost.model.kv_bytes_per_token
    allocator = make_allocator(policy, pool_tokens * bpt, bpt, {"max_model_len_tokens": max_len, **config},
                               deployment=deployment_of(cost))
    return Replay(workload, allocator, cost, max_len,
                  SchedulerSettings(fast_forward=fast_forward, max_num_seqs=max_num_seqs)).run()


CASES = [
    # policy, pool tokens, allocator settings, predictor, offline: chosen to exercise preemption
    # (paged, small pool), ODMA migrations and refits, S3 preemptions (its paper's supervisor) and
    # moves (s3_overflow = "migrate"), and arrivals into an idle system
    ("static", 60_000, {}, "none", False),
    ("paged", 20_000, {}, "none", False),
    ("paged", 20_000, {"block_size_tokens": 4}, "none", True),
    # s3's buckets are over the output (at most 594 tokens here): 64 buckets of 128 so that halved
    # predictions outgrow them
    ("s3", 40_000, {"s3_num_buckets": 64}, "half", False),
    ("s3", 40_000, {"s3_num_buckets": 64, "s3_overflow": "migrate"}, "half", False),
    ("odma", 40_000, {"large_pool_bytes": 8192 * 57344 * 2, "boundaries_tokens": [512, 1024, 2048, 4096],
                      "refit_every": 50, "refit_window": 200}, "half", False),
    ("odma", 30_000, {"large_pool_bytes": 8192 * 57344, "boundaries_tokens": [600, 1400, 3000, 8192]}, "oracle", True),
    ("odma", 30_000, {"large_pool_bytes": 8192 * 57344, "boundaries_tokens": [600, 1400, 3000, 4096],
                      "large_spill": True, "tau": 0.5}, "half", False),
    # ellm: borrowing 6,000 tokens' worth of activation memory (Qwen-7B: 57,344 B a token), then
    # with no borrowing and a host buffer (offload and fetch), then with its SLO-aware scaling
    ("ellm", 20_000, {"ellm_borrow_bytes": 6_000 * 57344}, "none", False),
    ("ellm", 12_000, {"ellm_borrow_bytes": 0, "ellm_host_buffer_bytes": 8_000 * 57344}, "none", False),
    ("ellm", 12_000, {"ellm_borrow_bytes": 2_000 * 57344, "ellm_host_buffer_bytes": 8_000 * 57344,
                      "ellm_ttft_slo_s": 2.0, "ellm_tpot_slo_s": 0.2}, "none", True),
    # unified: page ranges from a small pool (growth into new ranges, preemption), first fit
    ("unified", 20_000, {}, "none", False),
    ("unified", 20_000, {"unified_fit": "first", "block_size_tokens": 4}, "none", True),
]


@pytest.mark.parametrize("policy,pool_tokens,config,predictor,offline", CASES)
def test_fast_forward_equals_token_by_token_stepping(conv_sample, cost, policy, pool_tokens, config, predictor, offline):
    frame = conv_sample.head(220)
    out = frame["output_tokens"].to_numpy().astype(np.float64)
    w = case_workload(frame, predictor, offline)
    fast = _replay(w, cost, policy, pool_tokens, config, True, max_num_seqs=48)
    slow = _replay(w, cost, policy, pool_tokens, config, False, max_num_seqs=48)
    assert fast.metrics == slow.metrics
    # growth reaches the allocator lazily when fast-forwarding, but its peak is eager growth's
    assert fast.allocator["peak_reserved_bytes"] == slow.allocator["peak_reserved_bytes"]
    m = fast.metrics
    assert m["completed"] == frame.height and m["generated_tokens"] == int(out.sum())
    assert m["overflow_rate"] == (m["migrations"] + m["preemptions"]) / m["requests"]
    if policy in ("paged", "unified") and pool_tokens == 20_000:
        assert m["preemptions"] > 0
    if policy == "unified":  # page ranges, never more than the blocks paged would hold; nothing copied
        blocks = (frame["prompt_tokens"] + frame["output_tokens"]).to_numpy() / config.get("block_size_tokens", 16)
        assert 1 < m["kv_runs_per_request"] <= float(np.ceil(blocks).mean()) and m["migrations"] == 0
    if config.get("ellm_host_buffer_bytes"):
        c = fast.allocator["policy_counters"]
        assert c["offloads"] > 0 and c["fetches"] == c["offloads"] and m["host_link_bytes"] > 0
        assert slow.allocator["policy_counters"] == c
    if config.get("ellm_ttft_slo_s"):
        assert fast.allocator["policy_counters"]["buffer_scalings"] > 0
    if (policy == "odma" or config.get("s3_overflow") == "migrate") and predictor == "half":
        assert m["migrations"] > 0
    elif policy == "s3" and predictor == "half":  # preempted and re-admitted with the next bucket
        assert m["preemptions"] > 0 and m["migrations"] == 0 and m["recomputed_tokens"] > 0
        assert fast.allocator["policy_counters"]["escalations"] > 0
    assert fast.metrics["decode_iterations"] > 10 * fast.metrics["prefill_iterations"] / 10


@pytest.mark.parametrize("policy", ["paged", "odma"])
@pytest.mark.parametrize("offline", [True, False])
def test_a_small_token_budget_admits_over_several_iterations_alike_in_both_modes(conv_sample, cost, policy, offline):
    """Admission stopped by max_num_batched_tokens is retried at the next iteration (vLLM's
    prefill-first scheduling); fast-forward still equals stepping."""
    frame = conv_sample.head(220)
    w = case_workload(frame, "oracle", offline)
    config = {"boundaries_tokens": [600, 1400, 3000, 8192], "large_pool_bytes": 0} if policy == "odma" else {}
    runs = []
    for fast_forward in (True, False):
        bpt = cost.model.kv_bytes_per_token
        allocator = make_allocator(policy, 60_000 * bpt, bpt, {"max_model_len_tokens": 8192, **config})
        settings = SchedulerSettings(fast_forward=fast_forward, max_num_seqs=48, max_num_batched_tokens=8192)
        runs.append(Replay(w, allocator, cost, 8192, settings).run())
    assert runs[0].metrics == runs[1].metrics
    assert runs[0].metrics["completed"] == frame.height


@pytest.mark.parametrize("policy", ["static", "paged", "odma"])
def test_fast_forward_equals_stepping_under_tensor_parallelism(conv_sample, policy):
    """The all-reduce terms (a fixed and a per-request part of each step) sum in closed form exactly."""
    model = load_model(MODEL).shard(4)
    tp_cost = CostModel(load_device(DEVICE), model, tp=4)
    one = CostModel(load_device(DEVICE), model, tp=1).step_coefficients(KvLayout.contiguous())
    assert tp_cost.step_coefficients(KvLayout.contiguous()).per_seq_ps > one.per_seq_ps  # the all-reduces' share
    w = case_workload(conv_sample.head(220), "half", False)
    config = {"boundaries_tokens": [512, 1024, 2048, 4096, 8192], "large_pool_bytes": 0} if policy == "odma" else {}
    runs = []
    for fast_forward in (True, False):
        bpt = model.kv_bytes_per_token * 4
        allocator = make_allocator(policy, 30_000 * bpt, bpt, {"max_model_len_tokens": 8192, **config})
        runs.append(Replay(w, allocator, tp_cost, 8192, SchedulerSettings(fast_forward=fast_forward, max_num_seqs=48)).run())
    assert runs[0].metrics == runs[1].metrics


def test_a_full_queue_fills_the_batch_to_max_num_seqs(cost):
    """Issue 27, acceptance 0: 1,000 offline requests with 1,000-token prompts on an A100-80GB with
    Llama-3-8B, paged: the batch grows to --max-num-seqs (it stayed at 2 when admission waited for a
    release), and fast-forward equals stepping."""
    a100 = CostModel(load_device("a100-80gb-sxm"), load_model("Llama-3-8B"))
    n = 1000
    w = Workload(request_ids=[str(i) for i in range(n)], arrival_ps=np.zeros(n, dtype=np.int64),
                 prompt_tokens=np.full(n, 1000, dtype=np.int64), output_tokens=np.full(n, 200, dtype=np.int64))
    bpt = a100.model.kv_bytes_per_token
    for max_num_seqs in (8, 32, 128):
        results = []
        for fast_forward in (True, False):
            allocator = make_allocator("paged", 400_000 * bpt, bpt, {"max_model_len_tokens": 8192})
            settings = SchedulerSettings(fast_forward=fast_forward, max_num_seqs=max_num_seqs)
            results.append(Replay(w, allocator, a100, 8192, settings).run().metrics)
        assert results[0] == results[1]
        assert results[0]["peak_concurrency"] == max_num_seqs
        assert results[0]["prefill_iterations"] == -(-n // (8192 // 1000))  # 8 prompts fill each 8,192-token budget


def _conservation(frame: pl.DataFrame) -> None:
    spec = ReplaySpec(device=DEVICE, model=MODEL, predictor="oracle")
    doc = run_policies(frame, list(ALLOCATORS), spec)
    total = int(frame["output_tokens"].cast(pl.Int64).sum())
    for policy, r in doc["results"].items():
        m = r["metrics"]
        assert m["completed"] == frame.height, policy
        assert m["generated_tokens"] == total, policy
        assert m["rejections"] == m["truncated"] == 0, policy
        assert r["allocator"]["live_allocations"] == 0 and r["allocator"]["reserved_bytes"] == 0
        assert 0 < m["kv_utilization"] <= 1 and 0 < m["pool_occupancy"] <= 1
    assert to_json(run_policies(frame, list(ALLOCATORS), spec)) == to_json(doc)


def test_conservation_and_determinism_on_the_shipped_conv_sample(conv_sample):
    _conservation(conv_sample)


def test_conservation_and_determinism_on_the_full_azure_conv_trace(shared_traces, tmp_path):
    out = tmp_path / "conv.parquet"
    assert main(["ingest", str(shared_traces / "AzureLLMInferenceTrace_conv.csv.gz"), "--out", str(out)]) == 0
    frame = read_trace(out)
    assert frame.height == 19_366
    _conservation(frame)


def test_paged_beats_static_and_odma_oracle_migrates_nothing(conv_sample):
    doc = run_policies(conv_sample, ["static", "paged", "odma"], ReplaySpec(device=DEVICE, model=MODEL, predictor="oracle"))
    r = {p: v["metrics"] for p, v in doc["results"].items()}
    assert r["paged"]["kv_utilization"] > 0.95 > r["static"]["kv_utilization"]
    assert r["paged"]["tps"] > r["static"]["tps"] and r["odma"]["tps"] > r["static"]["tps"]
    assert r["odma"]["migrations"] == 0  # oracle lengths always fit their bucket


def test_load_options_shape_arrivals(conv_sample):
    spec = ReplaySpec(device=DEVICE, model=MODEL, load=LoadOptions(offline=True, limit=50))
    doc = run_policies(conv_sample, ["paged"], spec)
    assert doc["trace"]["requests"] == 50 and doc["results"]["paged"]["metrics"]["completed"] == 50
    slow = run_policies(conv_sample, ["paged"], ReplaySpec(device=DEVICE, model=MODEL, load=LoadOptions(rate_per_s=0.5, limit=50)))
    fast = run_policies(conv_sample, ["paged"], ReplaySpec(device=DEVICE, model=MODEL, load=LoadOptions(rate_per_s=50, limit=50)))
    assert slow["results"]["paged"]["metrics"]["makespan_s"] > 90  # 49 gaps at 2 s
    assert fast["results"]["paged"]["metrics"]["ttft_p99"] > slow["results"]["paged"]["metrics"]["ttft_p99"]


def test_cli_replay_compare_json_plot_and_errors(cli, conv_sample, tmp_path):
    trace = tmp_path / "t.parquet"
    conv_sample.head(300).write_parquet(trace)
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--compare", "static,paged,s3,odma",
            "--predictor", "oracle", "--out", out, "--plot", plot)
    assert r.code == 0, r.err
    assert "paged" in r.out and "KV util" in r.out
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"static", "paged", "s3", "odma"}
    series = doc["results"]["odma"]["series"]
    assert len(series["time_s"]) == len(series["pool_occupancy"]) > 10 and series["bucket_boundaries"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    good = out.read_text()
    # existing outputs are not clobbered; bad input exits 1 with a message, no traceback
    assert cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--out", out).code == 1
    for args, words in [
        (["--policy", "buddy"], "unknown policy"),
        (["--compare", "paged,paged"], "twice"),
        (["--rate", "0"], "--rate"),
        (["--offline", "--rate", "3"], "exclude"),
        (["--device", "nope"], "nope"),
    ]:
        r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, *args, "--out", tmp_path / "x.json")
        assert r.code == 1 and words in r.err and "Traceback" not in r.err, (args, r.err)
    bad = tmp_path / "c.toml"
    bad.write_text("[allocator]\ngama = 0.3\n")
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--config", bad)
    assert r.code == 1 and "gama" in r.err and str(bad) in r.err
    assert out.read_text() == good and not (tmp_path / "x.json").exists()
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "paged", "--json", "--limit", "20")
    assert r.code == 0 and json.loads(r.out)["results"]["paged"]["metrics"]["completed"] == 20


def test_a_replay_that_completes_no_request_reports_null_latencies(cli, conv_sample_head):
    """Issue 40: 0 requests completed reported TTFT and TPOT p50/p99 as 0.0; a latency no request
    had is null in the JSON, n/a in the table, and absent from the Prometheus text."""
    import json

    trace = conv_sample_head(100)
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "paged", "--max-model-len", "2", "--json")
    m = json.loads(r.out)["results"]["paged"]["metrics"]
    assert r.code == 0 and m["completed"] == 0
    assert [m[k] for k in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")] == [None] * 4
    text = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "paged", "--max-model-len", "2").out
    assert "TTFT p99" in text and "n/a" in text
