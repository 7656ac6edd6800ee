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
        assert r.code == 1 and "--block-size must be one of 8, 16, 32" in r.err, (command, r.err)
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
