"""`odmactl ingest`: normalize traces and datasets into the canonical parquet schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from odmactl.cli.app import app, err, out, printable, progress_for
from odmactl.cli.inputs import check_outputs, input_paths, OUTPUT_FILE, parse_map


@app.command(short_help="Normalize traces and datasets into the canonical parquet schema.")  # the line `odmactl --help` lists
def ingest(
    sources: Annotated[list[Path], typer.Argument(help="trace or dataset files (gzip ok), or a ServeGen model folder")],
    out_path: Annotated[Path, typer.Option("--out", "-o", **OUTPUT_FILE, help="canonical parquet to write")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="auto, azure, burstgpt, mooncake, vidur, alpaca, alpaca-eval, arena-hard, servegen, csv, jsonl, parquet")] = "auto",
    tokenizer: Annotated[Optional[Path], typer.Option(help="local Hugging Face tokenizer directory for text datasets (default: shipped Qwen2 tokenizer)")] = None,
    force: Annotated[bool, typer.Option(help="replace --out if it exists")] = False,
    column_map: Annotated[list[str], typer.Option("--map", metavar="<canonical=source>", help="canonical=source column mapping for csv/jsonl/parquet (repeatable)")] = [],
    rate: Annotated[Optional[float], typer.Option(help="Poisson arrivals at this many requests/s for sources without timestamps")] = None,
    offline: Annotated[bool, typer.Option(help="all requests of sources without timestamps arrive at t=0")] = False,
    seed: Annotated[int, typer.Option(help="seed for generated arrivals and ServeGen sampling")] = 0,
    start: Annotated[float, typer.Option(help="servegen: start of the generated span, seconds into the data")] = 0.0,
    duration: Annotated[Optional[float], typer.Option(help="servegen: length of the generated span in seconds (default 3600)")] = None,
    rate_scale: Annotated[float, typer.Option(help="servegen: multiply every client's rate by this")] = 1.0,
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Normalize traces or prompt/response datasets into the canonical parquet schema."""
    from odmactl.render.console_trace import render_ingest
    from odmactl.render.json import to_json
    from odmactl.trace.readers import ingest as run_ingest
    from odmactl.trace.readers.options import ReadOptions
    from odmactl.trace.schema import ArrivalOptions, write_trace

    check_outputs([out_path], force, input_paths(*sources, tokenizer))
    with progress_for(json_out) as progress:
        opts = ReadOptions(column_map=parse_map(column_map), tokenizer_dir=tokenizer, seed=seed, start_s=start,
                           duration_s=duration, rate_scale=rate_scale, progress=progress)
        trace, formats = run_ingest(sources, fmt, opts, ArrivalOptions(rate_per_s=rate, offline=offline, seed=seed))
        write_trace(trace, out_path, force=force)
    summary = trace.summary(out_path, fmt == "auto")
    if json_out:
        print(to_json(summary))
        return
    if fmt == "auto":
        for path, f in zip(sources, formats):
            err.print(escape(printable(f"{path}: detected format '{f}'")), soft_wrap=True)
    render_ingest(out, summary)
