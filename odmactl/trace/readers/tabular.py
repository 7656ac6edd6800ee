"""Readers for request traces that carry token counts: Azure, BurstGPT, Mooncake, Vidur, and the
generic csv / jsonl / parquet with a --map column mapping."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from odmactl.core.errors import TraceError
from odmactl.trace.readers.common import (
    TimestampPlan,
    csv_header,
    fill_iso_arrivals,
    numeric,
    require_columns,
    require_file,
    require_scalar_columns,
    scan_csv,
    scan_jsonl,
    timestamp_seconds,
)
from odmactl.trace.readers.options import ReadOptions
from odmactl.trace.schema import SourceFrame

CANONICAL_INPUTS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "prompt_text", "model", "tenant")


def _frame(path: Path, fmt: str, raw: pl.DataFrame, mapping: dict[str, str], *, ts_unit_s: float = 1.0) -> SourceFrame:
    """Build a SourceFrame from `raw` whose source columns are named by `mapping` (canonical -> source)."""
    require_scalar_columns(path, raw, mapping)
    exprs: list[pl.Expr] = [pl.col("_row")]
    exprs += numeric(raw, mapping["prompt_tokens"], "prompt_tokens")
    exprs += numeric(raw, mapping["output_tokens"], "output_tokens")
    plan = TimestampPlan([], [], [], "none")
    columns = dict(mapping)
    if "arrival_s" in mapping:
        plan = timestamp_seconds(raw, mapping["arrival_s"], unit_s=ts_unit_s)
        exprs += plan.parts
        columns["arrival"] = mapping["arrival_s"]
    if "request_id" in mapping:
        exprs.append(pl.col(mapping["request_id"]).cast(pl.String).alias("request_id"))
    for name in ("prompt_text", "model", "tenant"):
        if name in mapping:
            exprs.append(pl.col(mapping[name]).cast(pl.String).alias(name))
    frame = plan.apply(raw.lazy().select(exprs)).collect()  # columns in parallel
    if plan.clock == "absolute":  # a date-time the fast path could not read; on a relative clock (numbers
        frame = fill_iso_arrivals(frame)  # first), a date among the numbers is an error, not a second clock
    return SourceFrame(path=path, format=fmt, frame=frame, clock=plan.clock, columns=columns)


def read_azure(path: Path, opts: ReadOptions) -> SourceFrame:
    cols = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    require_columns(path, csv_header(path), cols, "azure")
    raw = scan_csv(path, cols)
    mapping = {"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens"}
    return _frame(path, "azure", raw, mapping)


def read_burstgpt(path: Path, opts: ReadOptions) -> SourceFrame:
    cols = ["Timestamp", "Model", "Request tokens", "Response tokens", "Log Type"]
    require_columns(path, csv_header(path), cols, "burstgpt")
    raw = scan_csv(path, cols)
    mapping = {
        "arrival_s": "Timestamp", "model": "Model", "prompt_tokens": "Request tokens",
        "output_tokens": "Response tokens", "tenant": "Log Type",
    }
    sf = _frame(path, "burstgpt", raw, mapping)
    failed = pl.col("output_tokens") == 0
    n_failed = sf.frame.select(failed.sum()).item()
    if n_failed:
        sf.frame = sf.frame.filter(~failed | pl.col("output_tokens").is_null())
        sf.excluded["failed requests (Response tokens = 0)"] = int(n_failed)
    return sf


def read_vidur(path: Path, opts: ReadOptions) -> SourceFrame:
    cols = ["num_prefill_tokens", "num_decode_tokens"]
    require_columns(path, csv_header(path), cols, "vidur")
    raw = scan_csv(path, cols)
    return _frame(path, "vidur", raw, {"prompt_tokens": cols[0], "output_tokens": cols[1]})


MOONCAKE_HASH_BLOCK_TOKENS = 512  # Mooncake FAST25-release/README.md: "hash_ids ... block size 512"


def read_mooncake(path: Path, opts: ReadOptions) -> SourceFrame:
    raw = scan_jsonl(path, ["timestamp", "input_length", "output_length", "hash_ids"], infer_rows=None)
    require_columns(path, raw.columns, ["input_length", "output_length"], "mooncake")
    mapping = {"prompt_tokens": "input_length", "output_tokens": "output_length"}
    if "timestamp" in raw.columns:
        mapping["arrival_s"] = "timestamp"
    sf = _frame(path, "mooncake", raw, mapping, ts_unit_s=1e-3)
    if "hash_ids" in raw.columns:
        sf.frame = sf.frame.with_columns(prefix_hashes(path, raw["hash_ids"], "hash_ids", raw["_row"]),
                                         pl.lit(MOONCAKE_HASH_BLOCK_TOKENS, pl.Int32).alias("prefix_block_tokens"))
        sf.columns["prefix_hashes"] = "hash_ids"
        sf.notes.append(f"hash_ids kept as prefix_hashes ({MOONCAKE_HASH_BLOCK_TOKENS}-token blocks)")
    return sf


def prefix_hashes(path: Path, column: pl.Series, source: str, rows: pl.Series) -> pl.Series:
    """A source's list column of prefix block hashes as the canonical List(Int64) (null: none);
    `rows` the source's record numbers, for the error that names one."""
    dtype = column.dtype
    if dtype == pl.Null:
        return pl.Series("prefix_hashes", [None] * column.len(), dtype=pl.List(pl.Int64))
    if not isinstance(dtype, pl.List) or not (dtype.inner.is_integer() or dtype.inner == pl.Null):
        raise TraceError(f"expected a list of integer block hashes per row (within 64 bits), got a column of type "
                         f"{dtype}", file=path, column=source)
    try:
        return column.cast(pl.List(pl.Int64)).alias("prefix_hashes")
    except pl.exceptions.PolarsError:  # a hash past the signed 64-bit range
        bad = next(i for i, row in enumerate(column.to_list()) if row and any(not -2**63 <= x < 2**63 for x in row
                                                                               if x is not None))
        raise TraceError("expected block hashes within the signed 64-bit range (-2^63 to 2^63-1)", file=path,
                         row=int(rows[bad]), column=source) from None


def _generic_mapping(path: Path, present: list[str], opts: ReadOptions, fmt: str) -> dict[str, str]:
    present = [c for c in present if c != "_row"]  # the reader's record numbers, not the file's
    mapping = {c: c for c in CANONICAL_INPUTS if c in present}
    for canonical, source in opts.column_map.items():
        if canonical not in CANONICAL_INPUTS:
            raise TraceError(f"--map names unknown canonical column '{canonical}' (one of {', '.join(CANONICAL_INPUTS)})")
        if source not in present:
            raise TraceError(f"--map {canonical}={source}: no such column (found: {', '.join(present)})", file=path, column=source)
        mapping[canonical] = source
    for required in ("prompt_tokens", "output_tokens"):
        if required not in mapping:
            raise TraceError(
                f"missing column required by format '{fmt}' (found: {', '.join(present)})", file=path,
                column=required, hint=f"name it with --map {required}=SOURCE_COLUMN",
            )
    return mapping


def read_csv_generic(path: Path, opts: ReadOptions) -> SourceFrame:
    present = csv_header(path)
    mapping = _generic_mapping(path, present, opts, "csv")
    raw = scan_csv(path, sorted(set(mapping.values()), key=present.index))
    return _frame(path, "csv", raw, mapping)


def _with_prefix(sf: SourceFrame, raw: pl.DataFrame) -> SourceFrame:
    """A generic source that names the canonical prefix columns keeps them (a canonical trace
    ingested again, or merged with others, keeps its hashes)."""
    if "prefix_hashes" not in raw.columns:
        return sf
    if "prefix_block_tokens" not in raw.columns:
        raise TraceError("prefix_hashes needs prefix_block_tokens (the tokens per hashed block) beside it",
                         file=sf.path, column="prefix_block_tokens")
    block = raw["prefix_block_tokens"]
    if not (block.dtype.is_integer() or block.dtype == pl.Null):
        raise TraceError(f"expected whole tokens per hashed block, got a column of type {block.dtype}", file=sf.path,
                         column="prefix_block_tokens")
    sf.frame = sf.frame.with_columns(prefix_hashes(sf.path, raw["prefix_hashes"], "prefix_hashes", raw["_row"]),
                                     block.cast(pl.Int32, strict=False).alias("prefix_block_tokens"))
    return sf


def read_jsonl_generic(path: Path, opts: ReadOptions) -> SourceFrame:
    raw = scan_jsonl(path, list(dict.fromkeys(list(CANONICAL_INPUTS) + list(opts.column_map.values())
                                              + ["prefix_hashes", "prefix_block_tokens"])), infer_rows=None)
    mapping = _generic_mapping(path, raw.columns, opts, "jsonl")
    return _with_prefix(_frame(path, "jsonl", raw, mapping), raw)


def read_parquet_generic(path: Path, opts: ReadOptions) -> SourceFrame:
    require_file(path)
    try:
        lf = pl.scan_parquet(path, glob=False)  # `*`, `?` and `[` in a file name are characters, not a pattern
        present = lf.collect_schema().names()
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise TraceError(f"not a readable parquet file ({str(exc).splitlines()[0]})", file=path) from exc
    mapping = _generic_mapping(path, present, opts, "parquet")
    kept = set(mapping.values()) | {c for c in ("prefix_hashes", "prefix_block_tokens") if c in present}
    raw = lf.select(sorted(kept, key=present.index)).with_row_index("_row", offset=1)
    raw = raw.with_columns(pl.col("_row").cast(pl.Int64)).collect(engine="streaming")
    return _with_prefix(_frame(path, "parquet", raw, mapping), raw)
