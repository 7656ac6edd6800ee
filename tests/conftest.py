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
