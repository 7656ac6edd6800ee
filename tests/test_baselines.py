"""Baselines as their papers define them (issue 29): the paged policy's block size on every replaying
command (--block-size), and static as the ODMA papers' Cambricon-vLLM pre-allocation, prompt +
max_new_tokens (--max-new-tokens, vLLM's max_tokens), which plan and capacity compare against
beside static at max_model_len."""

from __future__ import annotations

import json

import numpy as np
import pytest

from odmactl.run.serving import default_max_new_tokens
from odmactl.sim.workload import Workload

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


@pytest.fixture(scope="module")
def trace(conv_sample_head):
    return conv_sample_head(400)


def _replay(cli, trace, *args):
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--json", *args)
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_block_size_sets_the_paged_block_and_smaller_blocks_read_slower(cli, trace):
    tpot = {}
    for block in (8, 16, 32):
        doc = _replay(cli, trace, "--policy", "paged", "--block-size", str(block), "--offline")
        result = doc["results"]["paged"]
        assert result["config"]["block_size_tokens"] == block
        tpot[block] = result["metrics"]["tpot_p50"]
    assert tpot[8] > tpot[16] > tpot[32]  # more, shorter runs per head
    default = _replay(cli, trace, "--policy", "paged", "--offline")["results"]["paged"]
    assert default["config"]["block_size_tokens"] == 16


@pytest.mark.parametrize("value", ["12", "0", "-16", "64"])
def test_block_size_outside_what_vllm_takes_is_refused(cli, trace, value, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[thresholds]\nmin_utilization = 0.1\n")
    for command in ("replay", "check", "capacity", "plan"):
        extra = {"check": ("--config", config), "capacity": ("--slo", "tpot_p99=500ms"),
                 "plan": ("--out", tmp_path / "o.toml")}.get(command, ())
        r = cli(command, trace, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--block-size", value,
                *extra)
        assert r.code == 1 and "--block-size expects one of 8, 16, 32" in r.err, (command, r.err)
        assert "Traceback" not in r.err


@pytest.mark.parametrize("value,code", [("0", 1), ("-5", 1), ("x", 2), ("1.5", 2)])
def test_max_new_tokens_is_checked(cli, trace, value, code):
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "static", "--max-new-tokens", value)
    assert r.code == code and "--max-new-tokens" in r.err and "Traceback" not in r.err


def test_max_new_tokens_caps_outputs_and_sizes_static(cli, trace):
    """With --max-new-tokens N every request stops after N output tokens (vLLM's max_tokens,
    counted as truncated) and static reserves prompt + N, so no slot outlives its request's need
    by more than N - output tokens."""
    import polars as pl

    frame = pl.read_parquet(trace)
    n = 128
    plain = _replay(cli, trace, "--policy", "static", "--offline")["results"]["static"]
    capped = _replay(cli, trace, "--compare", "static,paged", "--offline", "--max-new-tokens", str(n))
    assert capped["scheduler"]["max_new_tokens"] == n
    static = capped["results"]["static"]
    assert static["config"]["static_slot"] == "prompt_plus_max_new" and static["config"]["max_new_tokens"] == n
    too_long = int((frame["output_tokens"] > n).sum())
    assert too_long > 0
    for r in capped["results"].values():
        assert r["metrics"]["truncated"] >= too_long
    assert static["metrics"]["kv_utilization"] > 2 * plain["metrics"]["kv_utilization"]
    # KV held at the end is at most prompt + N for every request (utilization's denominator)
    prompt, output = frame["prompt_tokens"].to_numpy(), np.minimum(frame["output_tokens"].to_numpy(), n)
    assert static["metrics"]["kv_utilization"] <= float((prompt + output).sum() / (prompt + n).sum()) + 1e-9


def test_default_max_new_tokens_truncates_nothing():
    outputs = np.array([3, 700, 1025, 40])
    w = Workload(request_ids=[str(i) for i in range(4)], arrival_ps=np.zeros(4, dtype=np.int64),
                 prompt_tokens=np.full(4, 10), output_tokens=outputs)
    assert default_max_new_tokens(w, 8192) == 2048
    assert default_max_new_tokens(w, 1500) == 1500  # within max_model_len
    one = Workload(request_ids=["a"], arrival_ps=np.zeros(1, dtype=np.int64), prompt_tokens=np.array([5]),
                   output_tokens=np.array([1]))
    assert default_max_new_tokens(one, 8192) == 1


def test_plan_and_capacity_compare_against_both_static_settings(cli, trace, tmp_path):
    r = cli("plan", trace, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--replays", "2",
            "--out", tmp_path / "c.toml", "--max-new-tokens", "256", "--json")
    assert r.code in (0, 1), r.err
    doc = json.loads(r.out)
    names = set(doc["validation"])
    assert {"static", "static+256", "paged", "s3", "odma"} <= names
    assert doc["validation"]["static+256"]["config"]["static_slot"] == "prompt_plus_max_new"
    assert doc["validation"]["static"]["config"]["static_slot"] == "max_model_len"
    r = cli("capacity", trace, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--policies", "static,paged",
            "--slo", "tpot_p99=500ms", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)["rows"]
    assert [row["policy"] for row in rows] == ["static", "static+1024", "paged"]  # 1,024 holds the longest output
    assert rows[1]["devices_saved_vs_static"] > 0  # against static at max_model_len


def test_the_console_says_which_settings_ran(cli, trace):
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--compare",
            "static,paged,s3", "--block-size", "8", "--max-new-tokens", "128", "--offline")
    assert r.code == 0, r.err
    text = " ".join(r.out.split())
    assert "outputs capped at 128 new tokens" in text and "static reserves prompt + 128 tokens" in text
    assert "paged in 8-token blocks" in text
    assert "truncated at max_model_len or max_new_tokens (128)" in text
    assert "s3_overflow = 'preempt'" in text


def test_a_config_capping_outputs_sizes_static_and_an_uncapped_slot_is_refused(cli, trace, tmp_path):
    capped = tmp_path / "capped.toml"
    capped.write_text("[scheduler]\nmax_new_tokens = 128\n")
    doc = _replay(cli, trace, "--policy", "static", "--offline", "--config", capped)
    assert doc["results"]["static"]["config"]["static_slot"] == "prompt_plus_max_new"
    slot = tmp_path / "slot.toml"
    slot.write_text('[allocator]\nstatic_slot = "prompt_plus_max_new"\nmax_new_tokens = 100\n')
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "static", "--config", slot)
    assert r.code == 1 and "allocator.static_slot" in r.err and "--max-new-tokens" in r.err
    loose = tmp_path / "loose.toml"
    loose.write_text("[allocator]\nmax_new_tokens = 100\n")
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "static", "--config", loose)
    assert r.code == 1 and "allocator.max_new_tokens" in r.err
    top = tmp_path / "top.toml"
    top.write_text('s3_overflow = "migrate"\n')
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "s3", "--predictor", "oracle",
            "--config", top)
    assert r.code == 1 and "a setting outside any table" in r.err


def test_a_pool_too_small_for_max_model_len_in_whole_blocks_is_refused(cli, trace):
    """A 20-token pool holds one 16-token block: max_model_len 20 could never be scheduled paged."""
    r = cli("replay", trace, "--device", "h100-sxm", "--model", "Llama-2-7B", "--policy", "paged",
            "--kv-pool", "10 MiB")
    assert r.code == 1 and "whole 16-token blocks (16 tokens)" in r.err, r.err


def test_plan_records_block_size_and_max_new_tokens(cli, trace, tmp_path):
    import tomllib

    out = tmp_path / "c.toml"
    r = cli("plan", trace, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--replays", "2",
            "--block-size", "32", "--max-new-tokens", "2048", "--out", out)
    assert r.code == 0, r.err
    config = tomllib.loads(out.read_text())
    assert "--block-size 32" in config["plan"]["generated_by"]
    assert "--max-new-tokens 2048" in config["plan"]["generated_by"]
    assert config["allocator"]["block_size_tokens"] == 32 and config["engine"]["vllm"]["block_size"] == 32
    assert config["scheduler"]["max_new_tokens"] == 2048
    doc = _replay(cli, trace, "--policy", "paged", "--config", out, "--offline")
    assert doc["results"]["paged"]["config"]["block_size_tokens"] == 32
    assert "static+2048" in r.out and "the ODMA papers' baseline" in " ".join(r.out.split())  # the legend


def test_capacity_with_a_config_capping_outputs_compares_static_at_that_cap(cli, trace, tmp_path):
    """A config whose [scheduler] caps outputs at N (with or without static's own slot) gives
    capacity's 'static+N' at that N, and the plain static row at max_model_len."""
    for text in ("[scheduler]\nmax_new_tokens = 128\n",
                 '[allocator]\nstatic_slot = "prompt_plus_max_new"\nmax_new_tokens = 128\n[scheduler]\nmax_new_tokens = 128\n'):
        config = tmp_path / "c.toml"
        config.write_text(text)
        r = cli("capacity", trace, "--device", DEVICE, "--model", MODEL, "--config", config, "--policies", "static",
                "--slo", "tpot_p99=500ms", "--json")
        assert r.code == 0, r.err
        doc = json.loads(r.out)
        assert [row["policy"] for row in doc["rows"]] == ["static", "static+128"]
        assert doc["rows"][0]["replayed_as"]["allocator"]["static_slot"] == "max_model_len"
        assert doc["scheduler"]["max_new_tokens"] == 128


def test_fit_on_outputs_of_one_length_writes_a_predictor_that_loads(cli, trace, tmp_path):
    import polars as pl

    same = tmp_path / "same.parquet"
    pl.read_parquet(trace).with_columns(pl.lit(128, dtype=pl.Int32).alias("output_tokens")).write_parquet(same)
    r = cli("fit", same, "--out", tmp_path / "p", "--epochs", "2", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["evaluation"]["kendall_tau"] is None
    r = cli("replay", same, "--device", DEVICE, "--model", MODEL, "--policy", "odma", "--predictor", tmp_path / "p",
            "--offline")
    assert r.code == 0, r.err
