"""Shared reading helpers: gzip-aware opening, CSV / JSON-lines scans with precise diagnostics,
numeric and timestamp conversion into the SourceFrame conventions (see odmactl.trace.schema.SourceFrame)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.core.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"  # some editors (and Excel) start UTF-8 text with it; it is not part of the data


def require_file(path: Path) -> None:
    if not path.exists():
        raise TraceError("no such file", file=path)
    if path.is_dir():
        raise TraceError("is a directory, expected a trace file", file=path)
    if path.stat().st_size == 0:
        raise TraceError("the file is empty", file=path)


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def read_bytes(path: Path) -> bytes:
    """Whole file, gunzipped if needed; a truncated or corrupt gzip is a TraceError."""
    require_file(path)
    data = path.read_bytes()
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(f"truncated or corrupt gzip data ({exc})", file=path) from exc
    data = data.removeprefix(UTF8_BOM)
    if not data.strip():
        raise TraceError("the file is empty", file=path)
    return data


def text_lines(path: Path) -> Iterator[str]:
    yield from io.StringIO(read_bytes(path).decode("utf-8", errors="replace"))


def peek_text(path: Path, nbytes: int = 65536) -> str:
    """The first bytes of a (possibly gzipped) file as text, for format detection."""
    require_file(path)
    try:
        with (gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")) as fh:
            return fh.read(nbytes).decode("utf-8-sig", errors="replace")  # -sig: a leading BOM is dropped
    except (EOFError, OSError, zlib.error) as exc:
        raise TraceError(f"truncated or corrupt gzip data ({exc})", file=path) from exc


def _polars_error(path: Path, exc: Exception) -> TraceError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
    if isinstance(exc, (EOFError, zlib.error)) or "end of file" in text or "gzip" in text.lower() or "deflate" in text.lower():
        return TraceError(f"truncated or corrupt gzip data ({text})", file=path)
    return TraceError(f"could not be read ({text})", file=path)


def _diagnose_csv(path: Path, exc: Exception) -> TraceError:
    """The record a CSV read failed on (1-based, header excluded) and what is wrong with it, found
    by Python's strict csv reader; polars's own message when that reader sees nothing wrong."""
    reader = csv.reader(text_lines(path), strict=True)
    try:
        width = len(next(reader))
        for number, record in enumerate(reader, start=1):
            if record and len(record) != width:
                return TraceError(f"expected {width} fields as in the header, found {len(record)}", file=path,
                                  row=number)
    except csv.Error as error:
        return TraceError(f"malformed CSV near line {reader.line_num} ({error}; a quote opened and never closed?)",
                          file=path)
    return _polars_error(path, exc)


def csv_header(path: Path) -> list[str]:
    first = peek_text(path).splitlines()
    if not first or not first[0].strip():
        raise TraceError("the file is empty", file=path)
    names = [c.strip().strip('"') for c in first[0].split(",")]
    twice = next((c for i, c in enumerate(names) if c and c in names[:i]), None)
    if twice is not None:
        raise TraceError("this column appears twice in the header; which one holds the data is ambiguous", file=path,
                         column=twice, hint="rename one of them")
    return names


def require_columns(path: Path, present: list[str], required: list[str], fmt: str) -> None:
    for name in required:
        if name not in present:
            raise TraceError(
                f"missing column required by format '{fmt}' (found: {', '.join(present) or 'none'})",
                file=path, column=name,
            )


def scan_csv(path: Path, columns: list[str], *, as_text: bool = False) -> pl.DataFrame:
    """Read `columns` of a CSV (gzip transparently) with `_row`; only those columns are kept in memory.

    The fast path lets polars type the numbers; if a value does not parse, the file is read again
    with every column as text so validation can name the row and show the value.
    """
    require_file(path)
    kwargs = dict(infer_schema=False) if as_text else dict(infer_schema_length=10000)
    try:
        lf = pl.scan_csv(path, **kwargs, raise_if_empty=True, glob=False).select(columns)  # a name is a name
        lf = lf.with_row_index("_row", offset=1).with_columns(pl.col("_row").cast(pl.Int64))
        lf = lf.filter(~pl.all_horizontal(pl.col(c).is_null() for c in columns))  # blank lines are not records
        return lf.collect()
    except pl.exceptions.NoDataError as exc:
        raise TraceError("the file is empty", file=path) from exc
    except pl.exceptions.ComputeError as exc:
        if "fields" in str(exc) or "quote" in str(exc) or (as_text and "parse" in str(exc)):
            raise _diagnose_csv(path, exc) from exc
        if as_text or "parse" not in str(exc):
            raise _polars_error(path, exc) from exc
        return scan_csv(path, columns, as_text=True)
    except (OSError, EOFError, pl.exceptions.PolarsError) as exc:
        raise _polars_error(path, exc) from exc


def json_records(path: Path) -> list[tuple[int, dict]]:
    """Every non-blank line parsed as a JSON object, with its line number; a broken line is named."""
    records = []
    for number, line in enumerate(text_lines(path), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"broken JSON line ({exc.msg} at character {exc.pos + 1})", file=path, row=number) from exc
        except RecursionError:
            raise TraceError("the JSON line is nested too deeply to read", file=path, row=number) from None
        if not isinstance(value, dict):
            raise TraceError(f"expected a JSON object per line, got {type(value).__name__}", file=path, row=number)
        records.append((number, value))
    return records


def _json_kinds(value: object, path: str) -> Iterator[tuple[str, str]]:
    """(path, kind) for a JSON value and everything in it: `path` the column, with ".key" into an
    object and "[]" into a list's items; kind as a message names it ("an object", "a list", "a
    number", ...). null gives nothing (any column takes it)."""
    if value is None:
        return
    if isinstance(value, dict):
        yield path, "an object"
        for key, item in value.items():
            yield from _json_kinds(item, f"{path}.{key}")
    elif isinstance(value, list):
        yield path, "a list"
        for item in value:
            yield from _json_kinds(item, f"{path}[]")
    elif isinstance(value, bool):
        yield path, "true/false"
    elif isinstance(value, float) and math.isnan(value):
        yield path, "NaN"
    elif isinstance(value, float) and math.isinf(value):
        yield path, "an infinite number (Infinity, or past a float's range)"
    elif isinstance(value, int) and not -2 ** 63 <= value < 2 ** 64:
        yield path, "an integer past 64 bits"
    else:
        yield path, "a number" if isinstance(value, (int, float)) else "text"


_UNREADABLE = ("NaN", "an infinite number (Infinity, or past a float's range)", "an integer past 64 bits")
_TOGETHER = {"a number", "text"}  # kinds one column may mix: polars reads it as text, and the checks name the value


def _diagnose_jsonl(path: Path) -> TraceError:
    """Why polars could not read a JSON-lines file, with its line and column: bytes that are not
    UTF-8, a broken line, a value no column type holds (NaN, Infinity, an integer past 64 bits), or
    a column (or a field or list item in it) whose values change kind from one line to another
    (a number on line 1, true or a list later). Every column counts: polars types all of them."""
    data = read_bytes(path)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return TraceError(f"not UTF-8 text (byte 0x{data[exc.start]:02x})", file=path, row=line)
    try:
        records = json_records(path)
    except TraceError as exc:
        return exc
    first: dict[str, tuple[str, int]] = {}
    for number, record in records:
        for key, value in record.items():
            for where, kind in _json_kinds(value, key):
                if kind in _UNREADABLE:
                    return TraceError(f"holds {kind}, which no column type holds", file=path, row=number,
                                      column=where)
                seen, line = first.setdefault(where, (kind, number))
                if kind != seen and {kind, seen} != _TOGETHER:
                    return TraceError(f"holds {kind} where line {line} holds {seen}: a column takes one kind of "
                                      "value", file=path, row=number, column=where)
    return TraceError("could not be read as JSON lines", file=path)


def scan_jsonl(path: Path, columns: list[str], infer_rows: int | None = 10000) -> pl.DataFrame:
    """Read `columns` of a JSON-lines file with `_row` (the line number); a broken line is named.
    The columns' types are inferred from the first `infer_rows` lines (None: all of them, for a
    column such as Mooncake's hash_ids that may first appear late)."""
    require_file(path)
    data = read_bytes(path)
    try:
        lf = pl.scan_ndjson(io.BytesIO(data), infer_schema_length=infer_rows)
        present = lf.collect_schema().names()
        lf = lf.select([c for c in columns if c in present])
        frame = lf.with_row_index("_row", offset=1).with_columns(pl.col("_row").cast(pl.Int64)).collect()
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise _diagnose_jsonl(path) from exc
    lines = data.rstrip(b"\n").split(b"\n")  # JSON text may hold U+2028 etc.: split on newlines only
    if any(not line.strip() for line in lines):
        # polars skips blank lines; recompute line numbers so rows point at the file
        numbers = [i for i, line in enumerate(lines, 1) if line.strip()]
        frame = frame.with_columns(pl.Series("_row", numbers[: frame.height], dtype=pl.Int64))
    return frame


def require_scalar_columns(path: Path, frame: pl.DataFrame, mapping: dict[str, str]) -> None:
    """Every mapped source column holds single values (numbers, text, times), not lists or records."""
    for canonical, source in mapping.items():
        dtype = frame[source].dtype
        if dtype.is_nested() or dtype in (pl.Binary, pl.Object):
            raise TraceError(f"expected one value per row for {canonical}, got a column of type {dtype}",
                             file=path, column=source)


def numeric(frame: pl.DataFrame, source: str, canonical: str) -> list[pl.Expr]:
    """Expressions for a canonical numeric column (Float64, null if not a number) and its raw text."""
    dtype = frame[source].dtype
    if dtype.is_numeric():
        return [pl.col(source).cast(pl.Float64).alias(canonical)]
    if dtype == pl.Null:
        return [pl.lit(None, pl.Float64).alias(canonical)]
    text = pl.col(source).cast(pl.String)
    return [
        text.str.strip_chars().cast(pl.Float64, strict=False).alias(canonical),
        text.alias(f"_raw_{canonical}"),
    ]


@dataclass(frozen=True)
class TimestampPlan:
    """How to turn a timestamp column into `arrival` (Float64 seconds) in two lazy steps.

    `parts` are pure expressions evaluated alongside the other columns (polars runs them in
    parallel); `combine` then builds `arrival` from them and `scratch` names the parts to drop.
    """

    parts: list[pl.Expr]
    combine: list[pl.Expr]
    scratch: list[str]
    clock: str

    def apply(self, lf: pl.LazyFrame) -> pl.LazyFrame:
        return lf.with_columns(self.combine).drop(self.scratch) if self.combine else lf


def timestamp_seconds(frame: pl.DataFrame, source: str, *, unit_s: float = 1.0) -> TimestampPlan:
    """The plan for `arrival` (Float64 seconds) from a timestamp column, and its clock.

    Numbers are taken as a relative clock in `unit_s` seconds, and so is a text column whose first
    value is a number (numbers mixed with text in JSON, or a CSV re-read as text because a value
    did not parse): the values that are not numbers are null, with their text in `_raw_arrival`,
    so the message names the row at fault. Other text is parsed as a date-time on a
    fast fixed-width path ("YYYY-MM-DD HH:MM:SS[.fffffff]": whole seconds and the fraction as two
    parallel parts) and is an absolute clock; values that path cannot read are null, with the text
    kept in `_raw_arrival`, and `fill_iso_arrivals` then tries the general ISO-8601 parser on them.
    """
    col = frame[source]
    if col.dtype.is_numeric():
        return TimestampPlan([(pl.col(source).cast(pl.Float64) * unit_s).alias("arrival")], [], [], "relative")
    if isinstance(col.dtype, pl.Duration):  # time since some start: a relative clock
        seconds = pl.col(source).dt.total_microseconds().cast(pl.Float64) / 1e6
        return TimestampPlan([seconds.alias("arrival")], [], [], "relative")
    if isinstance(col.dtype, (pl.Datetime, pl.Date)):  # a typed date-time: an absolute clock
        seconds = pl.col(source).cast(pl.Datetime("us")).dt.epoch("us").cast(pl.Float64) / 1e6
        return TimestampPlan([seconds.alias("arrival")], [], [], "absolute")
    text = pl.col(source).cast(pl.String)
    first = frame.select(text.drop_nulls().first().str.strip_chars().cast(pl.Float64, strict=False)).item()
    if first is not None:
        seconds = text.str.strip_chars().cast(pl.Float64, strict=False) * unit_s
        return TimestampPlan([seconds.alias("arrival"), text.alias("_raw_arrival")], [], [], "relative")
    # busy traces repeat each whole second many times: parsing each distinct second once is about
    # twice as fast there, and 2.5x slower when every value differs, so look at a sample first
    sample = frame.select(text.head(10_000).str.slice(0, 19).alias("s"))["s"]
    repeats = sample.len() >= 100 and sample.n_unique() * 2 <= sample.len()
    whole = text.str.slice(0, 19).str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, cache=repeats, time_unit="us")
    parts = [
        (whole.dt.epoch("us").cast(pl.Float64) / 1e6).alias("_ts_whole"),
        text.str.slice(19).cast(pl.Float64, strict=False).alias("_ts_frac"),
        (text.str.len_bytes() > 19).alias("_ts_has_frac"),
        text.alias("_raw_arrival"),
    ]
    junk = pl.col("_ts_frac").is_null() & pl.col("_ts_has_frac")  # trailing text that is not a fraction
    arrival = pl.when(junk).then(None).otherwise(pl.col("_ts_whole") + pl.col("_ts_frac").fill_null(0.0))
    return TimestampPlan(parts, [arrival.alias("arrival")], ["_ts_whole", "_ts_frac", "_ts_has_frac"], "absolute")


def fill_iso_arrivals(frame: pl.DataFrame) -> pl.DataFrame:
    """Fill the arrivals the fast path of `timestamp_seconds` left null from their ISO-8601 text."""
    if "_raw_arrival" not in frame.columns or not frame["arrival"].null_count():
        return frame
    text = frame.select(pl.col("_raw_arrival").str.strip_chars())["_raw_arrival"]
    return frame.with_columns(_iso_fallback(frame["arrival"], text))


def _iso_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def _iso_fallback(seconds: pl.Series, text: pl.Series) -> pl.Series:
    """Fill what the fast path missed with Python's ISO-8601 parser (T separator, Z, +hh:mm offsets)."""
    missing = seconds.is_null().to_numpy().nonzero()[0]
    values = seconds.to_numpy().copy() if seconds.dtype == pl.Float64 else seconds.cast(pl.Float64).to_numpy().copy()
    for i in missing:
        parsed = _iso_seconds(text[int(i)])
        values[i] = np.nan if parsed is None else parsed
    out = pl.Series("arrival", values)
    return out.set(out.is_nan(), None)
