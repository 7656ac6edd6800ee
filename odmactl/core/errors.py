"""Errors a user can act on. Everything odmactl raises for bad input is an OdmaError.

The CLI is the single place that turns these into a one-paragraph message and exit code 1;
`assert` is kept for odmactl's own bugs.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
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


def did_you_mean(given: str, choices: Iterable[str]) -> str | None:
    """"did you mean 'X'?" (or "'X', 'Y' or 'Z'") naming the choices closest to `given`, compared in any
    case (difflib's close matches, at most three), or None when none is close: what a message about
    a mistyped name adds."""
    choices = list(dict.fromkeys(choices))
    folded = {c.casefold(): c for c in reversed(choices)}  # the first spelling of each
    near = [folded[c] for c in difflib.get_close_matches(given.casefold(), list(folded))]
    if not near:
        return None
    quoted = [f"'{c}'" for c in near]
    return "did you mean " + (", ".join(quoted[:-1]) + " or " if len(quoted) > 1 else "") + quoted[-1] + "?"


def quoted(text: str) -> str:
    """`text` as a message quotes it: its repr (quotes and control characters escaped), cut in the
    middle past 40 characters (a 10,000-digit number, a 100,000-character value)."""
    return repr(text) if len(text) <= 40 else repr(text[:24] + "..." + text[-12:])


def named_twice(flag: str, values: Iterable[object]) -> str | None:
    """The message for a list flag that names a value twice ("--router names least-kv twice"),
    naming the first repeated value alone (a list of thousands was echoed whole), quoted as
    `quoted` cuts it; None when every value is distinct."""
    seen: set = set()
    for value in values:
        if value in seen:
            return f"{flag} names {quoted(str(value))} twice"
        seen.add(value)
    return None


def not_one_of(flag: str, given: object, choices: Iterable[object]) -> str:
    """The one message for a setting that names none of its choices: "--engine expects one of
    vllm-v0, vllm-v1, got 'VLLM-V2'; did you mean 'vllm-v1'?" (the suggestion where one is close)."""
    names = [str(c) for c in choices]
    near = did_you_mean(str(given), names)
    return f"{flag} expects one of {', '.join(names)}, got {quoted(str(given))}" + (f"; {near}" if near else "")


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


class RunError(OdmaError):
    """A run could not finish for a reason outside its input: a worker process killed from outside."""

    kind = "run error"


class AllocationError(OdmaError):
    """Misuse of the allocator API: releasing twice, an allocation this allocator does not own,
    a request id that is already live, a request that can never fit, a KV length that shrinks."""

    kind = "allocation error"
