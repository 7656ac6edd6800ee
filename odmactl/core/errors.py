"""Errors a user can act on. Everything odmactl raises for bad input is an OdmaError.

The CLI is the single place that turns these into a one-paragraph message and exit code 1;
`assert` is kept for odmactl's own bugs.
"""

from __future__ import annotations

from pathlib import Path


class OdmaError(Exception):
    """A problem with the user's input, files or configuration.

    `file`, `row` (1-based record number in the source, header excluded) and `column` (as named in
    the source) are filled in wherever they apply, so the message points at the exact place; `key`
    names a setting in a configuration file (a TOML key).
    """

    kind = "error"

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        row: int | None = None,
        column: str | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = str(file) if file is not None else None
        self.row = row
        self.column = column
        self.key = key
        self.hint = hint

    def __str__(self) -> str:
        where = []
        if self.file is not None:
            where.append(self.file)
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column '{self.column}'")
        if self.key is not None:
            where.append(f"key '{self.key}'")
        text = (", ".join(where) + ": " if where else "") + self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class TraceError(OdmaError):
    kind = "trace error"


class OutputError(OdmaError):
    kind = "output error"


class ProfileError(OdmaError):
    kind = "profile error"


class PredictorError(OdmaError):
    kind = "predictor error"


class ConfigError(OdmaError):
    kind = "config error"


class AllocationError(OdmaError):
    """Misuse of the allocator API: releasing twice, an allocation this allocator does not own,
    a request id that is already live, a request that can never fit, a KV length that shrinks."""

    kind = "allocation error"
