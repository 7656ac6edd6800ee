"""Outputs are atomic for real (core/atomic.py): an interrupted or killed writer leaves no temp file
behind (SIGTERM cleans up, SIGKILL's leftovers are swept by the next writer) and never damages the
good output; of two writers of one new output exactly one wins; a full disk is a message; files
get the umask's permissions."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from odmactl.core import atomic
from odmactl.core.atomic import atomic_output, atomic_output_dir, sweep_stale
from odmactl.core.errors import OutputError

CSV = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n"

# `odmactl ingest` in a child whose parquet writer finishes the temp file and then waits, so the
# parent can interrupt it, or race a second writer, at the moment the temp file is complete
SLOW_WRITER = r"""
import sys, time
import polars as pl
from odmactl.cli import main

original = pl.DataFrame.write_parquet
def slow(self, path, *args, **kwargs):
    original(self, path, *args, **kwargs)
    time.sleep(float(sys.argv[1]))
pl.DataFrame.write_parquet = slow
sys.exit(main(sys.argv[2:]))
"""


def _temps(folder: Path, name: str) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith((".tmp", ".old"))]


def _start_slow(tmp_path: Path, sleep_s: float, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(sleep_s), *map(str, args)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_temp(folder: Path, name: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not _temps(folder, name):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the writer never made its temp file"
        time.sleep(0.05)


@pytest.fixture
def good_output(tmp_path, cli) -> tuple[Path, Path, bytes]:
    """(source CSV, an existing good output ingested from it, its bytes)."""
    src = tmp_path / "a.csv"
    src.write_text(CSV)
    out = tmp_path / "o.parquet"
    assert cli("ingest", src, "--out", out).code == 0
    return src, out, out.read_bytes()


@pytest.mark.parametrize("sig, code, words", [(signal.SIGTERM, 143, "terminated; nothing was written"),
                                             (signal.SIGINT, 130, "interrupted; nothing was written")])
def test_a_signal_mid_write_removes_the_temp_and_keeps_the_old_output(tmp_path, good_output, sig, code, words):
    src, out, before = good_output
    proc = _start_slow(tmp_path, 60, "ingest", src, "--out", out, "--force")
    _wait_for_temp(tmp_path, out.name, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert words in err and "Traceback" not in err
    assert _temps(tmp_path, out.name) == []
    assert out.read_bytes() == before


def test_sigkill_leftovers_are_swept_by_the_next_writer(tmp_path, good_output, cli):
    src, out, before = good_output
    proc = _start_slow(tmp_path, 60, "ingest", src, "--out", out, "--force")
    _wait_for_temp(tmp_path, out.name, proc)
    proc.kill()
    proc.communicate(timeout=60)
    left = _temps(tmp_path, out.name)
    assert left, "SIGKILL cannot be caught: its temp file is left behind"
    assert out.read_bytes() == before  # and the good output is untouched
    assert cli("ingest", src, "--out", out, "--force").code == 0
    assert _temps(tmp_path, out.name) == []  # the next writer swept it
    assert pl.read_parquet(out).height == 2


def test_two_writers_of_one_new_output_one_wins(tmp_path):
    """Both pass the early exists check, both write; the check made when the output is put in place
    lets exactly one succeed, and the other says so."""
    src = tmp_path / "a.csv"
    src.write_text(CSV)
    out = tmp_path / "o.parquet"
    procs = [_start_slow(tmp_path, 2, "ingest", src, "--out", out) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], results
    loser = next(err for p, (_, err) in zip(procs, results) if p.returncode == 1)
    assert "already exists" in loser and "Traceback" not in loser
    assert pl.read_parquet(out).height == 2 and _temps(tmp_path, out.name) == []


def test_a_full_disk_is_a_message_and_leaves_nothing(tmp_path, cli, monkeypatch, good_output):
    src, out, before = good_output

    def full(self, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    result = cli("ingest", src, "--out", out, "--force")
    assert result.code == 1 and "no space left on the device" in result.err and "Traceback" not in result.err
    assert out.read_bytes() == before and _temps(tmp_path, out.name) == []
    fresh = tmp_path / "new.parquet"
    assert cli("ingest", src, "--out", fresh).code == 1 and not fresh.exists()


def test_atomic_dir_refuses_a_directory_made_meanwhile(tmp_path):
    target = tmp_path / "pred"
    with pytest.raises(OutputError, match="already exists"):
        with atomic_output_dir(target, force=False, owned=lambda d: None) as tmp:
            (tmp / "weights").write_text("mine")
            target.mkdir()
            (target / "theirs").write_text("theirs")
    assert (target / "theirs").read_text() == "theirs" and _temps(tmp_path, "pred") == []


def test_sweep_leaves_live_writers_alone(tmp_path):
    out = tmp_path / "o.json"
    dead = tmp_path / f".o.json.{2**22 + 12345}.0123abcd.tmp"  # above pid_max by default: no such process
    live = tmp_path / f".o.json.{os.getppid()}.0123abcd.tmp"
    other = tmp_path / f".x.json.{2**22 + 12345}.0123abcd.tmp"
    for p in (dead, live, other):
        p.write_text("x")
    assert sweep_stale(out) == [dead]
    assert live.exists() and other.exists() and not dead.exists()


def test_outputs_get_the_umask_permissions(tmp_path, cli):
    """Every output, the predictor's weights included, is created like any other file of the user's."""
    old = os.umask(0o022)
    try:
        with atomic_output(tmp_path / "r.json", force=False) as tmp:
            tmp.write_text(json.dumps({}))
        alpaca = tmp_path / "al.json"
        alpaca.write_text(json.dumps([{"instruction": f"say {i} {'x' * (i % 7)}", "input": "", "output": "y " * (1 + i % 9)}
                                      for i in range(60)]))
        trace = tmp_path / "t.parquet"
        assert cli("ingest", alpaca, "--offline", "--out", trace).code == 0
        assert cli("fit", trace, "--out", tmp_path / "pred", "--epochs", "1").code == 0
    finally:
        os.umask(old)
    for path in (tmp_path / "r.json", trace, tmp_path / "pred" / "weights.safetensors", tmp_path / "pred" / "predictor.toml"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def _odmactl(*args: str, stdout) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "odmactl", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_standard_output_on_a_full_disk_is_a_message():
    with open("/dev/full", "w") as full:
        result = _odmactl("profiles", "list", stdout=full)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: could not write standard output: No space left on device"


def test_a_closed_standard_output_is_a_message():
    """A red team's case (issue 40): `odmactl ... >&-` (Python's sys.stdout is then None) was an
    internal error with a traceback."""
    result = subprocess.run(["bash", "-c", f"'{sys.executable}' -m odmactl profiles list >&-"], stderr=subprocess.PIPE,
                            text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: could not write standard output: standard output is closed"


def test_standard_output_closed_by_its_reader_stops_quietly():
    """`odmactl ... | head -c 1`: no traceback, no message, the shell's code for SIGPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "odmactl", "profiles", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) in (0, 141)  # 0 when it finished writing before the reader left
    assert err == ""


@pytest.mark.parametrize("make", ["dir_of_other_files", "dir_holding_the_trace", "fifo"])
def test_force_never_destroys_what_odmactl_did_not_write(tmp_path, cli, conv_sample_head, make):
    trace = tmp_path / "t.parquet"
    trace.write_bytes(conv_sample_head(200).read_bytes())
    if make == "dir_of_other_files":
        target = tmp_path / "notes"
        target.mkdir()
        (target / "mine.txt").write_text("keep me")
        args, words = ["fit", trace, "--out", target, "--force"], "holds no predictor.toml"
    elif make == "dir_holding_the_trace":
        target = tmp_path
        args, words = ["fit", trace, "--out", target, "--force"], "contains"
    else:
        target = tmp_path / "pipe"
        os.mkfifo(target)
        args, words = ["ingest", trace, "--out", target, "--force"], "not a regular file"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = cli(*args)
    assert result.code == 1 and words in result.err, result.err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert trace.read_bytes() == conv_sample_head(200).read_bytes()


def test_a_full_disk_on_a_later_output_writes_none(tmp_path, cli, conv_sample_head, monkeypatch):
    """Issue 40: replay wrote --out first, then the plot hit a full disk and the message said nothing
    was written; now every output is written first and all are put in place together."""
    import odmactl.render.plots as plots

    def full(doc, path):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plots, "write_replay_plot", full)
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    r = cli("replay", conv_sample_head(200), "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B",
            "--policy", "paged", "--out", out, "--plot", plot)
    assert r.code == 1 and "r.png" in r.err and "no space left on the device; nothing was written" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == []



def test_a_name_too_long_is_refused_before_the_work_and_a_legal_long_one_is_written(tmp_path, cli, conv_sample_head):
    """A red team's cases (issue 40): a name over 255 bytes was an internal error, after the work;
    then a legal one of 234 to 255 bytes was refused because its temp name passed 255 bytes."""
    trace = conv_sample_head(200)
    args = ("--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B", "--policy", "paged")
    name = tmp_path / ("b" * 300 + ".md")
    r = cli("replay", trace, *args, "--out", name)
    assert r.code == 1 and "the file name is 303 bytes" in r.err and "internal error" not in r.err, r.err
    assert list(tmp_path.iterdir()) == []
    for size in (240, 252):  # 243 and 255 bytes with ".md" (replay writes JSON whatever the suffix)
        name = tmp_path / ("b" * size + ".md")
        r = cli("replay", trace, *args, "--out", name)
        assert r.code == 0, r.err
        assert json.loads(name.read_text())
    assert len(list(tmp_path.iterdir())) == 2


def test_the_temp_names_of_long_names_are_distinct_and_swept(tmp_path):
    """Two long names sharing their first 240 bytes get different temp names, and a temp file left
    by a dead process under a shortened name is swept by the next writer of that name only."""
    one, two = (tmp_path / ("c" * 240 + tail) for tail in ("-one.json", "-two.json"))
    assert atomic._temp_name(one, "tmp").name != atomic._temp_name(two, "tmp").name
    assert all(len(os.fsencode(atomic._temp_name(p, "tmp").name)) <= 255 for p in (one, two))
    dead = atomic._temp_name(one, "tmp").name.replace(f".{os.getpid()}.", ".4194303.")
    (tmp_path / dead).write_text("left by a killed run")
    assert sweep_stale(two) == []
    assert sweep_stale(one) == [tmp_path / dead]


def test_a_path_too_long_for_the_system_is_a_message_before_the_work(tmp_path, cli, conv_sample_head, monkeypatch):
    """A red team's case (issue 40): every name legal, the whole path past PATH_MAX (4,096 bytes):
    an internal error, after the work. (The directories are made one at a time from inside: the
    system takes no longer path.)"""
    trace = conv_sample_head(200)
    monkeypatch.chdir(tmp_path)
    deep = tmp_path
    for k in range(22):
        name = f"d{k:02d}" + "q" * 197
        os.mkdir(name)
        os.chdir(name)
        deep = deep / name
    r = cli("replay", trace, "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B",
            "--policy", "paged", "--out", deep / "r.json")
    assert r.code == 1 and "bytes this system takes for a path" in r.err and "internal error" not in r.err, r.err
    assert os.listdir(".") == []


def test_dash_is_refused_and_what_was_written_is_said_on_stderr(tmp_path, cli, conv_sample_head, monkeypatch):
    """`-o -` would be a file named "-": refused before the work, naming it. What a command writes is
    said on stderr, so that --json keeps stdout pure JSON; the console report has no trailing spaces."""
    monkeypatch.chdir(tmp_path)
    trace = conv_sample_head(60)
    replay = ("replay", trace, "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B", "--predictor",
              "oracle", "--policy", "static")
    r = cli(*replay, "-o", "-")
    assert r.code == 1 and r.err.startswith("error: -: is not standard output here") and r.out == ""
    assert not (tmp_path / "-").exists()
    r = cli("ingest", trace, "--out", "-")
    assert r.code == 1 and "is not standard output" in r.err and not (tmp_path / "-").exists()
    r = cli(*replay, "-o", "r.json", "--metrics-out", "m.prom", "--json")
    assert r.code == 0 and json.loads(r.out)["results"]["static"]
    assert r.err.splitlines()[-1] == "wrote r.json, m.prom" and (tmp_path / "r.json").exists()
    r = cli(*replay, "--json")  # the console's warnings go to stderr, the JSON alone to stdout
    assert r.code == 0 and json.loads(r.out)["results"]["static"]["queue"]["overloaded"]
    assert r.err.startswith("warning: overloaded: ")
    r = cli(*replay)
    assert r.code == 0 and r.err == "" and "static" in r.out
    assert not [line for line in r.out.splitlines() if line.endswith(" ")]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_failed_standard_output_names_the_outputs_already_written(tmp_path, conv_sample_head):
    """The outputs are put in place before the report is printed: when stdout then fails, the
    message says which are there (a red team's case: a rerun needed --force and nothing said why)."""
    out = tmp_path / "r.json"
    with open("/dev/full", "w") as full:
        result = _odmactl("replay", str(conv_sample_head(60)), "--device", "mlu370-x4", "--model",
                          "DeepSeek-R1-Distill-Qwen-7B", "--predictor", "oracle", "--policy", "static", "--out", str(out),
                          stdout=full)
    assert result.returncode == 1 and out.exists()
    assert result.stderr.strip() == ("error: could not write standard output: No space left on device; written before "
                                     f"it, each complete: {out}")
