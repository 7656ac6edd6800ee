"""`odmactl stats`: lengths, arrivals, breakdowns and drift of a canonical trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from odmactl.cli.app import app, out


@app.command(short_help="Length and arrival statistics, breakdowns, drift over time.")  # the line `odmactl --help` lists
def stats(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    window: Annotated[float, typer.Option(help="drift window in seconds")] = 600.0,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Length and arrival statistics, breakdowns by model and tenant, drift over time windows."""
    from odmactl.render.console_trace import render_stats
    from odmactl.render.json import to_json
    from odmactl.trace.schema import read_trace
    from odmactl.trace.stats import trace_stats

    result = trace_stats(read_trace(trace_path), window)
    if json_out:
        print(to_json({"trace": str(trace_path), **result}))
    else:
        render_stats(out, str(trace_path), result)
