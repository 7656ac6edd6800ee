from __future__ import annotations

import os
from pathlib import Path

import pytest

from odmactl.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("ODMACTL_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
SAMPLES = ROOT / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not present at {SHARED_TRACES}")
    return SHARED_TRACES


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def cli(capsys):
    """Run odmactl in-process through its real entry point; returns exit code and captured output."""

    def run(*args: object) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def conv_sample_head(tmp_path_factory):
    """The shipped Azure conv sample, ingested; `head(n)` writes its first n requests to a parquet
    file and returns the path."""
    from odmactl.trace.schema import read_trace

    folder = tmp_path_factory.mktemp("conv-sample")
    full = folder / "conv.parquet"
    assert main(["ingest", str(SAMPLES / "azure_conv_2023_sample.csv.gz"), "--out", str(full)]) == 0
    frame = read_trace(full)

    def head(n: int) -> Path:
        path = folder / f"head-{n}.parquet"
        if not path.exists():
            frame.head(n).write_parquet(path)
        return path

    return head
