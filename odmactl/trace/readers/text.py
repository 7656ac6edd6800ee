"""Readers for prompt/response text datasets: Alpaca, alpaca_eval outputs and arena-hard.

Prompt (and, where the source has no count, response) lengths come from a real tokenizer; a
response that is empty has no generation to replay and is excluded and reported, like a failed
request in a trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.core.errors import TraceError
from odmactl.trace.readers.common import json_records, read_bytes
from odmactl.trace.readers.options import ReadOptions
from odmactl.trace.schema import SourceFrame
from odmactl.trace.tokenizer import TokenCounter, load_tokenizer

EMPTY = "empty responses (nothing generated)"


def _json_lines(path: Path) -> list[tuple[int, dict]]:
    records = json_records(path)
    if not records:
        raise TraceError("no data rows", file=path)
    return records


def _field(path: Path, row: int, record: dict, key: str, *, optional: bool = False) -> str | None:
    value = record.get(key)
    if value is None:
        if optional:
            return None
        raise TraceError("missing field", file=path, row=row, column=key)
    if not isinstance(value, str):
        raise TraceError(f"expected text, got {type(value).__name__}", file=path, row=row, column=key)
    return value


def _text_frame(path: Path, fmt: str, opts: ReadOptions, rows: list[int], prompts: list[str],
                outputs: list[str | None], extra: dict[str, list], output_counts: list[int | None] | None = None,
                counter: TokenCounter | None = None) -> SourceFrame:
    counter = counter or load_tokenizer(opts.tokenizer_dir)
    keep = [i for i, o in enumerate(outputs) if (output_counts and output_counts[i] is not None) or (o and o.strip())]
    excluded = len(rows) - len(keep)
    prompt_tokens = counter.count([prompts[i] for i in keep], opts.progress, f"tokenizing prompts of {path.name}")
    need = [i for i in keep if not (output_counts and output_counts[i] is not None)]
    counted = counter.count([outputs[i] for i in need], opts.progress, f"tokenizing responses of {path.name}")
    out_tokens = dict(zip(need, counted.tolist()))
    output_tokens = [output_counts[i] if i not in out_tokens else out_tokens[i] for i in keep]
    data = {
        "_row": pl.Series([rows[i] for i in keep], dtype=pl.Int64),
        "prompt_tokens": pl.Series(prompt_tokens.astype(np.float64)),
        "output_tokens": pl.Series(output_tokens, dtype=pl.Float64),
        "prompt_text": pl.Series([prompts[i] for i in keep], dtype=pl.String),
    }
    for name, values in extra.items():
        data[name] = pl.Series([values[i] for i in keep], dtype=pl.String)
    columns = {"prompt_tokens": "prompt (tokenized)", "output_tokens": "output (tokenized)"}
    sf = SourceFrame(path=path, format=fmt, frame=pl.DataFrame(data), clock="none", columns=columns,
                     token_source=f"tokenizer {counter.name}", tokenizer=counter.name)
    if excluded:
        sf.excluded[EMPTY] = excluded
    if output_counts and need:
        sf.token_source = f"metadata.token_len, else tokenizer {counter.name}"
    elif output_counts:
        sf.token_source = f"responses: metadata.token_len; prompts: tokenizer {counter.name}"
    return sf


def read_alpaca(path: Path, opts: ReadOptions) -> SourceFrame:
    try:
        records = json.loads(read_bytes(path))
    except json.JSONDecodeError as exc:
        raise TraceError(f"not valid JSON ({exc.msg} at line {exc.lineno}, character {exc.colno})", file=path,
                         row=None) from exc
    except RecursionError:
        raise TraceError("the JSON is nested too deeply to read", file=path) from None
    if not isinstance(records, list):
        raise TraceError("expected a JSON array of {instruction, input, output} records", file=path)
    if not records:
        raise TraceError("no data rows", file=path)
    prompts, outputs = [], []
    for row, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise TraceError(f"expected an object, got {type(record).__name__}", file=path, row=row)
        instruction = _field(path, row, record, "instruction")
        extra_input = _field(path, row, record, "input", optional=True) or ""
        prompts.append(instruction + ("\n\n" + extra_input if extra_input.strip() else ""))
        outputs.append(_field(path, row, record, "output"))
    rows = list(range(1, len(records) + 1))
    return _text_frame(path, "alpaca", opts, rows, prompts, outputs, {})


def read_alpaca_eval(path: Path, opts: ReadOptions) -> SourceFrame:
    records = _json_lines(path)
    rows, prompts, outputs, models, tenants = [], [], [], [], []
    for row, record in records:
        rows.append(row)
        prompts.append(_field(path, row, record, "instruction"))
        outputs.append(_field(path, row, record, "output", optional=True) or "")
        models.append(_field(path, row, record, "generator"))
        tenants.append(_field(path, row, record, "dataset", optional=True))
    return _text_frame(path, "alpaca-eval", opts, rows, prompts, outputs, {"model": models, "tenant": tenants})


def _answer_text(path: Path, row: int, record: dict) -> str:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise TraceError("expected a non-empty 'messages' list", file=path, row=row, column="messages")
    content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
    if isinstance(content, dict):
        parts = [v for v in content.values() if isinstance(v, str)]
        return "\n".join(parts)
    if isinstance(content, str):
        return content
    raise TraceError("expected the last message's content to hold the answer", file=path, row=row, column="messages")


def read_arena_hard(paths: list[Path], opts: ReadOptions) -> list[SourceFrame]:
    """Join question files with answer files by uid; one SourceFrame per answer file."""
    questions: dict[str, tuple[str, str | None]] = {}
    answer_files: list[tuple[Path, list[tuple[int, dict]]]] = []
    for path in paths:
        records = _json_lines(path)
        if "messages" in records[0][1]:
            answer_files.append((path, records))
            continue
        for row, record in records:
            uid = _field(path, row, record, "uid")
            questions[uid] = (_field(path, row, record, "prompt"), record.get("category"))
    if not answer_files:
        raise TraceError("arena-hard needs at least one model-answer file (records with 'messages')",
                         file=", ".join(map(str, paths)))
    if not questions:
        raise TraceError("arena-hard needs the question file (records with uid and prompt) beside the answers",
                         file=", ".join(map(str, paths)), hint="pass question.jsonl as another SOURCE")
    counter = load_tokenizer(opts.tokenizer_dir)
    frames = []
    for path, records in answer_files:
        rows, prompts, outputs, counts, models, tenants, ids = [], [], [], [], [], [], []
        for row, record in records:
            uid = _field(path, row, record, "uid")
            if uid not in questions:
                raise TraceError(f"answer for uid '{uid}' has no question in the question file", file=path, row=row, column="uid")
            prompt, category = questions[uid]
            meta = record.get("metadata") or {}
            token_len = meta.get("token_len") if isinstance(meta, dict) else None
            if token_len is not None and (not isinstance(token_len, int) or isinstance(token_len, bool)):
                raise TraceError(f"expected an integer token count, got {token_len!r}", file=path, row=row, column="metadata.token_len")
            rows.append(row)
            prompts.append(prompt)
            outputs.append(_answer_text(path, row, record))
            counts.append(token_len if token_len else None)
            models.append(_field(path, row, record, "model"))
            tenants.append(category)
            ids.append(_field(path, row, record, "ans_id", optional=True) or f"{uid}:{row}")
        sf = _text_frame(path, "arena-hard", opts, rows, prompts, outputs,
                         {"model": models, "tenant": tenants, "request_id": ids},
                         output_counts=counts if any(c is not None for c in counts) else None, counter=counter)
        sf.columns.update({"request_id": "ans_id", "output_tokens": "metadata.token_len" if any(counts) else "answer (tokenized)"})
        frames.append(sf)
    return frames
