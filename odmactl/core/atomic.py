"""Atomic output files: write to a hidden temp file beside the target, rename on success.

A failed or interrupted run leaves no partial file and never replaces an existing good one.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from odmactl.core.errors import OutputError


def check_writable(path: Path, *, force: bool) -> None:
    """Fail before any expensive work if `path` cannot be (over)written."""
    if path.is_dir():
        raise OutputError("is a directory, expected a file path", file=path)
    if path.exists() and not force:
        raise OutputError("already exists", file=path, hint="pass --force to replace it")
    _check_parent(path)


def _check_parent(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError("the output directory does not exist", file=path)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError("the output directory is not writable", file=path)


@contextmanager
def atomic_output(path: Path, *, force: bool) -> Iterator[Path]:
    """Yield a temp path to write; on clean exit it replaces `path` in one rename."""
    path = Path(path)
    check_writable(path, force=force)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        if not tmp.exists():
            raise AssertionError(f"nothing was written to {tmp}")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_writable_dir(path: Path, *, force: bool) -> None:
    """Fail before any expensive work if directory `path` cannot be written (or replaced)."""
    if path.exists() and not path.is_dir():
        raise OutputError("exists and is not a directory", file=path)
    if path.is_dir() and any(path.iterdir()) and not force:
        raise OutputError("already exists and is not empty", file=path, hint="pass --force to replace it")
    _check_parent(path)


@contextmanager
def atomic_output_dir(path: Path, *, force: bool) -> Iterator[Path]:
    """Yield a temp directory to fill; on clean exit it takes `path`'s place (an existing directory
    is moved aside first and removed only once the new one is in place)."""
    path = Path(path)
    check_writable_dir(path, force=force)
    tag = f"{os.getpid()}.{secrets.token_hex(4)}"
    tmp = path.with_name(f".{path.name}.{tag}.tmp")
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.{tag}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
