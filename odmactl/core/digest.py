"""SHA-256 of files, read in blocks: how artifacts pin their weights and encoders."""

from __future__ import annotations

import hashlib
from pathlib import Path


def files_sha256(paths: list[Path]) -> str:
    """SHA-256 of the files' contents, one after another, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    for path in paths:
        with Path(path).open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    return files_sha256([path])
