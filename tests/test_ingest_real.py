"""Acceptance 2: every real trace / text dataset in ../shared/traces ingests into a schema-valid parquet
whose row count and token totals match an independent count of the source (csv/json modules and the
`tokenizers` library directly, not odmactl's readers)."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from odmactl.trace.schema import PREFIX_SCHEMA, SCHEMA, read_metadata, read_trace
from odmactl.trace.tokenizer import default_tokenizer_dir


def _csv_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().split("\n") if line.strip()]


@pytest.fixture(scope="module")
def raw_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))


def _count(tok, texts: list[str]) -> int:
    return int(sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)))


def _ingest(cli, tmp_path: Path, *sources: Path, extra: tuple = ()) -> pl.DataFrame:
    out = tmp_path / "t.parquet"
    result = cli("ingest", *sources, "--out", out, *extra)
    assert result.code == 0, result.err
    frame = read_trace(out)  # validates schema and invariants
    assert frame.schema in (pl.Schema(SCHEMA), pl.Schema({**SCHEMA, **PREFIX_SCHEMA}))  # prefix hashes where the source has them
    assert frame["request_id"].n_unique() == frame.height
    assert frame["arrival_s"].min() == 0.0
    assert (frame["arrival_s"].diff().drop_nulls() >= 0).all()
    meta = read_metadata(out)
    assert meta["version"] and meta["sources"]
    return frame


def _totals(frame: pl.DataFrame) -> tuple[int, int, int]:
    return frame.height, int(frame["prompt_tokens"].cast(pl.Int64).sum()), int(frame["output_tokens"].cast(pl.Int64).sum())


@pytest.mark.parametrize("name", ["AzureLLMInferenceTrace_code.csv.gz", "AzureLLMInferenceTrace_conv.csv.gz"])
def test_azure(cli, tmp_path, shared_traces, name):
    rows = _csv_rows(shared_traces / name)
    frame = _ingest(cli, tmp_path, shared_traces / name)
    assert _totals(frame) == (len(rows), sum(int(r["ContextTokens"]) for r in rows), sum(int(r["GeneratedTokens"]) for r in rows))
    first, last = rows[0]["TIMESTAMP"], rows[-1]["TIMESTAMP"]
    from datetime import datetime

    span = (datetime.fromisoformat(last[:26]) - datetime.fromisoformat(first[:26])).total_seconds()
    assert frame["arrival_s"].max() == pytest.approx(span, abs=1e-5)


@pytest.mark.parametrize("name", ["mooncake_conversation_trace.jsonl.gz", "mooncake_synthetic_trace.jsonl.gz"])
def test_mooncake(cli, tmp_path, shared_traces, name):
    rows = _jsonl(shared_traces / name)
    frame = _ingest(cli, tmp_path, shared_traces / name)
    assert _totals(frame) == (len(rows), sum(r["input_length"] for r in rows), sum(r["output_length"] for r in rows))
    assert frame["arrival_s"].max() == pytest.approx((rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000)
    assert frame["prefix_hashes"].to_list() == [r["hash_ids"] for r in rows]  # kept as they are, 512-token blocks
    assert set(frame["prefix_block_tokens"].to_list()) == {512}


def test_vidur(cli, tmp_path, shared_traces):
    path = shared_traces / "vidur_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv.gz"
    rows = _csv_rows(path)
    frame = _ingest(cli, tmp_path, path, extra=("--rate", "4", "--seed", "3"))
    assert _totals(frame) == (len(rows), sum(int(r["num_prefill_tokens"]) for r in rows), sum(int(r["num_decode_tokens"]) for r in rows))
    # Poisson at 4 req/s: mean gap 0.25 s
    assert frame["arrival_s"].max() / (frame.height - 1) == pytest.approx(0.25, rel=0.03)


def test_alpaca(cli, tmp_path, shared_traces, raw_tokenizer):
    records = json.loads(gzip.decompress((shared_traces / "alpaca_small_2000.json.gz").read_bytes()))
    prompts = [r["instruction"] + ("\n\n" + r["input"] if r["input"].strip() else "") for r in records]
    kept = [r for r in records if r["output"].strip()]
    frame = _ingest(cli, tmp_path, shared_traces / "alpaca_small_2000.json.gz", extra=("--offline",))
    assert _totals(frame) == (len(kept), _count(raw_tokenizer, prompts), _count(raw_tokenizer, [r["output"] for r in kept]))
    assert frame["prompt_text"][0] == prompts[0]


def test_alpaca_eval(cli, tmp_path, shared_traces, raw_tokenizer):
    records = _jsonl(shared_traces / "alpaca_eval_model_outputs.jsonl.gz")
    kept = [r for r in records if r["output"] and r["output"].strip()]
    assert len(records) - len(kept) == 25  # empty responses in the source, reported and excluded
    frame = _ingest(cli, tmp_path, shared_traces / "alpaca_eval_model_outputs.jsonl.gz", extra=("--offline",))
    expected = (len(kept), _count(raw_tokenizer, [r["instruction"] for r in kept]), _count(raw_tokenizer, [r["output"] for r in kept]))
    assert _totals(frame) == expected
    assert frame["model"].n_unique() == 66
    meta = json.loads(read_metadata(tmp_path / "t.parquet")["sources"])
    assert meta[0]["excluded"] == {"empty responses (nothing generated)": 25}


@pytest.mark.parametrize("version", ["v0.1", "v2.0"])
def test_arena_hard(cli, tmp_path, shared_traces, raw_tokenizer, version):
    qpath = shared_traces / f"arena_hard_{version}_question.jsonl.gz"
    apath = shared_traces / f"arena_hard_{version}_model_answers.jsonl.gz"
    questions = {q["uid"]: q["prompt"] for q in _jsonl(qpath)}
    answers = _jsonl(apath)
    prompt_total = _count(raw_tokenizer, [questions[a["uid"]] for a in answers])
    if version == "v2.0":
        output_total = sum(a["metadata"]["token_len"] for a in answers)
    else:
        output_total = _count(raw_tokenizer, [a["messages"][-1]["content"]["answer"] for a in answers])
    frame = _ingest(cli, tmp_path, qpath, apath, extra=("--offline",))
    assert _totals(frame) == (len(answers), prompt_total, output_total)
    assert set(frame["request_id"]) == {a["ans_id"] for a in answers}


def test_several_sources_concatenate_on_one_clock(cli, tmp_path, shared_traces):
    code = shared_traces / "AzureLLMInferenceTrace_code.csv.gz"
    conv = shared_traces / "AzureLLMInferenceTrace_conv.csv.gz"
    frame = _ingest(cli, tmp_path, code, conv)
    n_code, n_conv = len(_csv_rows(code)), len(_csv_rows(conv))
    assert frame.height == n_code + n_conv
    # conv starts at 18:15:46.68, code at 18:17:03.98: one shared clock puts code's first request at 77.3 s
    first_code = frame.filter(pl.col("request_id") == "0:1")["arrival_s"][0]
    assert first_code == pytest.approx(77.2994, abs=1e-3)
    assert np.all(np.diff(frame["arrival_s"].to_numpy()) >= 0)
