"""Reader behaviour on small files written here: sorting, exclusions, mappings, arrivals, metadata."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from odmactl.trace.schema import read_metadata, read_trace


def test_unsorted_arrivals_are_sorted_and_counted(cli, tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2024-05-10 00:00:05.5,10,1\n2024-05-10 00:00:01.0,20,2\n2024-05-10 00:00:03.0,30,3\n"
                   "2024-05-10 00:00:09.0,40,4\n")
    out = tmp_path / "t.parquet"
    result = cli("ingest", src, "--out", out, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["moved_rows"] == 2
    frame = read_trace(out)
    assert frame["prompt_tokens"].to_list() == [20, 30, 10, 40]
    assert frame["arrival_s"].to_list() == [0.0, 2.0, 4.5, 8.0]
    assert frame["request_id"].to_list() == ["2", "3", "1", "4"]  # ids keep the source row
    assert read_metadata(out)["moved_rows"] == "2"


def test_iso_timestamps_with_timezone(cli, tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10T00:00:00+00:00,10,1\n2024-05-10T01:00:00+01:00,10,1\n"
                   "2024-05-10T00:00:30.25Z,10,1\n")
    out = tmp_path / "t.parquet"
    assert cli("ingest", src, "--out", out).code == 0
    assert read_trace(out)["arrival_s"].to_list() == [0.0, 0.0, 30.25]


def test_burstgpt_failures_are_reported_and_excluded(cli, tmp_path):
    # BurstGPT's column layout (the real file is not in ../shared/traces; see SOURCES.md)
    src = tmp_path / "BurstGPT_1.csv"
    src.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                   "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n"
                   "118,GPT-4,417,276,693,API log\n")
    out = tmp_path / "t.parquet"
    result = cli("ingest", src, "--out", out, "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["sources"][0]["format"] == "burstgpt"
    assert summary["sources"][0]["excluded"] == {"failed requests (Response tokens = 0)": 1}
    frame = read_trace(out)
    assert frame["model"].to_list() == ["ChatGPT", "GPT-4"]
    assert frame["tenant"].to_list() == ["Conversation log", "API log"]
    assert frame["arrival_s"].to_list() == [0.0, 113.0]
    assert frame["request_id"].to_list() == ["1", "3"]


def test_generic_csv_with_map_and_parquet_roundtrip(cli, tmp_path):
    src = tmp_path / "g.csv"
    src.write_text("id,t,inp,out,who\nr1,0.5,10,3,alice\nr2,1.5,20,4,bob\n")
    out = tmp_path / "t.parquet"
    result = cli("ingest", src, "--out", out, "--format", "csv", "--map", "request_id=id", "--map", "arrival_s=t",
                 "--map", "prompt_tokens=inp", "--map", "output_tokens=out", "--map", "tenant=who")
    assert result.code == 0, result.err
    frame = read_trace(out)
    assert frame.select("request_id", "arrival_s", "prompt_tokens", "output_tokens", "tenant").rows() == [
        ("r1", 0.0, 10, 3, "alice"), ("r2", 1.0, 20, 4, "bob")]
    again = tmp_path / "again.parquet"
    assert cli("ingest", out, "--out", again).code == 0  # a canonical parquet is itself a valid source
    assert read_trace(again).equals(frame)


def test_generic_jsonl(cli, tmp_path):
    src = tmp_path / "g.jsonl"
    src.write_text('{"request_id": "a", "arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2, "model": "m"}\n\n'
                   '{"request_id": "b", "arrival_s": 2, "prompt_tokens": 6, "output_tokens": 3, "model": "m"}\n')
    out = tmp_path / "t.parquet"
    assert cli("ingest", src, "--out", out).code == 0
    assert read_trace(out)["output_tokens"].to_list() == [2, 3]


def test_poisson_arrivals_are_seeded(cli, tmp_path):
    src = tmp_path / "v.csv"
    src.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{i + 1},{i + 2}\n" for i in range(2000)))
    a, b, c = (tmp_path / f"{n}.parquet" for n in "abc")
    assert cli("ingest", src, "--out", a, "--rate", "10", "--seed", "1").code == 0
    assert cli("ingest", src, "--out", b, "--rate", "10", "--seed", "1").code == 0
    assert cli("ingest", src, "--out", c, "--rate", "10", "--seed", "2").code == 0
    assert a.read_bytes() == b.read_bytes()
    fa, fc = read_trace(a), read_trace(c)
    assert not fa["arrival_s"].equals(fc["arrival_s"])
    gaps = np.diff(fa["arrival_s"].to_numpy())
    assert gaps.mean() == pytest.approx(0.1, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # exponential gaps


def test_offline_puts_everything_at_zero(cli, tmp_path):
    src = tmp_path / "v.csv"
    src.write_text("num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n")
    out = tmp_path / "t.parquet"
    assert cli("ingest", src, "--out", out, "--offline").code == 0
    assert read_trace(out)["arrival_s"].to_list() == [0.0, 0.0]


def test_force_replaces(cli, tmp_path):
    src = tmp_path / "v.csv"
    src.write_text("num_prefill_tokens,num_decode_tokens\n5,6\n")
    out = tmp_path / "t.parquet"
    out.write_text("old")
    assert cli("ingest", src, "--out", out, "--offline", "--force").code == 0
    assert read_trace(out).height == 1


def test_shipped_samples_ingest(cli, tmp_path):
    from conftest import SAMPLES

    for name, extra in [("azure_conv_2023_sample.csv.gz", ()), ("mooncake_conversation_sample.jsonl.gz", ())]:
        out = tmp_path / f"{name}.parquet"
        result = cli("ingest", SAMPLES / name, "--out", out, *extra)
        assert result.code == 0, result.err
        assert read_trace(out).height in (4000, 3000)
    assert (SAMPLES / "README.md").is_file()


def test_read_trace_rejects_unsorted_parquet(tmp_path):
    from odmactl.core.errors import TraceError

    frame = pl.DataFrame({"request_id": ["a", "b"], "arrival_s": [1.0, 0.0], "prompt_tokens": [1, 1],
                          "output_tokens": [1, 1], "prompt_text": [None, None], "model": [None, None], "tenant": [None, None]},
                         schema={"request_id": pl.String, "arrival_s": pl.Float64, "prompt_tokens": pl.Int32,
                                 "output_tokens": pl.Int32, "prompt_text": pl.String, "model": pl.String, "tenant": pl.String})
    frame.write_parquet(tmp_path / "u.parquet")
    with pytest.raises(TraceError, match="row 2.*arrival_s"):
        read_trace(tmp_path / "u.parquet")


@pytest.mark.parametrize("value, said", [
    ("true", "holds true/false where line 1 holds a number"),
    ("[1]", "holds a list where line 1 holds a number"),
    ('{"a": 1}', "holds an object where line 1 holds a number"),
    ('"ten"', "expected an integer token count >= 1, got 'ten'"),  # polars reads text; the check names it
    ("1e400", "holds an infinite number (Infinity, or past a float's range), which no column type holds"),
])
def test_a_jsonl_column_that_changes_kind_is_named_with_its_line(cli, tmp_path, value, said):
    """polars refuses such a file, and the message was only 'could not be read as JSON lines'."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n\n'
                    f'{{"arrival_s": 1, "prompt_tokens": {value}, "output_tokens": 5}}\n')
    r = cli("ingest", path, "--out", tmp_path / "t.parquet")
    assert r.code == 1 and "row 3, column 'prompt_tokens'" in r.err and said in r.err, r.err
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("lines, row, column, said", [
    # a column polars reads as text (a number after text) is not blamed; the one it cannot read is
    (['"tenant": "a", "x": 1', '"tenant": 5, "x": 1', '"tenant": "b", "x": [1]'], 3, "x",
     "holds a list where line 1 holds a number"),
    (['"x": 1', '"x": NaN'], 2, "x", "holds NaN, which no column type holds"),
    (['"x": 1', '"x": 1' + "0" * 400], 2, "x", "holds an integer past 64 bits"),
    (['"hash_ids": [1, 2]', '"hash_ids": [[1]]'], 2, "hash_ids[]", "holds a list where line 1 holds a number"),
    (['"tenant": {"a": 1}', '"tenant": {"a": [1]}'], 2, "tenant.a", "holds a list where line 1 holds a number"),
])
def test_the_jsonl_column_polars_cannot_read_is_the_one_named(cli, tmp_path, lines, row, column, said):
    """The second red-team trial: a column polars reads (text after a number) was blamed for one it
    cannot (a list in an unused column); unused columns, list items, object fields, NaN and
    400-digit integers still gave the bare 'could not be read as JSON lines'."""
    path = tmp_path / "t.jsonl"
    base = '"arrival_s": {t}, "prompt_tokens": 10, "output_tokens": 5'
    path.write_text("".join("{" + base.format(t=i) + ", " + extra + "}\n" for i, extra in enumerate(lines)))
    r = cli("ingest", path, "--out", tmp_path / "t.parquet")
    assert r.code == 1 and f"row {row}, column '{column}'" in r.err and said in r.err, r.err


def test_bytes_that_are_not_utf8_are_named_with_their_line(cli, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
                     b'{"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 5, "x": "\xff\xfe"}\n')
    r = cli("ingest", path, "--out", tmp_path / "t.parquet")
    assert r.code == 1 and "row 2" in r.err and "not UTF-8 text (byte 0xff)" in r.err, r.err


@pytest.mark.parametrize("suffix, text", [
    ("jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
              '{"arrival_s": "2024-01-01 00:00:00", "prompt_tokens": 10, "output_tokens": 5}\n'),
    ("csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n2024-01-01 00:00:00,10,5\n"),
])
def test_a_date_among_seconds_is_refused_not_read_as_a_second_clock(cli, tmp_path, suffix, text):
    """0 then '2024-01-01 00:00:00' ingested as 2 requests over 1,704,067,200 s (the date filled in
    as an absolute time among relative ones); the other way round it was refused."""
    path = tmp_path / f"t.{suffix}"
    path.write_text(text)
    r = cli("ingest", path, "--format", suffix, "--out", tmp_path / "t.parquet")
    assert r.code == 1 and "row 2, column 'arrival_s'" in r.err and \
        "could not parse '2024-01-01 00:00:00' as seconds, which the column's first value is" in r.err, r.err
