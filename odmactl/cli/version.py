"""`odmactl version` (and `odmactl --version`, app.py): the version of odmactl."""

from __future__ import annotations

from odmactl import __version__
from odmactl.cli.app import app


@app.command()
def version() -> None:
    """Print the odmactl version."""
    print(f"odmactl {__version__}")  # as --version prints it
