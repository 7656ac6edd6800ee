"""vLLM v1's schedule (--engine vllm-v1): one token budget a step, the running requests first,
prompts chunked into the rest, a mixed step's time from the kernel model, preemption by recompute
of the newest request; its closed form equals stepping for every policy; the engine's defaults
and refusals. Hand-computed cases follow vllm/v1/core/sched/scheduler.py `Scheduler.schedule`."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from odmactl.allocator import ALLOCATORS, make_allocator
from odmactl.core.errors import ConfigError
from odmactl.hw.cost import CostModel, KvLayout, to_ps
from odmactl.hw.profiles import load_device, load_model
from odmactl.run.replay import deployment_of, engine_scheduler
from odmactl.run.serving import serving
from odmactl.run.spec import ServingSpec
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.workload import PS, Workload

V1 = "vllm-v1"


def _cost(device: str = "h100-sxm", model: str = "Llama-3-8B") -> CostModel:
    return CostModel(load_device(device), load_model(model))


def _replay(w: Workload, cost: CostModel, policy: str, pool_tokens: int, settings: SchedulerSettings,
            config: dict | None = None, max_len: int = 8192):
    """The replay, run (its batch and tally readable), and its result."""
    bpt = cost.model.kv_bytes_per_token
    alloc = make_allocator(policy, pool_tokens * bpt, bpt, {"max_model_len_tokens": max_len, **(config or {})},
                           deployment=deployment_of(cost))
    replay = Replay(w, alloc, cost, max_len, settings)
    return Ran(replay, replay.run())


class Ran:
    def __init__(self, replay, result) -> None:
        self.batch, self.tally, self.result = replay.batch.timeline(), replay.tally, result


def _workload(prompts, outputs, arrivals_ps) -> Workload:
    n = len(prompts)
    return Workload([f"r{i}" for i in range(n)], np.asarray(arrivals_ps, dtype=np.int64),
                    np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64))


@pytest.mark.parametrize("ff", [True, False])
def test_three_decodes_beside_a_5000_token_prompt_chunked_over_three_steps(ff):
    """Budget 2,048. Step 1: three 100-token prompts arrive at 0 and prefill whole (300 tokens, no
    decode). The 5,000-token prompt arrives 1 ps later: steps 2-4 each run the three decodes (one
    token each, the budget's first 3 tokens) beside a chunk of 2,045, 2,045 and 910 tokens, and its
    first token comes at the end of step 4. Then the three decode alone (46 more steps). Every
    figure below is computed from the cost model's coefficients, not read from the replay."""
    cost = _cost()
    w = _workload([100, 100, 100, 5000], [50, 50, 50, 1], [0, 0, 0, 1])
    settings = SchedulerSettings(engine=V1, max_num_seqs=256, max_num_batched_tokens=2048, fast_forward=ff)
    r = _replay(w, cost, "paged", 100_000, settings)
    coeff = cost.step_coefficients(KvLayout(16), max_batch=256)
    prefill = cost.prefill
    step1 = to_ps(prefill.seconds(300, 3 * 100 ** 2, 3))
    chunks = [(0, 2045), (2045, 2045), (4090, 910)]
    mixed = []
    for j, (x, c) in enumerate(chunks):  # the decodes read 101, 102, 103 tokens each
        decode = coeff.step_ps([101 + j] * 3)
        mixed.append(decode - coeff.gemm_ps[3] + to_ps(prefill.beside_decodes_s(3, c, (x + c) ** 2 - x ** 2, 1)))
        # the float reference agrees (the integer coefficients are each rounded once)
        assert mixed[-1] == pytest.approx(cost.mixed_step_s([101 + j] * 3, KvLayout(16), [(x, c)]) * PS, rel=1e-9)
    alone = [coeff.step_ps([104 + j] * 3) for j in range(46)]  # kv 104..149, tokens 5..50
    b = r.batch
    for i in range(3):
        assert b.first_ps[i] == step1  # TTFT of the short prompts: the first step
        assert b.done_ps[i] == step1 + sum(mixed) + sum(alone)  # their 49 decodes: 3 mixed + 46 alone
    assert b.start_ps[3] == step1 and b.first_ps[3] == step1 + sum(mixed)  # the end of its last chunk
    m = r.result.metrics
    assert m["prefill_iterations"] == 4 and m["decode_iterations"] == 49 and m["preemptions"] == 0
    tpot = (step1 + sum(mixed) + sum(alone) - step1) / 49 / PS
    assert r.result.tpot_s[0] == pytest.approx(tpot, rel=1e-12)
    assert r.result.ttft_s[3] == pytest.approx((step1 + sum(mixed) - 1) / PS, rel=1e-12)
    # the same requests under vllm-v0: the long prompt's prefill stops all three decodes, whole
    v0 = _replay(w, cost, "paged", 100_000, SchedulerSettings(max_num_seqs=256, max_num_batched_tokens=8192,
                                                              fast_forward=ff))
    assert v0.batch.first_ps[3] == step1 + to_ps(prefill.seconds(5000, 5000 ** 2, 1))
    assert v0.result.metrics["tpot_p99"] > m["tpot_p99"]


@pytest.mark.parametrize("ff", [True, False])
def test_a_full_pool_preempts_the_newest_by_recompute(ff):
    """Two 200-token prompts, 300 output tokens each, in a pool of 40 blocks of 16 tokens: both fit
    (13 blocks each) and grow until the 41st block is needed, when v1 preempts the newest running
    request (`self.running.pop()`): B's blocks are freed, it waits first, and once A completes it
    is recomputed (its prompt and the tokens it had generated, chunked as a prompt) and finishes.
    Its first token keeps its first time."""
    cost = _cost()
    w = _workload([200, 200], [300, 300], [0, 0])
    settings = SchedulerSettings(engine=V1, max_num_seqs=256, max_num_batched_tokens=2048, fast_forward=ff)
    r = _replay(w, cost, "paged", 40 * 16, settings, max_len=640)
    m, b = r.result.metrics, r.batch
    assert m["preemptions"] == 1 and m["completed"] == 2
    assert b.done_ps[0] < b.done_ps[1]  # A, the oldest, ran on; B was the victim
    assert b.first_ps[0] == b.first_ps[1]  # one prefill step made both first tokens, B's kept
    # both held 320 KV tokens (20 blocks each: the prompt and 120 generated) when the next token needed
    # a 21st block each: B's 120 tokens are recomputed with its prompt
    assert r.tally.recomputed == 120
    again = [_replay(w, cost, "paged", 40 * 16, SchedulerSettings(engine=V1, max_num_batched_tokens=2048,
                                                                  fast_forward=not ff), max_len=640)]
    assert again[0].result.metrics == m


POLICY_SETTINGS = {
    "static": {}, "paged": {}, "s3": {"s3_num_buckets": 64},
    "odma": {"boundaries_tokens": [512, 1024, 2048, 4096], "refit_every": 40, "refit_window": 120},
    "ellm": {"ellm_borrow_bytes": 1_500 * 57_344},
    "unified": {},
}


@pytest.fixture(scope="module")
def frame(conv_sample_head) -> pl.DataFrame:
    return pl.read_parquet(conv_sample_head(400)).head(160)


@pytest.mark.parametrize("policy", sorted(ALLOCATORS))
@pytest.mark.parametrize("regime", ["overloaded", "budget"])
def test_fast_forward_equals_stepping_under_vllm_v1_for_every_policy(frame, policy, regime):
    """The trace at 40x its rate on one MLU370-X4 (overloaded), or at 4x with a 512-token budget
    (prompts chunked over several steps): the metrics, the allocator's counters and its peak agree
    exactly between the closed form and stepping; every request completes."""
    cost = _cost("mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B")
    out = frame["output_tokens"].to_numpy().astype(np.int64)
    scale = 40.0 if regime == "overloaded" else 4.0
    arrival = np.round(frame["arrival_s"].to_numpy() / scale * PS).astype(np.int64)
    w = Workload(frame["request_id"].to_list(), arrival, frame["prompt_tokens"].to_numpy().astype(np.int64), out,
                 np.maximum(out // 2, 1).astype(np.float64), np.random.default_rng(3).uniform(0, 1, out.size))
    pool_tokens = {"static": 60_000, "s3": 30_000, "odma": 30_000}.get(policy, 12_000)
    config = dict(POLICY_SETTINGS[policy])
    if policy == "odma":
        config["large_pool_bytes"] = 2 * 8192 * cost.model.kv_bytes_per_token
    runs = [_replay(w, cost, policy, pool_tokens, SchedulerSettings(
        engine=V1, fast_forward=ff, max_num_seqs=64, max_num_batched_tokens=512 if regime == "budget" else 2048),
        config) for ff in (True, False)]
    fast, slow = (x.result for x in runs)
    assert fast.metrics == slow.metrics
    assert fast.allocator["peak_reserved_bytes"] == slow.allocator["peak_reserved_bytes"]
    assert fast.allocator["policy_counters"] == slow.allocator["policy_counters"]
    assert fast.metrics["completed"] == w.size and fast.allocator["live_allocations"] == 0
    if regime == "budget":  # every prompt past the budget took more than one step
        assert fast.metrics["prefill_iterations"] >= int(np.ceil(w.prompt_tokens / 512).sum()) // 2


def test_a_host_buffer_is_refused_under_vllm_v1():
    cost = _cost("mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B")
    w = _workload([100], [10], [0])
    with pytest.raises(ConfigError, match="vllm-v0"):
        _replay(w, cost, "ellm", 20_000, SchedulerSettings(engine=V1, max_num_batched_tokens=2048),
                {"ellm_host_buffer_bytes": 4_000 * 57_344})


@pytest.mark.parametrize("device, seqs, budget", [("h100-sxm", 1024, 8192), ("h200", 1024, 8192),
                                                  ("a100-80gb-sxm", 256, 2048), ("mlu370-x4", 256, 8192)])
def test_each_device_runs_its_engine_with_that_engines_defaults(device, seqs, budget):
    """NVIDIA profiles default to vllm-v1 with vLLM's get_batch_defaults (an A100 gets the small
    ones); MLU370 to vllm-v0 (max(max_model_len, 2048) at max_model_len 8,192)."""
    setup = serving(device, "Llama-3-8B")
    tables = {"scheduler": {}, "allocator": {}}
    s = engine_scheduler(ServingSpec(device=device, model="Llama-3-8B"), setup, tables, None, 8192)
    assert s.engine == ("vllm-v0" if device.startswith("mlu") else V1)
    assert (s.max_num_seqs, s.batched_tokens(8192)) == (seqs, budget)
    # a flag, then a config, overrides the device's engine; the caps follow the engine named
    s = engine_scheduler(ServingSpec(device=device, model="Llama-3-8B", engine="vllm-v0"), setup, tables, None, 8192)
    assert s.engine == "vllm-v0" and (s.max_num_seqs, s.batched_tokens(8192)) == (256, 8192)
    s = engine_scheduler(ServingSpec(device=device, model="Llama-3-8B"), setup,
                         {"scheduler": {"engine": V1, "max_num_seqs": 64}, "allocator": {}}, None, 8192)
    assert s.engine == V1 and s.max_num_seqs == 64


def test_what_vllm_refuses_is_refused_with_its_reason(cli, conv_sample_head, tmp_path):
    """max_num_seqs above the budget (vLLM 0.6.2 and v1 raise), block size 8 under v1 (no CUDA
    backend takes it), an unknown engine; exit 1, one message naming the setting."""
    trace = conv_sample_head(60)
    base = ["replay", str(trace), "--model", "Llama-3-8B", "--predictor", "oracle", "--policy", "paged"]
    r = cli(*base, "--device", "mlu370-x4", "--max-num-seqs", "4096", "--max-model-len", "2048")
    assert r.code == 1 and "must be greater than or equal to max_num_seqs" in r.err
    r = cli(*base, "--device", "h100-sxm", "--block-size", "8")
    assert r.code == 1 and "--block-size 8" in r.err and "multiples of 16" in r.err
    r = cli(*base, "--device", "h100-sxm", "--engine", "vllm-v2")
    assert r.code == 1 and "--engine expects one of vllm-v0, vllm-v1" in r.err
    bad = tmp_path / "c.toml"
    bad.write_text('[scheduler]\nengine = "vllm-v9"\n')
    r = cli(*base, "--device", "h100-sxm", "--config", bad)
    assert r.code == 1 and "scheduler.engine" in r.err and "vllm-v9" in r.err
    assert "Traceback" not in r.err
    # under v1 a budget below max_model_len is fine (chunked), and a block of 8 under v0 too
    r = cli(*base, "--device", "h100-sxm", "--max-num-batched-tokens", "512", "--max-model-len", "4096")
    assert r.code == 1 and "max_num_seqs (1,024)" in r.err  # the H100's default batch cap is above it
    assert cli(*base, "--device", "h100-sxm", "--max-num-batched-tokens", "512", "--max-model-len", "4096",
               "--max-num-seqs", "256").code == 0
    assert cli(*base, "--device", "mlu370-x4", "--block-size", "8").code == 0
    buffered = tmp_path / "hb.toml"  # eLLM's host buffer offloads a prefill's KV: v0 only, said with its key
    buffered.write_text("[allocator]\nellm_host_buffer_bytes = 1000000000\n")
    r = cli(*base[:-1], "ellm", "--device", "h100-sxm", "--config", buffered)
    assert r.code == 1 and "allocator.ellm_host_buffer_bytes" in r.err and "--engine vllm-v0" in r.err
    assert cli(*base[:-1], "ellm", "--device", "h100-sxm", "--config", buffered, "--engine", "vllm-v0").code == 0
