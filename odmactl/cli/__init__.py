"""The odmactl command line: the Typer app, one module per command, and the error boundary."""

from odmactl.cli.app import app, entry, main

__all__ = ["app", "entry", "main"]
