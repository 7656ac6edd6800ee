"""The odmactl command line: the Typer app (app.py), one module per command (parse the flags, call
the layer that does the work, render the result) and the error boundary (main.py)."""

from odmactl.cli.app import app
from odmactl.cli.main import entry, main

__all__ = ["app", "entry", "main"]
