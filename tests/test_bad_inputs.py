"""Acceptance 4: a corpus of bad inputs. Each exits 1 with one message naming the file (and row and
column where they apply), prints no traceback, and leaves no output file (nor clobbers a good one)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,3180,8", "2023-11-16 18:17:05.0000000,100,20"]


def azure(tmp: Path, rows: list[str], name: str = "a.csv") -> Path:
    path = tmp / name
    path.write_text(AZURE_HEADER + "".join(r + "\n" for r in rows))
    return path


def _case_missing_file(tmp):
    return [tmp / "nope.csv"], [], ("nope.csv", "no such file")


def _case_empty_file(tmp):
    (tmp / "e.csv").write_text("")
    return [tmp / "e.csv"], [], ("e.csv", "empty")


def _case_header_only(tmp):
    return [azure(tmp, [])], [], ("a.csv", "no data rows")


def _case_missing_column(tmp):
    (tmp / "m.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,5\n")
    return [tmp / "m.csv"], ["--format", "azure"], ("m.csv", "column 'GeneratedTokens'", "missing column")


def _case_non_numeric(tmp):
    return [azure(tmp, GOOD + ["2023-11-16 18:17:06.0,12,abc"])], [], ("a.csv", "row 4", "column 'GeneratedTokens'", "'abc'")


def _case_zero_tokens(tmp):
    return [azure(tmp, GOOD[:1] + ["2023-11-16 18:17:04.0,0,8"])], [], ("row 2", "column 'ContextTokens'", "below 1")


def _case_negative_tokens(tmp):
    return [azure(tmp, GOOD + ["2023-11-16 18:17:06.0,12,-5"])], [], ("row 4", "column 'GeneratedTokens'", "(-5)")


def _case_nan(tmp):
    return [azure(tmp, GOOD[:2] + ["2023-11-16 18:17:06.0,NaN,5"])], [], ("row 3", "column 'ContextTokens'", "NaN")


def _case_fractional(tmp):
    return [azure(tmp, GOOD[:2] + ["2023-11-16 18:17:06.0,7.5,5"])], [], ("row 3", "column 'ContextTokens'", "fractional")


def _case_huge_tokens(tmp):
    """1e30 was shown as 1000000000000000019884624838656, digits the file never had."""
    return [azure(tmp, GOOD[:2] + ["2023-11-16 18:17:06.0,1e30,5"])], [], ("row 3", "column 'ContextTokens'",
                                                                            "above 2^31-1 (1e+30)")


def _case_missing_value(tmp):
    return [azure(tmp, GOOD[:2] + ["2023-11-16 18:17:06.0,,5"])], [], ("row 3", "column 'ContextTokens'", "missing")


def _case_bad_timestamp(tmp):
    return [azure(tmp, GOOD[:1] + ["yesterday at noon,12,5"])], [], ("row 2", "column 'TIMESTAMP'", "yesterday at noon")


def _case_duplicate_ids(tmp):
    (tmp / "d.csv").write_text("request_id,arrival_s,prompt_tokens,output_tokens\nx,0,5,5\ny,1,5,5\nx,2,5,5\n")
    return [tmp / "d.csv"], [], ("d.csv", "row 3", "column 'request_id'", "duplicate request id 'x'", "row 1")


def _case_truncated_gzip(tmp):
    data = gzip.compress((AZURE_HEADER + "\n".join(GOOD * 2000)).encode())
    (tmp / "t.csv.gz").write_bytes(data[: len(data) // 2])
    return [tmp / "t.csv.gz"], ["--format", "azure"], ("t.csv.gz", "truncated or corrupt gzip")


def _case_truncated_gzip_auto(tmp):
    data = gzip.compress(("\n".join('{"timestamp": %d, "input_length": 5, "output_length": 6}' % i for i in range(5000))).encode())
    (tmp / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    return [tmp / "t.jsonl.gz"], [], ("t.jsonl.gz", "truncated or corrupt gzip")


def _case_broken_json_line(tmp):
    (tmp / "b.jsonl").write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n'
                                 '{"timestamp": 5, "input_length": 5, "output_length": 6\n'
                                 '{"timestamp": 9, "input_length": 5, "output_length": 6}\n')
    return [tmp / "b.jsonl"], ["--format", "mooncake"], ("b.jsonl", "row 2", "broken JSON line")


def _case_wrong_format(tmp):
    (tmp / "mc.jsonl").write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n')
    return [tmp / "mc.jsonl"], ["--format", "azure"], ("mc.jsonl", "missing column required by format 'azure'")


def _case_unknown_format(tmp):
    return [azure(tmp, GOOD)], ["--format", "sharegpt"], ("--format expects one of", "got 'sharegpt'")


def _case_undetectable(tmp):
    (tmp / "u.csv").write_text("foo,bar\n1,2\n")
    return [tmp / "u.csv"], [], ("u.csv", "could not detect the format", "--format")


def _case_no_timestamps(tmp):
    (tmp / "v.csv").write_text("num_prefill_tokens,num_decode_tokens\n5,6\n")
    return [tmp / "v.csv"], [], ("v.csv", "no timestamps", "--rate")


def _case_tokenizer_not_a_tokenizer(tmp):
    (tmp / "tok").mkdir()
    (tmp / "tok" / "README").write_text("not a tokenizer")
    (tmp / "al.json").write_text('[{"instruction": "hi", "input": "", "output": "hello"}]')
    return [tmp / "al.json"], ["--tokenizer", tmp / "tok", "--offline"], ("tok", "not a Hugging Face tokenizer directory")


def _case_tokenizer_broken_files(tmp):
    (tmp / "tok2").mkdir()
    (tmp / "tok2" / "tokenizer.json").write_text("{broken")
    (tmp / "al.json").write_text('[{"instruction": "hi", "input": "", "output": "hello"}]')
    return [tmp / "al.json"], ["--tokenizer", tmp / "tok2", "--offline"], ("tok2", "could not load a tokenizer")


def _case_text_missing_field(tmp):
    (tmp / "al.json").write_text('[{"instruction": "hi", "input": "", "output": "x"}, {"instruction": "yo", "input": ""}]')
    return [tmp / "al.json"], ["--offline"], ("al.json", "row 2", "column 'output'", "missing field")


def _case_arena_without_questions(tmp):
    (tmp / "ans.jsonl").write_text('{"uid": "u1", "ans_id": "a", "model": "m", "messages": [{"role": "user", "content": "q"}, '
                                   '{"role": "assistant", "content": {"answer": "x"}}]}\n')
    return [tmp / "ans.jsonl"], ["--offline"], ("ans.jsonl", "question file")


def _case_bad_map(tmp):
    (tmp / "g.csv").write_text("p,o\n5,6\n")
    return [tmp / "g.csv"], ["--format", "csv", "--map", "prompt_tokens=p", "--map", "output_tokens=zz"], ("g.csv", "zz", "no such column")


def _case_servegen_bad_rate_file(tmp):
    folder = tmp / "sg"
    folder.mkdir()
    (folder / "chunk-0-trace.csv").write_text("0,0.5,1.0,Gamma,1.0,2.0\n600,-1,1.0,Gamma,1.0,2.0\n")
    return [folder], ["--format", "servegen"], ("chunk-0-trace.csv", "row 2", "rate")


CASES = {name[6:]: fn for name, fn in globals().items() if name.startswith("_case_")}


def test_corpus_is_large_enough():
    assert len(CASES) + 4 >= 15  # plus the output-path cases below


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(cli, tmp_path, case):
    sources, extra, needles = CASES[case](tmp_path)
    out = tmp_path / "out" / "t.parquet"
    out.parent.mkdir()
    result = cli("ingest", *sources, "--out", out, *extra)
    assert result.code == 1, (result.code, result.err)
    message = " ".join(result.err.split())
    assert "Traceback" not in result.err and "internal error" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    assert list(out.parent.iterdir()) == [], "no output (nor temp file) may be left behind"


def test_existing_out_without_force_is_kept(cli, tmp_path):
    src = azure(tmp_path, GOOD)
    out = tmp_path / "t.parquet"
    out.write_bytes(b"precious")
    result = cli("ingest", src, "--out", out)
    assert result.code == 1
    assert "already exists" in result.err and "--force" in result.err
    assert out.read_bytes() == b"precious"


def test_failed_run_with_force_never_clobbers(cli, tmp_path):
    good = azure(tmp_path, GOOD, "good.csv")
    out = tmp_path / "t.parquet"
    assert cli("ingest", good, "--out", out).code == 0
    before = out.read_bytes()
    bad = azure(tmp_path, GOOD + ["2023-11-16 18:17:06.0,12,-1"], "bad.csv")
    assert cli("ingest", bad, "--out", out, "--force").code == 1
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "good.csv", "t.parquet"]


@pytest.mark.parametrize("target", ["missing_dir", "under_a_file", "a_directory"])
def test_unwritable_out(cli, tmp_path, target):
    src = azure(tmp_path, GOOD)
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "adir").mkdir()
    out = {"missing_dir": tmp_path / "no" / "such" / "t.parquet",
           "under_a_file": tmp_path / "file.txt" / "t.parquet",
           "a_directory": tmp_path / "adir"}[target]
    result = cli("ingest", src, "--out", out)
    assert result.code == 1
    assert str(out) in " ".join(result.err.split()).replace(" ", "") or out.name in result.err
    assert "Traceback" not in result.err
    assert list((tmp_path / "adir").iterdir()) == []


def test_stats_on_a_non_parquet_file(cli, tmp_path):
    src = azure(tmp_path, GOOD)
    result = cli("stats", src)
    assert result.code == 1
    assert "a.csv" in result.err and "not a readable parquet" in result.err


def test_traceback_only_with_debug(tmp_path):
    import os
    import subprocess
    import sys

    missing = tmp_path / "nope.csv"
    cmd = [sys.executable, "-c", "from odmactl.cli import entry; entry()", "ingest", str(missing), "--out", str(tmp_path / "o.parquet")]
    plain = subprocess.run(cmd, capture_output=True, text=True)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr and "no such file" in plain.stderr
    debug = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "ODMACTL_DEBUG": "1"})
    assert debug.returncode != 0 and "Traceback" in debug.stderr
