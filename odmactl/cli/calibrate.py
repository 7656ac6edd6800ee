"""`odmactl calibrate`: measure this machine into a device profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from odmactl.cli.app import app, out, print_warnings, progress_for
from odmactl.cli.inputs import check_outputs, OUTPUT_FILE
from odmactl.core.errors import OdmaError


@app.command(short_help="Measure this machine with torch into a device profile.")  # the line `odmactl --help` lists
def calibrate(
    out_path: Annotated[Path, typer.Option("--out", "-o", **OUTPUT_FILE, help="device profile TOML to write")],
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or mlu")] = "auto",
    quick: Annotated[bool, typer.Option(help="smaller buffers and fewer repeats (3-4 s on a 2-vCPU CPU, against 5-6 s)")] = False,
    seed: Annotated[int, typer.Option(help="seed for the random run offsets and block placement")] = 0,
    force: Annotated[bool, typer.Option(help="replace --out if it exists")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
) -> None:
    """Measure this machine with torch (bandwidth by run length, copy, matmul, paged attention) into a profile."""
    import time

    from odmactl.core.atomic import atomic_output
    from odmactl.device.calibrate import calibrate as run_calibrate
    from odmactl.render.console_profiles import noise_lines, render_calibration
    from odmactl.render.json import to_json

    check_outputs([out_path], force)
    if out_path.suffix.lower() != ".toml":  # profiles are found as profiles/devices/**/*.toml
        raise OdmaError(f"--out writes a device profile in TOML; give a path ending in .toml, got '{out_path}'")
    started = time.perf_counter()
    with progress_for(json_out) as progress:
        doc, text = run_calibrate(device, quick, seed, out_path, progress)
    seconds = time.perf_counter() - started
    with atomic_output(out_path, force=force) as tmp:
        tmp.write_text(text, encoding="utf-8")
    if json_out:
        print(to_json({"out": str(out_path), "seconds": round(seconds, 3), **doc}))
        print_warnings(noise_lines(doc["calibration"]))  # the console's warnings, on stderr beside the JSON
    else:
        render_calibration(out, str(out_path), doc, seconds)
