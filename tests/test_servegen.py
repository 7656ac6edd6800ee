"""Acceptance 3: ServeGen generation for reason/deepseek-r1 over a 6 h window.

The reference is computed here from the raw files (csv + json + ast modules): the pooled output-length
PDF weights each client's 6 h PDF by its expected requests (rate x overlap) in the span.
"""

from __future__ import annotations

import ast
import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.stats import ks_2samp

from odmactl.trace.schema import read_metadata, read_trace

SPAN_S = 21600.0
TARGET = 100_000


def _rates(folder: Path) -> dict[int, list[tuple[float, float]]]:
    out = {}
    for path in folder.glob("chunk-*-trace.csv.gz"):
        client = int(path.name.split("-")[1])
        rows = csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode()))
        out[client] = [(float(r[0]), float(r[1])) for r in rows]
    return out


@pytest.fixture(scope="module")
def r1(shared_traces, tmp_path_factory):
    folder = shared_traces / "servegen" / "reason" / "deepseek-r1"
    rates = _rates(folder)
    expected_total = sum(rate * 600 for rows in rates.values() for start, rate in rows if start < SPAN_S)
    scale = TARGET / expected_total
    out = tmp_path_factory.mktemp("sg") / "r1.parquet"
    from odmactl.cli import main

    assert main(["ingest", str(folder), "--format", "servegen", "--out", str(out), "--start", "0",
                 "--duration", str(SPAN_S), "--rate-scale", repr(scale), "--seed", "7"]) == 0
    return folder, rates, scale, out


def test_output_length_distribution_matches_source_pdf(r1):
    folder, rates, scale, out = r1
    frame = read_trace(out)
    assert abs(frame.height - TARGET) < 0.01 * TARGET
    values, weights = [], []
    for client, rows in rates.items():
        expected = sum(rate * 600 for start, rate in rows if start < SPAN_S)
        if expected == 0:
            continue
        data = json.loads(gzip.decompress((folder / f"chunk-{client}-dataset.json.gz").read_bytes()))
        pdf = ast.literal_eval(data["0"]["output_tokens"])
        total = sum(pdf.values())
        for v, p in pdf.items():
            values.append(v)
            weights.append(expected * p / total)
    weights = np.asarray(weights) / np.sum(weights)
    reference = np.random.default_rng(12345).choice(np.asarray(values), size=TARGET, p=weights)
    ks = ks_2samp(frame["output_tokens"].to_numpy(), reference).statistic
    assert ks < 0.02, ks


def test_window_counts_match_rate_times_600s(r1):
    folder, rates, scale, out = r1
    frame = read_trace(out)
    params = json.loads(read_metadata(out)["sources"])[0]["params"]
    t = frame["arrival_s"].to_numpy() + params["first_arrival_s"] + params["start_s"]
    counts = np.bincount((t // 600).astype(int), minlength=36)[:36]
    expected = np.zeros(36)
    for rows in rates.values():
        for start, rate in rows:
            if start < SPAN_S:
                expected[int(start // 600)] += rate * 600 * scale
    assert counts.sum() == frame.height
    busy = expected >= 100
    assert busy.sum() >= 30
    rel = np.abs(counts[busy] - expected[busy]) / expected[busy]
    assert rel.max() < 0.05, rel.max()


def test_same_seed_same_trace_other_seed_differs(shared_traces, tmp_path, cli):
    folder = shared_traces / "servegen" / "reason" / "deepseek-r1"
    paths = []
    for i, seed in enumerate((1, 1, 2)):
        paths.append(tmp_path / f"{i}.parquet")
        assert cli("ingest", folder, "--out", paths[-1], "--duration", 1200, "--seed", seed).code == 0
    a, b, c = (pl.read_parquet(p) for p in paths)
    assert a.equals(b)
    assert not a.equals(c)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert set(a["tenant"]) <= {f"chunk-{n}" for n in range(200)}
    assert a["model"].unique().to_list() == ["deepseek-r1"]


def test_clients_without_lengths_are_reported(shared_traces, tmp_path, cli):
    folder = shared_traces / "servegen" / "language" / "m-large"
    out = tmp_path / "ml.parquet"
    result = cli("ingest", folder, "--out", out, "--duration", 600, "--json")
    assert result.code == 0, result.err
    excluded = json.loads(result.out)["sources"][0]["excluded"]
    assert any("without length data" in k for k in excluded), excluded
