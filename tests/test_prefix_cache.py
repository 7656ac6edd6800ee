"""vLLM's automatic prefix caching for `paged` (allocator/prefix.py): the trace's prefix hashes kept
at ingest, the cache's hits against an independent count, a hand-computed hit and its prefill cost,
LRU eviction tail first, fast-forward equal to stepping under eviction and preemption, contiguous
policies sharing nothing, and the settings plan writes."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from odmactl.allocator import make_allocator
from odmactl.allocator.prefix import PrefixCache
from odmactl.hw.cost import CostModel, to_ps
from odmactl.hw.profiles import load_device, load_model
from odmactl.plan.engine import vllm_settings
from odmactl.run.replay import deployment_of
from odmactl.run.serving import serving
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.workload import PS, Workload
from odmactl.trace.prefix import PrefixKeys, prefix_keys
from odmactl.trace.schema import read_trace

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "mooncake_conversation_sample.jsonl.gz"
MODEL = "DeepSeek-R1-Distill-Qwen-7B"  # 131,072 positions: Mooncake's prompts reach 126k tokens
_spec = importlib.util.spec_from_file_location("mooncake_lru", ROOT / "examples" / "mooncake_lru.py")
LRU = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(LRU)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()]


def _independent_hits(rows: list[dict]) -> tuple[int, int]:
    """(tokens hit, prompt tokens) with an unbounded cache, counted from hash_ids alone, without
    odmactl (examples/mooncake_lru.py): a prompt's leading full 512-token blocks that an earlier
    prompt's full blocks hold, up to its last token less one."""
    return LRU.lru_hits(rows, math.inf)


def _workload(rows: list[dict], rate_scale: float = 1.0) -> Workload:
    n = len(rows)
    lengths = np.array([len(r["hash_ids"]) for r in rows], dtype=np.int64)
    keys = PrefixKeys(np.array([h for r in rows for h in r["hash_ids"]], dtype=np.int64),
                      np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), 512)
    arrival = np.array([r["timestamp"] for r in rows], dtype=np.float64) / 1000 / rate_scale
    return Workload([f"r{i}" for i in range(n)], np.round(arrival * PS).astype(np.int64),
                    np.array([r["input_length"] for r in rows], dtype=np.int64),
                    np.array([r["output_length"] for r in rows], dtype=np.int64), prefix=keys)


def _run(w: Workload, pool_tokens: int, settings: SchedulerSettings, policy: str = "paged", bpt: int | None = None,
         device: str = "h100-sxm", max_len: int = 131_072):
    cost = CostModel(load_device(device), load_model(MODEL))
    bpt = bpt or cost.model.kv_bytes_per_token
    alloc = make_allocator(policy, pool_tokens * bpt, bpt, {"max_model_len_tokens": max_len},
                           deployment=deployment_of(cost))
    replay = Replay(w, alloc, cost, max_len, settings)
    result = replay.run()
    return replay, alloc, result


@pytest.mark.parametrize("engine", ["vllm-v0", "vllm-v1"])
def test_unbounded_cache_hits_what_the_hashes_count(engine):
    """Mooncake conversation (the shipped 3,000-request sample): with a pool no eviction touches,
    the replay's hits are exactly the count from hash_ids."""
    rows = _rows(SAMPLE)
    hit, total = _independent_hits(rows)
    settings = SchedulerSettings(engine=engine, max_num_seqs=256, max_num_batched_tokens=131_072, prefix_caching=True)
    # 1 byte a token: a pool of 64M tokens holds every distinct block and the live requests
    replay, alloc, result = _run(_workload(rows), 64 << 20, settings, bpt=1)
    m = result.metrics
    assert m["prefix_evictions"] == 0 and m["preemptions"] == 0 and m["rejections"] == 0
    assert m["prefill_tokens_saved"] == hit and m["prefix_hit_rate"] == hit / total
    assert hit / total == pytest.approx(0.320, abs=0.001)  # the sample's reuse: 32.0% of its prompt tokens
    alloc.check_invariants()  # everything given back: the free queue and the cached units tile the pool
    assert alloc.reserved_bytes == 0 and alloc.free_blocks == alloc.num_blocks


def test_unbounded_cache_on_the_whole_conversation_trace(shared_traces):
    rows = _rows(shared_traces / "mooncake_conversation_trace.jsonl.gz")
    hit, total = _independent_hits(rows)
    settings = SchedulerSettings(engine="vllm-v1", max_num_seqs=256, max_num_batched_tokens=8192)
    _, _, result = _run(_workload(rows), 160 << 20, settings, bpt=1)
    assert result.metrics["prefix_evictions"] == 0 and result.metrics["rejections"] == 0
    assert result.metrics["prefill_tokens_saved"] == hit
    assert result.metrics["prefix_hit_rate"] == pytest.approx(0.373, abs=0.001)


def test_stats_counts_the_same_reuse(cli, tmp_path):
    out = tmp_path / "mc.parquet"
    assert cli("ingest", SAMPLE, "--out", out).code == 0
    r = cli("stats", out, "--json")
    assert r.code == 0, r.err
    reuse = json.loads(r.out)["prefix_reuse"]
    hit, total = _independent_hits(_rows(SAMPLE))
    assert (reuse["reused_tokens"], reuse["prompt_tokens"], reuse["hash_block_tokens"]) == (hit, total, 512)
    assert "prefix reuse" in cli("stats", out).out
    # two sources number their hashes apart: the same file twice reuses nothing across the copies
    copy = tmp_path / "copy.jsonl.gz"
    copy.write_bytes(SAMPLE.read_bytes())
    both = tmp_path / "both.parquet"
    assert cli("ingest", SAMPLE, copy, "--out", both).code == 0
    twice = json.loads(cli("stats", both, "--json").out)["prefix_reuse"]
    assert (twice["reused_tokens"], twice["prompt_tokens"]) == (2 * hit, 2 * total)


@pytest.mark.parametrize("engine", ["vllm-v0", "vllm-v1"])
@pytest.mark.parametrize("ff", [True, False])
def test_a_hit_skips_the_cached_prefix_and_its_prefill_costs_the_rest(engine, ff):
    """r0: 1,100 tokens, hashes [1, 2, 3] (its two full 512-token blocks cached). r1 arrives after
    r0 is done with hashes [1, 2, 7]: it hits 1,024 tokens, and its prefill computes 76 tokens that
    attend to all 1,100: the cost model's prefill of 76 tokens with 1,100^2 - 1,024^2 squared
    tokens. r2 arrives while r1 decodes and hits r1's... r0's units again (held by no one, then by r1)."""
    w = Workload(["r0", "r1", "r2"], np.array([0, 10 * PS, 10 * PS + 1], dtype=np.int64),
                 np.array([1100, 1100, 600], dtype=np.int64), np.array([2, 50, 2], dtype=np.int64),
                 prefix=PrefixKeys(np.array([1, 2, 3, 1, 2, 7, 1, 9], dtype=np.int64),
                                   np.array([0, 3, 6, 8], dtype=np.int64), 512))
    cost = CostModel(load_device("h100-sxm"), load_model(MODEL))
    settings = SchedulerSettings(engine=engine, max_num_seqs=256, max_num_batched_tokens=8192, fast_forward=ff,
                                 prefix_caching=True)
    replay, alloc, result = _run(w, 100_000, settings)
    b = replay.batch.timeline()
    expected = to_ps(cost.prefill.seconds(1100 - 1024, 1100 ** 2 - 1024 ** 2, 1))
    assert b.first_ps[1] - b.arrival_ps[1] == expected
    m = result.metrics
    assert m["prefill_tokens_saved"] == 1024 + 512  # r1: blocks 1 and 2; r2: block 1 (its prompt holds one full block)
    assert m["prefix_hit_rate"] == (1024 + 512) / (1100 + 1100 + 600)
    alloc.check_invariants()
    assert alloc.reserved_bytes == 0


def test_free_units_are_evicted_least_recently_freed_first_a_request_tail_first():
    """Blocks of 16 tokens, units of 32 (two blocks), a pool of 16 blocks. A and B each cache two
    units and free them: the free order is A's tail unit, A's head, B's tail, B's head. C then
    needs 10 blocks where the queue holds 8: A's tail unit goes, and a later request with A's
    prefix hits only its head."""
    alloc = make_allocator("paged", 16 * 16, 1, {"max_model_len_tokens": 256})
    batch = SimpleNamespace(shared=0)
    cache = PrefixCache(alloc, batch, [[10, 11], [20, 21], [30], [10, 11]], 32, [69, 69, 160, 69])
    for i, rid in enumerate(("A", "B")):
        assert cache.lookup(i, 69) == 0
        cache.admit(i, 69)
        a = alloc.reserve(rid, 69)
        assert len(a.block_ids) == 5
        cache.release(i, a)
        alloc.check_invariants()
    assert list(cache.free) == [11, 10, 21, 20]
    assert alloc.free_blocks == 16 and alloc.free_blocks_uncached == 8 and alloc.reserved_bytes == 0
    assert cache.lookup(2, 160) == 0
    cache.admit(2, 160)
    c = alloc.reserve("C", 160)
    assert c is not None and cache.evictions == 1 and list(cache.free) == [10, 21, 20]
    assert cache.lookup(3, 69) == 32  # unit 10 still cached, 11 evicted
    cache.admit(3, 69)  # unit 10 is referenced now: held, not free
    assert batch.shared == 2 - 2 and cache.shared_blocks == 2 and list(cache.free) == [21, 20]
    d = alloc.reserve("D", 69 - 32)
    alloc.check_invariants()
    cache.release(3, d)
    cache.release(2, c)
    alloc.check_invariants()
    assert alloc.reserved_bytes == 0 and alloc.free_blocks == 16


@pytest.mark.parametrize("engine", ["vllm-v0", "vllm-v1"])
def test_fast_forward_equals_stepping_under_eviction_and_preemption(engine):
    """400 Mooncake requests at 20x their rate into a 200k-token pool: the cache evicts and requests
    are preempted; the closed form and the token-by-token reference agree on every time and count."""
    rows = _rows(SAMPLE)[:400]
    w = _workload(rows, rate_scale=20.0)
    runs = []
    for ff in (True, False):
        settings = SchedulerSettings(engine=engine, max_num_seqs=256, max_num_batched_tokens=131_072 if engine == "vllm-v0"
                                     else 8192, fast_forward=ff, prefix_caching=True)
        replay, alloc, result = _run(w, 200_000, settings)
        alloc.check_invariants()
        runs.append((replay.batch.timeline(), result.metrics, result.allocator))
    (fast, m_fast, a_fast), (step, m_step, a_step) = runs
    assert a_fast["regions"] == a_step["regions"]  # free cached blocks count as free in both
    assert m_fast["prefix_evictions"] > 0 and m_fast["preemptions"] > 0 and m_fast["prefill_tokens_saved"] > 0
    for name in ("start_ps", "first_ps", "done_ps"):
        assert np.array_equal(getattr(fast, name), getattr(step, name)), name
    keys = [k for k in m_fast if k not in ("kv_runs_per_request",)]
    assert {k: m_fast[k] for k in keys} == {k: m_step[k] for k in keys}


def test_contiguous_policies_and_traces_without_hashes_cache_nothing():
    rows = _rows(SAMPLE)[:300]
    w = _workload(rows, rate_scale=5.0)
    bare = Workload(w.request_ids, w.arrival_ps, w.prompt_tokens, w.output_tokens)
    on = SchedulerSettings(engine="vllm-v1", max_num_batched_tokens=8192, prefix_caching=True)
    off = SchedulerSettings(engine="vllm-v1", max_num_batched_tokens=8192, prefix_caching=False)
    for policy in ("odma", "static", "s3"):
        if policy == "odma":
            continue  # odma sizes from predictions: covered by the CLI test below
        _, _, a = _run(w, 400_000, on, policy)
        _, _, b = _run(w, 400_000, off, policy)
        assert "prefix_hit_rate" not in a.metrics and a.metrics == b.metrics
    _, _, a = _run(bare, 400_000, on)
    _, _, b = _run(bare, 400_000, off)
    assert "prefix_hit_rate" not in a.metrics and a.metrics == b.metrics
    _, _, cached = _run(w, 400_000, on)
    assert cached.metrics["prefix_hit_rate"] > 0 and cached.metrics["ttft_p99"] < b.metrics["ttft_p99"]


def test_replay_cli_says_whether_it_cached(cli, tmp_path):
    trace = tmp_path / "mc.parquet"
    assert cli("ingest", SAMPLE, "--out", trace).code == 0
    base = ["replay", trace, "--device", "h100-sxm", "--model", MODEL, "--compare", "paged,odma",
            "--predictor", "oracle", "--limit", "300", "--json"]
    docs = {}
    for flag in ("--prefix-caching", "--no-prefix-caching"):
        r = cli(*base, flag)
        assert r.code == 0, r.err
        docs[flag] = json.loads(r.out)
    on, off = docs["--prefix-caching"], docs["--no-prefix-caching"]
    assert on["scheduler"]["prefix_caching"] is True and off["scheduler"]["prefix_caching"] is False
    assert on["results"]["paged"]["metrics"]["prefix_hit_rate"] > 0
    assert "prefix_hit_rate" not in off["results"]["paged"]["metrics"]
    assert on["results"]["odma"]["metrics"] == off["results"]["odma"]["metrics"]  # one block a request: no sharing
    text = cli(*base[:-1], "--engine", "vllm-v1").out
    assert "prefix caching on" in text and "prefix hits" in text


def test_vllm_settings_write_prefix_caching_as_replayed():
    setup = serving("h100-sxm", "llama-3-8b")
    on = vllm_settings(setup, "fp16", 8192, 256, 8192, 16, "vllm-v1", True)
    assert on["enable_prefix_caching"] and on["serve_args"].endswith("--enable-chunked-prefill --enable-prefix-caching")
    v0 = vllm_settings(setup, "fp16", 8192, 256, 8192, 16, "vllm-v0", True)
    assert v0["serve_args"].endswith("--enable-chunked-prefill False --enable-prefix-caching")
    assert SchedulerSettings(engine="vllm-v1").caches_prefixes and not SchedulerSettings(engine="vllm-v0").caches_prefixes


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("line, where", [
    ('{"timestamp": 5, "input_length": 100, "output_length": 5, "hash_ids": ["a", "b"]}', "hash_ids"),
    ('{"timestamp": 5, "input_length": 100, "output_length": 5, "hash_ids": [1, 2, 3]}', "row 2"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [1, null]}', "row 2"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [9223372036854775809]}', "row 2"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [-9223372036854775809]}', "64-bit"),
])
def test_bad_prefix_hashes_are_refused_naming_where(cli, tmp_path, line, where):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'
    src = _write_jsonl(tmp_path / "m.jsonl", [good, line])
    r = cli("ingest", src, "--format", "mooncake", "--out", tmp_path / "o.parquet")
    assert r.code == 1 and where in r.err and "Traceback" not in r.err, r.err
    assert not (tmp_path / "o.parquet").exists()


def test_a_canonical_trace_with_wrongly_typed_hashes_is_refused(cli, tmp_path):
    frame = read_trace_sample(cli, tmp_path)
    bad = tmp_path / "bad.parquet"
    frame.with_columns(pl.col("prefix_block_tokens").cast(pl.Float64)).write_parquet(bad)
    r = cli("stats", bad)
    assert r.code == 1 and "prefix_block_tokens" in r.err
    half = tmp_path / "half.parquet"
    frame.drop("prefix_block_tokens").write_parquet(half)
    r = cli("stats", half)
    assert r.code == 1 and "prefix_block_tokens" in r.err
    assert prefix_keys(frame.drop("prefix_hashes", "prefix_block_tokens")) is None


def read_trace_sample(cli, tmp_path: Path) -> pl.DataFrame:
    out = tmp_path / "mc.parquet"
    assert cli("ingest", SAMPLE, "--out", out).code == 0
    return read_trace(out)


def test_hashes_that_first_appear_late_are_kept(cli, tmp_path):
    """Past the 10,000 lines a reader's type inference usually reads: [] or no field at first."""
    lines = ['{"timestamp": %d, "input_length": 600, "output_length": 5, "hash_ids": []}' % i for i in range(10_001)]
    lines.append('{"timestamp": 10001, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}')
    src = _write_jsonl(tmp_path / "late.jsonl", lines)
    out = tmp_path / "late.parquet"
    r = cli("ingest", src, "--format", "mooncake", "--out", out)
    assert r.code == 0, r.err
    assert read_trace(out)["prefix_hashes"].to_list()[-1] == [1, 2]
    absent = _write_jsonl(tmp_path / "absent.jsonl", [line.replace(', "hash_ids": []', "") for line in lines])
    r = cli("ingest", absent, "--format", "mooncake", "--out", tmp_path / "absent.parquet")
    assert r.code == 0, r.err
    assert read_trace(tmp_path / "absent.parquet")["prefix_hashes"].to_list()[-1] == [1, 2]


def test_a_canonical_trace_ingested_again_keeps_its_hashes_and_one_block_size(cli, tmp_path):
    frame = read_trace_sample(cli, tmp_path)
    again = tmp_path / "again.parquet"
    r = cli("ingest", tmp_path / "mc.parquet", "--out", again)
    assert r.code == 0, r.err
    assert read_trace(again)["prefix_hashes"].to_list() == frame["prefix_hashes"].to_list()
    mixed = tmp_path / "mixed.parquet"
    frame.with_columns(pl.when(pl.col("request_id") == "7").then(256).otherwise(512).cast(pl.Int32)
                       .alias("prefix_block_tokens")).write_parquet(mixed)
    r = cli("stats", mixed)
    assert r.code == 1 and "mixed.parquet" in r.err and "row 7" in r.err and "one block size" in r.err, r.err


def test_plan_records_the_prefix_caching_flag():
    from odmactl.plan.config import plan_command
    from odmactl.plan.spec import PlanSpec

    spec = PlanSpec(device="h100-sxm", model=MODEL, predictor="oracle", prefix_caching=True, engine="vllm-v0")
    assert plan_command(Path("t.parquet"), spec, Path("c.toml")).endswith("--engine vllm-v0 --prefix-caching")
    off = PlanSpec(device="h100-sxm", model=MODEL, predictor="oracle", prefix_caching=False)
    assert plan_command(Path("t.parquet"), off, Path("c.toml")).endswith("--no-prefix-caching")

