"""`odmactl stats`: figures agree with numpy references; JSON is byte-identical across runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SAMPLES

from odmactl.trace.schema import read_trace


@pytest.fixture
def conv(cli, tmp_path):
    out = tmp_path / "conv.parquet"
    assert cli("ingest", SAMPLES / "azure_conv_2023_sample.csv.gz", "--out", out).code == 0
    return out


def test_stats_match_numpy(cli, conv):
    result = cli("stats", conv, "--json", "--window", "300")
    assert result.code == 0, result.err
    stats = json.loads(result.out)
    frame = read_trace(conv)
    out = frame["output_tokens"].to_numpy()
    prompt = frame["prompt_tokens"].to_numpy()
    arrival = frame["arrival_s"].to_numpy()
    assert stats["requests"] == 4000
    assert stats["duration_s"] == pytest.approx(arrival.max())
    assert stats["arrival_rate_per_s"] == pytest.approx(4000 / arrival.max())
    for key, values in (("output_tokens", out), ("prompt_tokens", prompt)):
        assert stats[key]["mean"] == pytest.approx(values.mean())
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            assert stats[key][name] == pytest.approx(np.quantile(values, q))
        assert stats[key]["max"] == values.max()
    windows = stats["drift"]
    assert sum(w["requests"] for w in windows) == 4000
    first = out[arrival < 300]
    assert windows[0]["requests"] == first.size
    assert windows[0]["output_p90"] == pytest.approx(np.quantile(first, 0.9))


def test_stats_json_is_deterministic(cli, conv):
    a = cli("stats", conv, "--json").out
    b = cli("stats", conv, "--json").out
    assert a == b and a.strip()


def test_stats_table_and_breakdowns(cli, tmp_path):
    src = tmp_path / "g.csv"
    src.write_text("arrival_s,prompt_tokens,output_tokens,model,tenant\n0,5,5,a,x\n1,5,7,a,y\n2,5,9,b,x\n")
    out = tmp_path / "t.parquet"
    assert cli("ingest", src, "--out", out).code == 0
    stats = json.loads(cli("stats", out, "--json").out)
    assert [(m["model"], m["requests"]) for m in stats["by_model"]] == [("a", 2), ("b", 1)]
    assert stats["by_model"][0]["output_mean"] == 6
    table = cli("stats", out)
    assert table.code == 0 and "by tenant" in table.out and "drift" in table.out


def test_stats_rejects_bad_window(cli, conv):
    result = cli("stats", conv, "--window", "0")
    assert result.code == 1 and "--window" in result.err
