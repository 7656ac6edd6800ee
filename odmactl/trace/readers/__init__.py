"""Source formats: the FORMATS registry, detection from a file's columns, and `ingest`, which reads
every source and builds one validated canonical trace."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from odmactl.core.errors import TraceError, not_one_of
from odmactl.trace.readers.common import csv_header, peek_text, require_file
from odmactl.trace.readers.options import ReadOptions
from odmactl.trace.readers.servegen import is_servegen_dir, read_servegen
from odmactl.trace.readers.tabular import (
    read_azure,
    read_burstgpt,
    read_csv_generic,
    read_jsonl_generic,
    read_mooncake,
    read_parquet_generic,
    read_vidur,
)
from odmactl.trace.readers.text import read_alpaca, read_alpaca_eval, read_arena_hard
from odmactl.trace.schema import ArrivalOptions, BuiltTrace, SourceFrame, build_trace

Reader = Callable[[Path, ReadOptions], SourceFrame]

FORMATS: dict[str, Reader | None] = {
    "azure": read_azure,
    "burstgpt": read_burstgpt,
    "mooncake": read_mooncake,
    "vidur": read_vidur,
    "alpaca": read_alpaca,
    "alpaca-eval": read_alpaca_eval,
    "arena-hard": None,  # joins question and answer files: read as a group
    "servegen": read_servegen,
    "csv": read_csv_generic,
    "jsonl": read_jsonl_generic,
    "parquet": read_parquet_generic,
}
FORMAT_CHOICES = ["auto", *FORMATS]
UNTIMED_FORMATS = ("vidur", "alpaca", "alpaca-eval", "arena-hard")  # no timestamps: --rate or --offline


def _detect_json(path: Path, text: str) -> str:
    first = text.lstrip()
    if first.startswith("["):
        return "alpaca"
    line = first.split("\n")[0] if first else ""  # not splitlines(): JSON text may hold U+2028
    try:
        keys = set(json.loads(line))
    except (json.JSONDecodeError, TypeError, RecursionError) as exc:
        raise TraceError("could not detect the format: the first line is not a JSON object", file=path, row=1,
                         hint="pass --format") from exc
    if {"input_length", "output_length"} <= keys:
        return "mooncake"
    if {"instruction", "output", "generator"} <= keys:
        return "alpaca-eval"
    if "uid" in keys and ("messages" in keys or "prompt" in keys):
        return "arena-hard"
    if {"prompt_tokens", "output_tokens"} <= keys:
        return "jsonl"
    raise TraceError(f"could not detect the format from the JSON keys ({', '.join(sorted(keys))})", file=path,
                     hint="pass --format, and --map canonical=source for a generic jsonl file")


def detect_format(path: Path, column_map: dict[str, str]) -> str:
    if path.is_dir():
        if is_servegen_dir(path):
            return "servegen"
        raise TraceError("a directory that is not a ServeGen model folder (no chunk-N-trace.csv files)", file=path)
    require_file(path)
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    text = peek_text(path)
    if text.lstrip().startswith(("{", "[")):
        text = peek_text(path, 1 << 24) if "\n" not in text.lstrip() else text
        return _detect_json(path, text)
    header = set(csv_header(path))
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    if {"num_prefill_tokens", "num_decode_tokens"} <= header:
        return "vidur"
    if {"prompt_tokens", "output_tokens"} <= header | set(column_map):
        return "csv"
    shown = ", ".join(sorted(header))[:200]
    raise TraceError(f"could not detect the format from the columns ({shown})", file=path,
                     hint="pass --format, and --map canonical=source for a generic csv file")


def read_sources(paths: list[Path], fmt: str, opts: ReadOptions,
                 arrivals: ArrivalOptions = ArrivalOptions(offline=True)) -> tuple[list[SourceFrame], list[str]]:
    """Read every source; returns the frames and, per source, the format used (detected or given).
    A source format without timestamps needs `arrivals` to say how they are set: checked before
    any source is read (a text dataset's tokenization takes a while)."""
    if fmt not in FORMAT_CHOICES:
        raise TraceError(not_one_of("--format", fmt, FORMAT_CHOICES))
    formats = [detect_format(p, opts.column_map) if fmt == "auto" else fmt for p in paths]
    for path, f in zip(paths, formats):
        if f in UNTIMED_FORMATS:
            arrivals.require_for(path)
    frames: list[SourceFrame] = []
    arena = [p for p, f in zip(paths, formats) if f == "arena-hard"]
    arena_frames = iter(read_arena_hard(arena, opts)) if arena else iter(())
    for path, f in zip(paths, formats):
        if f == "arena-hard":
            continue
        frames.append(FORMATS[f](path, opts))
    frames.extend(arena_frames)
    return frames, formats


def ingest(paths: list[Path], fmt: str, opts: ReadOptions, arrivals: ArrivalOptions) -> tuple[BuiltTrace, list[str]]:
    if not paths:
        raise TraceError("no SOURCE given")
    frames, formats = read_sources([Path(p) for p in paths], fmt, opts, arrivals)
    return build_trace(frames, arrivals), formats
