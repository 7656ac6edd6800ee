"""The one strict reader of TOML tables: device profiles, predictor artifacts, the config plan writes
(its [allocator], [scheduler] and [thresholds]) all go through it, so every bad file gets the same
kind of message: the file, the dotted key, what was expected and what was found.

`load_toml(path, error)` reads and parses a file. `TomlTable` wraps one table: typed getters
(`string`, `number`, `quantity`, `table`) for hand-read files, `to_dataclass` for tables whose keys
are a dataclass's fields (checked against the field annotations: int, float, str, bool, their
`| None` forms, tuples and lists of them, dict), and `finish` to refuse the keys nobody read.
A float must be finite wherever it is read (TOML writes inf and nan, and no setting means them).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

from odmactl.core.errors import ConfigError, OdmaError, did_you_mean
from odmactl.core.units import parse_quantity

_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def load_toml(path: Path, error: type[OdmaError] = ConfigError) -> dict:
    """The parsed file; a missing, unreadable or malformed file is `error` naming it."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO would block the read forever
        raise error("is not a regular file (a device, FIFO or socket), expected a TOML file", file=path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("no such file", file=path) from None
    except IsADirectoryError:
        raise error("is a directory, expected a TOML file", file=path) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}", file=path) from None
    except UnicodeDecodeError as exc:
        raise error(f"not valid TOML: not UTF-8 text ({exc.reason} at byte {exc.start})", file=path) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"not valid TOML ({exc})", file=path) from None
    except ValueError as exc:  # an integer past Python's 4,300 digits: tomllib's int() raises this
        raise error("not valid TOML: an integer of more than 4,300 digits" if "digits" in str(exc)
                    else f"not valid TOML ({exc})", file=path) from None


def unknown_key(name: str, known) -> str:
    """The message for a key no table of this kind has: the close ones first, then all of them."""
    near = did_you_mean(name, sorted(known))
    return f"unknown key{'; ' + near if near else ''} (known: {', '.join(sorted(known))})"


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else type(value).__name__


def _matches(value: object, annotation: str) -> bool | None:
    """Whether `value` (as TOML gives it) fits the field annotation; None when the annotation is
    not one this reader knows (then only the dataclass checks it)."""
    annotation = annotation.replace(" ", "")
    if annotation.endswith("|None"):
        annotation = annotation[:-5]
    if annotation in _SCALARS:
        kind = _SCALARS[annotation]
        if kind is bool:
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if kind is float:
            return isinstance(value, (int, float))
        return isinstance(value, kind)
    for prefix in ("tuple[", "list["):
        if annotation.startswith(prefix) and annotation.endswith("]"):
            inner = annotation[len(prefix):-1].removesuffix(",...")
            return isinstance(value, (list, tuple)) and all(_matches(v, inner) for v in value)
    if annotation.startswith("dict"):
        return isinstance(value, dict)
    return None


def _as_declared(value: object, annotation: str) -> object:
    """An integer where the field is a float becomes a float (TOML writes 1 for 1.0), in sequences too."""
    annotation = annotation.replace(" ", "").removesuffix("|None")
    if annotation == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in ("tuple[float,...]", "list[float]") and isinstance(value, (list, tuple)):
        return [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


_WORDS = {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false", "dict": "a table"}


def _expected(annotation: str) -> str:
    """An annotation in words: "float | None" -> "a number", "tuple[int, ...]" -> "a list of whole numbers"."""
    annotation = annotation.replace(" ", "").removesuffix("|None")
    for prefix in ("tuple[", "list["):
        if annotation.startswith(prefix):
            inner = _WORDS.get(annotation[len(prefix):-1].removesuffix(",..."), "values")
            return "a list of " + inner.removeprefix("a ").replace("number", "numbers").replace("string", "strings")
    return _WORDS.get(annotation.split("[")[0], annotation)


def _finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


class TomlTable:
    """One table of a TOML file: every error is `error` naming `file` and the dotted key; `finish`
    rejects keys that were not read. `file` may be None (a table that came from code)."""

    def __init__(self, data: object, file: str | Path | None, prefix: str = "",
                 error: type[OdmaError] = ConfigError) -> None:
        self.file, self.prefix, self.error_type = file, prefix, error
        if not isinstance(data, dict):
            raise error(f"expected a table, got {_describe(data)}", file=file, key=prefix or None)
        self.data, self.used = data, set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def error(self, name: str, message: str) -> OdmaError:
        return self.error_type(message, file=self.file, key=self.key(name))

    def raw(self, name: str, required: bool = True) -> object:
        self.used.add(name)
        if name not in self.data:
            if required:
                raise self.error(name, "missing")
            return None
        return self.data[name]

    def table(self, name: str, required: bool = True) -> TomlTable | None:
        value = self.raw(name, required)
        return None if value is None else TomlTable(value, self.file, self.key(name), self.error_type)

    def string(self, name: str, required: bool = True) -> str | None:
        value = self.raw(name, required)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.error(name, f"expected a non-empty string, got {value!r}")
        return value

    def number(self, name: str, low: float, high: float, required: bool = True) -> float | None:
        """A number in (low, high]."""
        value = self.raw(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low < value <= high):
            raise self.error(name, f"expected a number in ({low:g}, {high:g}], got {value!r}")
        return float(value)

    def quantity(self, name: str, kind: str) -> float:
        """A string with its unit (units.KINDS), in base units."""
        try:
            return parse_quantity(self.raw(name), kind)
        except ValueError as exc:
            raise self.error(name, str(exc)) from None

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.error(unknown[0], "unknown key (a typo?)")

    def to_dataclass(self, cls: type, *, all_required: bool = False, convert: dict | None = None,
                     skip: tuple[str, ...] = ()):
        """`cls(**table)`, checked first: an unknown key (or one in `skip`) names the known ones; a
        missing key is an error when the field has no default (or, with `all_required`, unless its
        default is None: a silent default could change results); every value must fit its field's
        annotation and every float be finite. `convert` maps a field to a function applied to its
        value (lists to tuples). An OdmaError the dataclass raises (its own invariants) is re-raised
        naming this file and the key it gives."""
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in skip}
        for name in self.data:
            if name not in fields:
                raise self.error(name, unknown_key(name, fields))
        for name, f in fields.items():
            no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if name not in self.data and (no_default or (all_required and f.default is not None)):
                raise self.error(name, "missing")
        values = {}
        for name, value in self.data.items():
            annotation = fields[name].type if isinstance(fields[name].type, str) else ""
            if _matches(value, annotation) is False:
                raise self.error(name, f"expected {_expected(annotation)}, got {_describe(value)}")
            if not _finite(value):
                raise self.error(name, f"expected a finite number, got {value!r}")
            try:
                declared = _as_declared(value, annotation)
            except OverflowError:  # an integer past a float's range where the field is a float
                digits = f"about {int(value.bit_length() * math.log10(2)) + 1:,}" if isinstance(value, int) else "many"
                raise self.error(name, "expected a number a float can hold (at most about 1.8e308), got an integer "
                                       f"of {digits} digits") from None  # (str() of one past 4,300 digits raises)
            values[name] = (convert or {}).get(name, lambda v: v)(declared)
        self.used.update(values)
        try:
            return cls(**values)
        except OdmaError as exc:
            key = self.key(exc.key) if exc.key else None
            raise self.error_type(exc.message, file=self.file if self.file is not None else exc.file, key=key,
                                  hint=exc.hint) from None
