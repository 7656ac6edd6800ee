"""Issue 30's policies by hand: eLLM's activation demand, one inflation/deflation sequence, one
offload and fetch charged at the host link; ADR-006's best-fit page ranges with an eviction under
the hysteresis band, its adapters and runs per request."""

from __future__ import annotations

import numpy as np
import pytest

from odmactl.allocator import make_allocator
from odmactl.core.errors import AllocationError
from odmactl.hw.cost import CostModel, KvLayout, to_ps
from odmactl.hw.profiles import HostLink, load_device, load_model
from odmactl.run.serving import serving
from odmactl.run.replay import deployment_of
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.prefill import PrefillClock
from odmactl.sim.workload import PS, Workload

MiB = 1 << 20
TOKEN_BYTES = 131_072  # Llama-3-8B in fp16: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 B
BLOCK_BYTES = 16 * TOKEN_BYTES  # 2 MiB: ADR-006's default page, eLLM's chunk


@pytest.fixture(scope="module")
def a100() -> CostModel:
    return serving("a100-80gb-sxm", "Llama-3-8B").cost


def test_activation_demand_by_hand(a100):
    # per token: (2 x 4,096 hidden + 3 x 14,336 intermediate) x 2 B = 102,400 B; per sequence its
    # logits, 128,256 vocab x (2 B + 4 B) = 769,536 B
    assert a100.activation_bytes(2048, 1) == 2048 * 102_400 + 769_536 == 210_484_736
    assert a100.activation_bytes(256, 256) == 256 * (102_400 + 769_536) == 223_215_616
    # vLLM's profiling shape, 8,192 tokens over 256 sequences: 0.96 GiB against the 1.26 GiB measured
    assert a100.activation_bytes(8192, 256) / (1 << 30) == pytest.approx(0.9647, abs=1e-4)
    # tp 2: each device its shard (intermediate 7,168, vocab 64,128), the group twice that
    tp2 = serving("a100-80gb-sxm", "Llama-3-8B", tp=2).cost
    assert tp2.activation_bytes(2048, 1) == 2 * (2048 * (2 * 4096 + 3 * 7168) * 2 + 64_128 * 6) == 244_039_168


def test_lora_adapter_bytes_by_hand():
    m = load_model("Llama-3-8B")
    # q and o: 4,096 x (4,096 + 4,096); k and v: 4,096 + 1,024 each; 32 layers; 2 B
    assert m.lora_bytes_per_rank == 32 * ((4096 + 4096) * 2 + (4096 + 1024) * 2) * 2 == 1_703_936
    assert 16 * m.lora_bytes_per_rank == 26 * MiB


def _replay(cost, policy, pool_bytes, config, w, fast_forward=True, budget=2048):
    alloc = make_allocator(policy, pool_bytes, TOKEN_BYTES, {"max_model_len_tokens": 4096, **config},
                           deployment=deployment_of(cost))
    settings = SchedulerSettings(fast_forward=fast_forward, max_num_batched_tokens=budget)
    return Replay(w, alloc, cost, 4096, settings).run(), alloc


def _same_time(n, prompt, output, adapters=None):
    return Workload([f"r{i}" for i in range(n)], np.zeros(n, dtype=np.int64), np.full(n, prompt, dtype=np.int64),
                    np.full(n, output, dtype=np.int64), adapters=adapters)


def test_inflation_and_lazy_deflation_by_hand(a100):
    """A 64-block KV pool (128 MiB) and the activation memory of vLLM's profiling shape at a
    2,048-token budget: 2,048 x 102,400 + 256 x 769,536 = 406,716,416 B. Ten requests of 1,008
    prompt tokens (64 blocks with their first token) arrive together.
    - paged: one request at a time (64 blocks is the whole pool);
    - ellm, prefill 1: two prompts (2,016 tokens) leave (540,934,144 - 207,977,472) // 2 MiB = 158
      blocks for KV: both admitted (128 blocks, 64 of them borrowed: inflation);
    - ellm, prefill 2 (the budget stopped the first): one more prompt leaves 208 blocks, 129 - 49 =
      80 free under the limit: admitted; a fourth (2,016 tokens, limit 158) would need 64 more of
      -34 (deflation is lazy: the borrowed KV stays, the prefill admits what its activations
      leave room for);
    - three run at once, holding 192 blocks: 128 borrowed, 256 MiB.
    """
    w = _same_time(10, 1008, 16)
    pool = 64 * BLOCK_BYTES
    borrow = 2048 * 102_400 + 256 * 769_536
    assert borrow == 406_716_416
    paged, _ = _replay(a100, "paged", pool, {}, w)
    assert paged.metrics["peak_concurrency"] == 1
    for ff in (True, False):
        r, alloc = _replay(a100, "ellm", pool, {"ellm_borrow_bytes": borrow}, w, fast_forward=ff)
        assert alloc.num_blocks == (pool + borrow) // BLOCK_BYTES == 257
        assert r.metrics["peak_concurrency"] == 3
        assert r.metrics["peak_borrowed_bytes"] == (192 - 64) * BLOCK_BYTES
        assert r.metrics["completed"] == 10 and r.metrics["preemptions"] == 0
        assert r.metrics["tps"] > paged.metrics["tps"]


def _slow_link(device_name: str, bytes_per_s: float):
    from dataclasses import replace
    return replace(load_device(device_name), host_link=HostLink("test link", bytes_per_s))


def test_offload_and_fetch_charged_at_the_host_link_by_hand():
    """No borrowing, a 64-block pool and a 1 GB/s host link. r0 (1,008 prompt tokens) takes the
    pool; r1 does not fit, its activations do: prefilled with r0, its 1,009 KV tokens (132,251,648 B)
    written to the host buffer as the prefill runs (hidden: the prefill is longer than the 132 ms
    transfer? no: the link is the bottleneck by the difference); fetched once r0 is done, beside
    its first decode step."""
    device = _slow_link("a100-80gb-sxm", 1e9)
    cost = CostModel(device, load_model("Llama-3-8B"))
    w = _same_time(2, 1008, 4)
    kv = 1009 * TOKEN_BYTES
    assert kv == 132_251_648
    link = to_ps(kv / 1e9)
    prefill = PrefillClock(cost.prefill).ps(2016, 2 * 1008 * 1008, 2)
    step = cost.step_coefficients(KvLayout.contiguous()).step_ps([1009])
    results = []
    for ff in (True, False):
        r, alloc = _replay(cost, "ellm", 64 * BLOCK_BYTES, {"ellm_borrow_bytes": 0, "ellm_host_buffer_bytes": 1 << 30},
                           w, fast_forward=ff)
        c = alloc.policy_counters()
        assert (c["offloads"], c["fetches"], c["offloaded_bytes"], c["fetched_bytes"]) == (1, 1, kv, kv)
        results.append(r)
    fast, slow = results
    assert fast.metrics == slow.metrics
    assert fast.metrics["completed"] == 2 and fast.metrics["preemptions"] == 0
    m = fast.metrics
    assert m["host_link_bytes"] == 2 * kv
    assert m["host_link_time_s"] == 2 * link / PS
    assert m["link_bottleneck_s"] == (max(0, link - prefill) + max(0, link - step)) / PS > 0


def test_unified_without_adapter_bytes_refuses_to_acquire_an_adapter():
    """With adapter_bytes 0 an adapter is no pages: acquiring one looked for an empty free range
    forever (the replay never calls it then: its adapter cache is None). Now it is refused."""
    from odmactl.core.errors import AllocationError

    alloc = make_allocator("unified", 640, 8, {"max_model_len_tokens": 64, "block_size_tokens": 4})
    with pytest.raises(AllocationError, match="adapter_bytes is 0"):
        alloc.acquire_adapter("a")
    assert alloc.adapter_loads == 0 and alloc.adapter_hits == 0 and not alloc._adapters
    alloc.check_invariants()


def test_unified_best_fit_ranges_and_an_eviction_under_hysteresis():
    """20 pages of 4 tokens (8 B a token: 32 B a page); an adapter of 64 B is 2 pages."""
    alloc = make_allocator("unified", 640, 8, {"max_model_len_tokens": 64, "block_size_tokens": 4, "adapter_bytes": 64})
    r0 = alloc.reserve("r0", 7)  # 8 tokens with the first output: 2 pages, best fit in [0, 20)
    r1 = alloc.reserve("r1", 11)  # 3 pages
    assert {r: alloc.page_ranges(r) for r in ("r0", "r1")} == {"r0": [0, 2], "r1": [2, 3]}
    alloc.release(r0)
    r2 = alloc.reserve("r2", 3)  # 1 page: the smallest free range that holds it is [0, 2)
    assert alloc.page_ranges("r2") == [0, 1] and r2.offset_bytes == 0
    assert alloc.acquire_adapter("a")  # 2 pages: [1, 2) is too small, so [5, 7); loaded from the host
    handle, refcount = alloc._adapters["a"]
    assert alloc._runs.tolist(handle) == [5, 2] and refcount == 1 and alloc.host_bytes == 64
    alloc.release_adapter("a")  # unpinned: evictable
    assert alloc.extend(r1, 13)  # page 5 is the adapter's: a new range, the 1-page hole at 1
    assert alloc.page_ranges("r1") == [2, 3, 1, 1] and alloc.runs_of(r1, 13) == 2 and alloc.kv_runs == 3
    alloc.check_invariants()
    # 12 pages best fit in [7, 20): 19 of 20 pages used, past the 90% watermark: unpinned adapters
    # go, least recent first, until 80% (16) or none is left: the adapter (17 used)
    r3 = alloc.reserve("r3", 47)
    assert alloc.page_ranges("r3") == [7, 12]
    assert alloc.evictions == 1 and "a" not in alloc._adapters and alloc.used_pages == 17
    assert alloc.free_extents() == [(5 * 32, 2 * 32), (19 * 32, 32)]
    alloc.check_invariants()
    # in-place growth: r3's next page (19) is free, so no new run
    assert alloc.extend(r3, 50) and alloc.page_ranges("r3") == [7, 13] and alloc.kv_runs == 4
    # the adapter again: a miss, loaded again (host bytes twice)
    assert alloc.acquire_adapter("a") and alloc.adapter_loads == 2 and alloc.host_bytes == 128
    assert not alloc.acquire_adapter("b")  # 2 pages, none free and nothing unpinned: refused
    for a in (r1, r2, r3):
        alloc.release(a)
    alloc.release_adapter("a")
    alloc.check_invariants()
    assert alloc.stats().policy_counters["kv_runs_released"] == 1 + 2 + 1 + 1  # r0, r1, r2, r3


def test_unified_first_fit_takes_the_lowest_range():
    alloc = make_allocator("unified", 640, 8, {"max_model_len_tokens": 64, "block_size_tokens": 4,
                                               "unified_fit": "first"})
    a = alloc.reserve("a", 7)  # [0, 2)
    alloc.reserve("b", 3)  # [2, 3)
    alloc.reserve("c", 15)  # [3, 7)
    alloc.release(a)
    alloc.release(alloc._live["c"])  # free: [0, 2), [3, 20)
    d = alloc.reserve("d", 3)  # 1 page: first fit [0, 1) (best fit would take it there too)
    e = alloc.reserve("e", 11)  # 3 pages: first fit is [3, 6), not the 1-page hole
    assert alloc.page_ranges("d") == [0, 1] and alloc.page_ranges("e") == [3, 3]
    for x in (d, e, alloc._live["b"]):
        alloc.release(x)
    alloc.check_invariants()


def test_unified_has_fewer_runs_than_paged_and_loads_adapters_in_a_replay(a100):
    """Eight requests of 1,000 prompt and 100 output tokens, four tenants, one adapter each."""
    w = _same_time(8, 1000, 100, adapters=np.array([0, 1, 2, 3, 0, 1, 2, 3], dtype=np.int64))
    cfg = {"adapter_bytes": 26 * MiB}
    fast, alloc = _replay(a100, "unified", 2048 * BLOCK_BYTES, cfg, w)
    slow, _ = _replay(a100, "unified", 2048 * BLOCK_BYTES, cfg, w, fast_forward=False)
    assert fast.metrics == slow.metrics
    c = fast.allocator["policy_counters"]
    assert c["adapter_loads"] == 4 and c["adapter_hits"] == 4 and fast.metrics["host_link_bytes"] == 4 * 26 * MiB
    # every request starts as one range and grows in place while its neighbour's pages are taken
    assert fast.metrics["kv_runs_per_request"] < 1100 / 16
    paged, _ = _replay(a100, "paged", 2048 * BLOCK_BYTES, {}, w)
    assert paged.metrics["kv_runs_per_request"] == -(-1100 // 16)


def test_a_device_without_a_host_link_refuses_offload(cli, conv_sample_head, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[allocator]\nellm_host_buffer_bytes = 1000000000\n")
    r = cli("replay", conv_sample_head(20), "--device", "cpu-xeon-2vcpu", "--model", "Llama-3-8B", "--policy", "ellm",
            "--predictor", "none", "--config", config, "--kv-pool", "1GiB")
    assert r.code == 1 and "no [host_link]" in r.err and "Traceback" not in r.err, r.err
    config.write_text("[allocator]\nellm_host_buffer_bytes = -1\n")
    r = cli("replay", conv_sample_head(20), "--device", "a100-80gb-sxm", "--model", "Llama-3-8B", "--policy", "ellm",
            "--predictor", "none", "--config", config)
    assert r.code == 1 and "ellm_host_buffer_bytes" in r.err, r.err


def test_unified_grows_by_its_step_in_place_or_by_a_new_range():
    """Half the pages held a step (unified_growth_fraction = 0.5): 8 pages grow by 4 in place; when
    the pages after are taken, the next step is a new range; when the step cannot be had, only what
    is needed."""
    alloc = make_allocator("unified", 640, 8, {"max_model_len_tokens": 80, "block_size_tokens": 4,
                                               "unified_growth_fraction": 0.5})
    a = alloc.reserve("a", 31)  # 8 pages [0, 8)
    assert alloc.extend(a, 33) and alloc.page_ranges("a") == [0, 12]  # needs 1, takes the step of 4, in place
    b = alloc.reserve("b", 3)  # [12, 13)
    assert alloc.extend(a, 49) and alloc.page_ranges("a") == [0, 12, 13, 6]  # 6 = 12 / 2, a new range after b
    assert alloc.kv_runs == 3
    c = alloc.reserve("c", 1)  # [19, 20): the pool is full
    alloc.release(b)  # page 12 free
    assert alloc.extend(a, 73) and alloc.page_ranges("a") == [0, 12, 13, 6, 12, 1]  # the step (9) cannot be had: 1 page
    alloc.release(c)
    alloc.release(a)
    alloc.check_invariants()


@pytest.mark.parametrize("fit,total,grown", [("best", 13, [0, 4]), ("first", 9, [0, 3])])
def test_unified_grows_in_place_into_an_adapter_evicted_for_the_larger_step(fit, total, grown):
    """The step (8 pages) is not free, so the unpinned adapter right after the request's range is
    evicted for it and the step still fails; what is needed then fits right after the range,
    where the adapter was: the range grows in place, no second range (a review's case)."""
    alloc = make_allocator("unified", 640, 8, {"max_model_len_tokens": 64, "block_size_tokens": 4, "adapter_bytes": 64,
                                               "unified_growth_fraction": 4, "unified_fit": fit})
    r1 = alloc.reserve("r1", 7)  # [0, 2)
    assert alloc.acquire_adapter("a")  # [2, 4)
    alloc.reserve("r2", 59)  # [4, 19): page 19 free
    alloc.release_adapter("a")  # unpinned, evictable
    assert alloc.extend(r1, total)
    assert alloc.page_ranges("r1") == grown and alloc.kv_runs == 2 and alloc.evictions == 1
    alloc.check_invariants()


@pytest.mark.parametrize("key,value,expected", [
    ("ellm_host_buffer_bytes", -1, "whole number"), ("ellm_host_buffer_bytes", 1.5, "whole number"),
    ("ellm_borrow_bytes", "lots", "whole number"), ("ellm_ttft_slo_s", 0, "above 0"),
    ("ellm_tpot_slo_s", float("nan"), "finite"), ("ellm_buffer_alpha", 1, "above 1"),
    ("unified_fit", "worst", "best, first"), ("unified_growth_fraction", -0.1, "from 0"),
    ("unified_growth_fraction", float("inf"), "finite"), ("unified_high_watermark", 1.5, "<= 1"),
    ("unified_low_watermark", 0, "0 <"), ("lora_rank", 0, "whole number"), ("adapter_bytes", True, "whole number"),
    ("unified_hot_adapters", 0, "whole number"), ("ellm_ttft_slo_s", 1.0, "ellm_host_buffer_bytes is 0"),
])
def test_new_settings_are_checked_where_they_enter(key, value, expected):
    from odmactl.allocator import AllocatorConfig
    from odmactl.core.errors import ConfigError

    with pytest.raises(ConfigError, match=expected) as info:
        AllocatorConfig.from_mapping({key: value}, source="c.toml", prefix="allocator")
    assert key in str(info.value) or key in (info.value.key or "")


def test_watermarks_out_of_order_are_refused():
    from odmactl.allocator import AllocatorConfig
    from odmactl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unified_low_watermark <= unified_high_watermark"):
        AllocatorConfig.from_mapping({"unified_low_watermark": 0.9, "unified_high_watermark": 0.8})


def test_plan_baselines_are_checked(cli, conv_sample_head, tmp_path):
    for bad, message in (("odma", "not a baseline"), ("static", "not a baseline"), ("paged,paged", "twice"),
                         ("nope", "not a baseline")):
        r = cli("plan", conv_sample_head(300), "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B",
                "--baselines", bad, "--out", tmp_path / "c.toml")
        assert r.code == 1 and message in r.err and "Traceback" not in r.err, (bad, r.err)
        assert not (tmp_path / "c.toml").exists()


def test_a_broken_host_link_names_the_file_and_key(tmp_path):
    from odmactl.core.errors import ProfileError
    from odmactl.hw.profiles import profiles_dir, read_device

    text = (profiles_dir() / "devices" / "a100-80gb-sxm.toml").read_text()
    for old, new, key in (('value = "31.5 GB/s"', 'value = "0 GB/s"', "host_link.bandwidth"),
                          ('value = "31.5 GB/s"', 'value = "5 TB/s"', "host_link.bandwidth"),
                          ('value = "31.5 GB/s"', 'value = "31.5 GB"', "host_link.bandwidth"),
                          ('value = "31.5 GB/s"', 'value = "1 B/s"', "host_link.bandwidth")):
        path = tmp_path / "d.toml"
        path.write_text(text.replace(old, new))
        with pytest.raises(ProfileError, match=key.replace(".", r"\.")):
            read_device(path)
    path.write_text(text.replace("[host_link]\n", "[host_link]\nlanes = 16\n"))
    with pytest.raises(ProfileError, match="lanes"):
        read_device(path)


def test_the_hot_tier_evicts_one_adapter_at_a_time_and_an_undone_acquire_is_no_hit():
    alloc = make_allocator("unified", 640, 8, {"max_model_len_tokens": 64, "block_size_tokens": 4, "adapter_bytes": 32,
                                               "unified_hot_adapters": 3})
    for key in "abc":
        assert alloc.acquire_adapter(key)
        alloc.release_adapter(key)
    assert alloc.acquire_adapter("d")  # the tier holds 3: the least recently used (a) goes, b and c stay
    assert alloc.evictions == 1 and set(alloc._adapters) == {"b", "c", "d"}
    assert alloc.acquire_adapter("b") and alloc.adapter_hits == 1
    alloc.release_adapter("b", admitted=False)  # its request was not admitted after all: not a hit
    assert alloc.adapter_hits == 0
    alloc.release_adapter("d")
    alloc.check_invariants()


def test_ellm_cannot_borrow_more_than_the_profile_keeps_aside(cli, conv_sample_head, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[allocator]\nellm_borrow_bytes = 999999999999999\n")
    r = cli("replay", conv_sample_head(20), "--device", "mlu370-x4", "--model", "Llama-3-8B", "--policy", "ellm",
            "--predictor", "none", "--config", config)
    assert r.code == 1 and "ellm_borrow_bytes" in r.err and "activation_reserve" in r.err, r.err


def test_a_request_and_its_adapter_that_cannot_fit_together_are_refused_up_front(cli, tmp_path):
    """A red-team case: max_model_len fills the pool, so a long request with its tenant's adapter
    could never run; it used to be admitted, preempted and rejected mid-run."""
    csv = tmp_path / "long.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens,tenant\n0,1000,3000,a\n1,1000,100,a\n2,200,100, \n")
    trace = tmp_path / "long.parquet"
    assert cli("ingest", csv, "--out", trace).code == 0
    r = cli("replay", trace, "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B", "--predictor", "oracle",
            "--policy", "unified", "--kv-pool", "200MiB", "--max-model-len", "3648")
    assert r.code == 1 and "could never run" in r.err and "Traceback" not in r.err, r.err
    r = cli("replay", trace, "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B", "--predictor", "oracle",
            "--policy", "unified", "--kv-pool", "200MiB", "--max-model-len", "3000", "--json")
    assert r.code == 0, r.err
    import json

    m = json.loads(r.out)["results"]["unified"]
    assert m["metrics"]["completed"] + m["metrics"]["rejections"] == 3 and m["metrics"]["pool_occupancy"] <= 1
    assert m["allocator"]["policy_counters"]["adapter_loads"] == 1  # the blank tenant runs without an adapter


def test_blank_tenants_run_without_adapters():
    import polars as pl

    from odmactl.run.workload import tenant_adapters

    assert tenant_adapters(pl.DataFrame({"tenant": pl.Series(["", " ", None], dtype=pl.String)})) is None
    assert tenant_adapters(pl.DataFrame({"tenant": ["a", "", "b", "a"]})).tolist() == [0, -1, 1, 0]


def test_a_host_buffer_below_one_chunk_and_empty_baselines_are_refused(cli, conv_sample_head, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[allocator]\nellm_host_buffer_bytes = 1\n")
    r = cli("replay", conv_sample_head(20), "--device", "mlu370-x4", "--model", "Llama-3-8B", "--policy", "ellm",
            "--predictor", "none", "--config", config)
    assert r.code == 1 and "ellm_host_buffer_bytes" in r.err and "chunk" in r.err, r.err
    for empty in ("", ","):
        r = cli("plan", conv_sample_head(300), "--device", "mlu370-x4", "--model", "Llama-3-8B", "--baselines", empty,
                "--out", tmp_path / "p.toml")
        assert r.code == 1 and "names no policy" in r.err, r.err


def test_unified_reads_the_ranges_of_a_live_allocation_only():
    """A released or another allocator's Allocation is refused before its chain handle is used (the
    handles index the compiled buffer unchecked)."""
    alloc = make_allocator("unified", 640, 8, {"max_model_len_tokens": 64, "block_size_tokens": 4})
    other = make_allocator("unified", 64_000, 8, {"max_model_len_tokens": 64, "block_size_tokens": 4})
    foreign = [other.reserve(f"f{i}", 3) for i in range(40)][-1]
    a = alloc.reserve("a", 3)
    assert alloc.runs_of(a, 4) == 1
    alloc.release(a)
    with pytest.raises(AllocationError, match="already released"):
        alloc.runs_of(a, 4)
    with pytest.raises(AllocationError, match="not made by this allocator"):
        alloc.runs_of(foreign, 4)
