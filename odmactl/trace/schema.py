"""The canonical trace: schema, validation, arrival assignment and atomic parquet writing.

Readers (odmactl/readers/) turn each source file into a `SourceFrame`; `build_trace` validates them
against the file they came from (so errors name that file's row and column), concatenates them,
assigns arrivals, sorts and hands back one canonical DataFrame with its metadata.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from odmactl import __version__
from odmactl.core.atomic import atomic_output
from odmactl.core.errors import TraceError
from odmactl.core.limits import check_seed

SCHEMA_VERSION = 1
SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.String(),
    "arrival_s": pl.Float64(),
    "prompt_tokens": pl.Int32(),
    "output_tokens": pl.Int32(),
    "prompt_text": pl.String(),
    "model": pl.String(),
    "tenant": pl.String(),
}
# Optional: each prompt's prefix block hashes (chained: a hash names its block and all before it) and
# the tokens per hashed block, as Mooncake's traces carry them (allocator/prefix.py reads them);
# a trace without them has neither column, a row without them a null list.
PREFIX_SCHEMA: dict[str, pl.DataType] = {"prefix_hashes": pl.List(pl.Int64), "prefix_block_tokens": pl.Int32()}
TOKEN_COLUMNS = ("prompt_tokens", "output_tokens")
TEXT_COLUMNS = ("prompt_text", "model", "tenant")
INT32_MAX = 2**31 - 1
META_KEY = "odmactl"

ProgressFn = Callable[[str, int, int], None]


@dataclass
class SourceFrame:
    """One source file read into canonical column names, not yet validated.

    Invariants: `frame` has `_row` (Int64, 1-based record number in the source, header excluded),
    `prompt_tokens` and `output_tokens` (Float64; null = missing or not a number, with the raw text
    in `_raw_<column>` when the source held text there), and optionally `request_id` (String),
    `arrival` (Float64 seconds on `clock`), `prompt_text`, `model`, `tenant` (String).
    `columns` maps each canonical column to the source's own name for it, for error messages.
    `clock` is "absolute" (epoch seconds, shared between sources), "relative" (seconds from the
    source's own origin) or "none" (the source has no timestamps).
    """

    path: Path
    format: str
    frame: pl.DataFrame
    clock: str
    columns: dict[str, str]
    excluded: dict[str, int] = field(default_factory=dict)
    token_source: str = "source"
    tokenizer: str | None = None
    notes: list[str] = field(default_factory=list)
    params: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ArrivalOptions:
    """How requests without timestamps get arrivals: Poisson at `rate_per_s`, or all at 0."""

    rate_per_s: float | None = None
    offline: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if self.rate_per_s is not None and not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise TraceError(f"--rate must be a positive number of requests per second, got {self.rate_per_s}")
        if self.offline and self.rate_per_s is not None:
            raise TraceError("--offline and --rate exclude each other")

    def require_for(self, path: Path) -> None:
        """Raise the error a source without timestamps gets when neither --rate nor --offline is given."""
        if self.rate_per_s is None and not self.offline:
            raise TraceError("has no timestamps", file=path,
                             hint="pass --rate R for Poisson arrivals at R requests/s, or --offline for all at t=0")


@dataclass
class BuiltTrace:
    """A validated canonical trace (columns exactly SCHEMA, arrival_s non-decreasing from 0,
    request_id unique) plus what happened on the way, for the summary and the parquet metadata."""

    frame: pl.DataFrame
    sources: list[dict[str, object]]
    moved_rows: int
    arrival_note: str

    def summary(self, out: Path, format_detected: bool) -> dict:
        """What `odmactl ingest` reports about the trace it wrote to `out`."""
        frame = self.frame
        return {
            "out": str(out),
            "format_detected": format_detected,
            "sources": self.sources,
            "requests": frame.height,
            "duration_s": float(frame["arrival_s"].max()),
            "total_prompt_tokens": int(frame["prompt_tokens"].cast(int).sum()),
            "total_output_tokens": int(frame["output_tokens"].cast(int).sum()),
            "moved_rows": self.moved_rows,
            "arrivals": self.arrival_note,
        }


def _first_row(frame: pl.DataFrame, mask: pl.Expr) -> dict | None:
    hit = frame.filter(mask).head(1)
    return hit.row(0, named=True) if hit.height else None


def _validate_tokens(sf: SourceFrame, column: str) -> None:
    src = sf.columns.get(column, column)
    value = pl.col(column)
    raw = f"_raw_{column}"
    has_raw = raw in sf.frame.columns
    row = _first_row(sf.frame, value.is_null())
    if row is not None:
        got = row.get(raw) if has_raw else None
        what = f"got '{got}'" if got not in (None, "") else "the value is missing"
        raise TraceError(f"expected an integer token count >= 1, {what}", file=sf.path, row=row["_row"], column=src)
    checks = [
        (value.is_nan(), "got NaN"),
        (value.is_infinite(), "got an infinite value"),
        (value != value.floor(), "got a fractional value"),
        (value < 1, "got a value below 1"),
        (value > INT32_MAX, "got a value above 2^31-1"),
    ]
    for mask, what in checks:
        row = _first_row(sf.frame, mask)
        if row is not None:
            got, text = row[column], row.get(raw) if has_raw else None
            # as written where the source had text; a whole number in full only below 1e15 (1e30 was
            # printed as 1000000000000000019884624838656, a float's digits the file never had)
            shown = text if text not in (None, "") else \
                int(got) if math.isfinite(got) and got == int(got) and abs(got) < 1e15 else f"{got:g}"
            raise TraceError(f"expected an integer token count >= 1, {what} ({shown})", file=sf.path, row=row["_row"], column=src)


def validate_source(sf: SourceFrame) -> None:
    """Raise TraceError at the first bad value of a source, naming its file, row and column."""
    if sf.frame.height == 0:
        raise TraceError("no data rows", file=sf.path, hint="the file holds a header or nothing at all")
    token_bad = [(pl.col(c).is_null() | ~pl.col(c).is_finite() | (pl.col(c) != pl.col(c).floor())
                  | (pl.col(c) < 1) | (pl.col(c) > INT32_MAX)).any().alias(c) for c in TOKEN_COLUMNS]
    time_bad = [(pl.col("arrival").is_null() | ~pl.col("arrival").is_finite()).any().alias("arrival")] \
        if "arrival" in sf.frame.columns else []
    flags = sf.frame.select(token_bad + time_bad).row(0, named=True)  # one pass; details only on failure
    for column in TOKEN_COLUMNS:
        if flags[column]:
            _validate_tokens(sf, column)
    if flags.get("arrival"):
        src = sf.columns.get("arrival", "arrival")
        row = _first_row(sf.frame, pl.col("arrival").is_null())
        if row is not None:
            got = row.get("_raw_arrival")
            what = f"could not parse '{got}'" if got not in (None, "") else "the value is missing"
            if sf.clock == "relative" and got not in (None, ""):  # a date among numbers is not a second clock
                what = f"could not parse '{got}' as seconds, which the column's first value is (a relative clock)"
            raise TraceError(f"expected a timestamp, {what}", file=sf.path, row=row["_row"], column=src)
        row = _first_row(sf.frame, ~pl.col("arrival").is_finite())
        if row is not None:
            raise TraceError(f"expected a finite timestamp, got {row['arrival']}", file=sf.path, row=row["_row"], column=src)
    _validate_prefix(sf)
    if "request_id" in sf.frame.columns:
        src = sf.columns.get("request_id", "request_id")
        row = _first_row(sf.frame, pl.col("request_id").is_null() | (pl.col("request_id") == ""))
        if row is not None:
            raise TraceError("expected a request id, the value is missing", file=sf.path, row=row["_row"], column=src)
        if sf.frame["request_id"].n_unique() != sf.frame.height:
            dup = sf.frame.filter(pl.col("request_id").is_duplicated()).head(2)
            rows = dup["_row"].to_list()
            raise TraceError(
                f"duplicate request id '{dup['request_id'][0]}' (also at row {rows[0]})",
                file=sf.path, row=rows[1], column=src,
            )


def _validate_prefix(sf: SourceFrame) -> None:
    """Prefix hashes: at most one per block of the prompt, with a block size >= 1."""
    if "prefix_hashes" not in sf.frame.columns:
        return
    src = sf.columns.get("prefix_hashes", "prefix_hashes")
    block = pl.col("prefix_block_tokens")
    has = pl.col("prefix_hashes").is_not_null() & (pl.col("prefix_hashes").list.len() > 0)
    row = _first_row(sf.frame, has & (block.is_null() | (block < 1)))
    if row is not None:
        raise TraceError(f"expected a prefix block size >= 1 tokens, got {row['prefix_block_tokens']}", file=sf.path,
                         row=row["_row"], column="prefix_block_tokens")
    row = _first_row(sf.frame, has & (pl.col("prefix_hashes").list.drop_nulls().list.len()
                                      < pl.col("prefix_hashes").list.len()))
    if row is not None:
        raise TraceError("expected integer prefix hashes, found a missing one", file=sf.path, row=row["_row"], column=src)
    first = _first_row(sf.frame, has)
    if first is not None:
        row = _first_row(sf.frame, has & (block != first["prefix_block_tokens"]))
        if row is not None:
            raise TraceError(f"a prefix block of {row['prefix_block_tokens']} tokens where row {first['_row']} has "
                             f"{first['prefix_block_tokens']}: expected one block size in a trace (a replay caches "
                             "in one)", file=sf.path, row=row["_row"], column="prefix_block_tokens")
    blocks = (pl.col("prompt_tokens") / block.cast(pl.Float64)).ceil()
    row = _first_row(sf.frame, has & (pl.col("prefix_hashes").list.len().cast(pl.Float64) > blocks))
    if row is not None:
        raise TraceError(f"{len(row['prefix_hashes'])} prefix hashes for {int(row['prompt_tokens']):,} prompt tokens in "
                         f"{row['prefix_block_tokens']}-token blocks: expected at most one hash per block",
                         file=sf.path, row=row["_row"], column=src)


def _namespaced(frames: list[pl.DataFrame]) -> list[pl.DataFrame]:
    """Sources that each carry prefix hashes number them on their own: each source's hashes become
    ids no other source uses (in order of first appearance), so two sources never share a prefix."""
    carrying = ["prefix_hashes" in f.columns and f["prefix_hashes"].null_count() < f.height for f in frames]
    if sum(carrying) < 2:
        return frames
    out, next_id = [], 0
    for f, carries in zip(frames, carrying):
        if carries:
            ids: dict[int, int] = {}
            rows = []
            for row in f["prefix_hashes"].to_list():
                rows.append(None if row is None else [ids.setdefault(x, next_id + len(ids)) for x in row])
            next_id += len(ids)
            f = f.with_columns(pl.Series("prefix_hashes", rows, dtype=pl.List(pl.Int64)))
        out.append(f)
    return out


def _arrivals(sources: list[SourceFrame], opts: ArrivalOptions) -> tuple[list[pl.Series], str]:
    """Seconds since the trace's first request, per source, and a sentence on how they were set."""
    absolute = [sf.frame["arrival"].min() for sf in sources if sf.clock == "absolute"]
    origin_abs = min(absolute) if absolute else 0.0
    untimed = [sf for sf in sources if sf.clock == "none"]
    if untimed:
        opts.require_for(untimed[0].path)
    rng = np.random.default_rng(opts.seed)
    out: list[pl.Series] = []
    for sf in sources:
        if sf.clock == "absolute":
            out.append(sf.frame["arrival"] - origin_abs)
        elif sf.clock == "relative":
            out.append(sf.frame["arrival"] - sf.frame["arrival"].min())
        elif opts.offline:
            out.append(pl.Series(np.zeros(sf.frame.height)))
        else:
            gaps = rng.exponential(1.0 / opts.rate_per_s, sf.frame.height)
            out.append(pl.Series(np.concatenate([[0.0], np.cumsum(gaps[1:])])))
        bad = np.flatnonzero(~np.isfinite(out[-1].to_numpy()))
        if bad.size:
            row = int(sf.frame["_row"][int(bad[0])])
            raise TraceError("the timestamps span more than a float holds (an overflow measured from the earliest "
                             "request); expected timestamps in seconds within the float range", file=sf.path, row=row,
                             column=sf.columns.get("arrival", "arrival"))
    parts = []
    if absolute:
        parts.append("absolute timestamps share one clock from the earliest request")
    if any(sf.clock == "relative" for sf in sources):
        parts.append("relative timestamps start at 0 per source")
    if untimed:
        parts.append("all at t=0 (--offline)" if opts.offline else f"Poisson arrivals at {opts.rate_per_s:g} req/s (seed {opts.seed})")
    return out, "; ".join(parts)


def _canonical(sf: SourceFrame, arrival_s: pl.Series, index: int, multi: bool, prefix: bool) -> pl.DataFrame:
    f = sf.frame
    if "request_id" in f.columns:
        rid = pl.col("request_id")
    else:
        rid = pl.col("_row").cast(pl.String)
        if multi:
            rid = pl.lit(f"{index}:") + rid
    exprs = [
        rid.alias("request_id"),
        pl.lit(arrival_s.cast(pl.Float64)).alias("arrival_s"),
        pl.col("prompt_tokens").cast(pl.Int32),
        pl.col("output_tokens").cast(pl.Int32),
    ]
    for c in TEXT_COLUMNS:
        exprs.append((pl.col(c).cast(pl.String) if c in f.columns else pl.lit(None, pl.String)).alias(c))
    if prefix:  # some source has prefix hashes: every source gets the columns
        for c, dtype in PREFIX_SCHEMA.items():
            exprs.append((pl.col(c).cast(dtype) if c in f.columns else pl.lit(None, dtype)).alias(c))
    return f.lazy().select(exprs).collect()  # columns in parallel


def _moved_rows(arrival_s: np.ndarray) -> int:
    """How many rows arrive earlier than some row before them (0 for a sorted trace, checked cheaply)."""
    if arrival_s.size < 2 or not (arrival_s[1:] < arrival_s[:-1]).any():
        return 0
    return int((arrival_s[1:] < np.maximum.accumulate(arrival_s)[:-1]).sum())


def build_trace(sources: list[SourceFrame], arrivals: ArrivalOptions) -> BuiltTrace:
    for sf in sources:
        validate_source(sf)
    arrival_s, note = _arrivals(sources, arrivals)
    multi = len(sources) > 1
    prefix = any("prefix_hashes" in sf.frame.columns for sf in sources)
    frame = pl.concat(_namespaced([_canonical(sf, a, i, multi, prefix) for i, (sf, a) in enumerate(zip(sources, arrival_s))]))
    if multi and frame["request_id"].n_unique() != frame.height:
        dup = frame.filter(pl.col("request_id").is_duplicated())["request_id"][0]
        raise TraceError(f"request id '{dup}' occurs in more than one source", file=", ".join(str(s.path) for s in sources))
    if prefix:
        sizes = {(s.path, b) for s in sources if "prefix_block_tokens" in s.frame.columns
                 for b in s.frame.filter(pl.col("prefix_hashes").list.len() > 0)["prefix_block_tokens"].unique()}
        if len({b for _, b in sizes}) > 1:
            raise TraceError("the sources' prefix hashes come in blocks of "
                             + " and ".join(f"{b} tokens ({p})" for p, b in sorted(sizes, key=lambda x: x[1]))
                             + ": expected one block size in a trace (a replay caches in one)",
                             file=", ".join(str(s.path) for s in sources),
                             hint="ingest them into separate traces")
    moved = _moved_rows(frame["arrival_s"].to_numpy())
    if moved:
        frame = frame.sort("arrival_s", maintain_order=True)
    meta = [
        {
            "path": str(sf.path),
            "format": sf.format,
            "rows": sf.frame.height,
            "excluded": dict(sorted(sf.excluded.items())),
            "token_source": sf.token_source,
            "tokenizer": sf.tokenizer,
            "notes": list(sf.notes),
            "params": dict(sf.params),
        }
        for sf in sources
    ]
    return BuiltTrace(frame=frame, sources=meta, moved_rows=moved, arrival_note=note)


def trace_metadata(trace: BuiltTrace) -> dict[str, str]:
    tokenizers = sorted({s["tokenizer"] for s in trace.sources if s["tokenizer"]})
    return {
        f"{META_KEY}.version": __version__,
        f"{META_KEY}.schema_version": str(SCHEMA_VERSION),
        f"{META_KEY}.sources": json.dumps(trace.sources, sort_keys=True),
        f"{META_KEY}.formats": ",".join(s["format"] for s in trace.sources),
        f"{META_KEY}.tokenizer": ",".join(tokenizers) if tokenizers else "none",
        f"{META_KEY}.arrivals": trace.arrival_note,
        f"{META_KEY}.moved_rows": str(trace.moved_rows),
    }


def write_trace(trace: BuiltTrace, out: Path, *, force: bool) -> None:
    with atomic_output(out, force=force) as tmp:
        # lz4 and no row-group statistics: traces are read whole; measured 0.27 s -> 0.17 s on 2M rows
        trace.frame.write_parquet(tmp, metadata=trace_metadata(trace), compression="lz4", statistics=False)


def read_metadata(path: Path) -> dict[str, str]:
    try:
        with open(path, "rb") as fh:  # a file object, so no glob is expanded from the name
            meta = pl.read_parquet_metadata(fh)
    except OSError as exc:
        raise TraceError(f"cannot be read: {exc.strerror or exc}", file=path) from exc
    except Exception as exc:  # polars raises several kinds for a non-parquet file
        raise TraceError(f"not a readable parquet file ({exc.__class__.__name__})", file=path) from exc
    return {k[len(META_KEY) + 1:]: v for k, v in meta.items() if k.startswith(META_KEY + ".")}


def read_trace(path: Path) -> pl.DataFrame:
    """Load a canonical trace written by `odmactl ingest` (or by hand) and check its invariants."""
    path = Path(path)
    if path.is_dir():
        raise TraceError("is a directory, expected a parquet file", file=path, hint="run `odmactl ingest` to make one")
    if not path.is_file():
        raise TraceError("no such file" if not path.exists() else "is not a regular file (a device, FIFO or socket), "
                         "expected a parquet file", file=path)
    try:
        frame = pl.read_parquet(path, glob=False)  # `*`, `?` and `[` in a file name are characters, not a pattern
    except Exception as exc:
        raise TraceError(f"not a readable parquet file ({exc.__class__.__name__})", file=path,
                         hint="run `odmactl ingest` to make one") from exc
    for name, dtype in SCHEMA.items():
        if name not in frame.columns:
            raise TraceError("missing column of the canonical schema", file=path, column=name,
                             hint="run `odmactl ingest` to normalize the trace")
        if frame[name].dtype != dtype and not (frame[name].dtype == pl.Null and name in TEXT_COLUMNS):
            raise TraceError(f"expected type {dtype}, found {frame[name].dtype}", file=path, column=name)
    optional = [name for name in PREFIX_SCHEMA if name in frame.columns]
    if optional and len(optional) < len(PREFIX_SCHEMA):
        missing = next(name for name in PREFIX_SCHEMA if name not in frame.columns)
        raise TraceError(f"prefix hashes need both {' and '.join(PREFIX_SCHEMA)}", file=path, column=missing)
    for name in optional:
        if frame[name].dtype != PREFIX_SCHEMA[name]:
            raise TraceError(f"expected type {PREFIX_SCHEMA[name]}, found {frame[name].dtype}", file=path, column=name)
    frame = frame.select(list(SCHEMA) + optional).with_row_index("_row", offset=1).with_columns(pl.col("_row").cast(pl.Int64))
    sf = SourceFrame(path=path, format="parquet", frame=frame.with_columns(
        pl.col("prompt_tokens").cast(pl.Float64), pl.col("output_tokens").cast(pl.Float64),
        pl.col("arrival_s").alias("arrival")), clock="relative", columns={"arrival": "arrival_s"})
    validate_source(sf)
    row = _first_row(frame, pl.col("arrival_s") < pl.col("arrival_s").shift(1))
    if row is not None:
        raise TraceError("arrival_s decreases here; a canonical trace is sorted by arrival", file=path,
                         row=row["_row"], column="arrival_s")
    return frame.drop("_row")
