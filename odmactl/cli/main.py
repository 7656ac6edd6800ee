"""`main`: the single place where errors become messages and exit codes.

Exit codes: 0 success; 1 bad input or data (an OdmaError: one plain-text message naming the file,
row, column or key) or a failed check; 2 a command-line usage error (click's usage line, its hint
and the error); 130 interrupted. Nothing a user types gives a traceback unless ODMACTL_DEBUG=1.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from odmactl.cli.app import app, print_error
from odmactl.core.errors import OdmaError

# the command modules, each registering its command on `app`, in the order `odmactl --help` lists them
COMMANDS = ("ingest", "stats", "fit", "replay", "plan", "check", "profiles", "calibrate", "version")
for _name in COMMANDS:
    importlib.import_module(f"odmactl.cli.{_name}")


def _click_errors() -> tuple[type, type, type, type]:
    """(ClickException, UsageError, Exit, Abort) of the click the installed Typer raises: Typer
    0.29 bundles its own copy (typer._click, with Exit and Abort in typer.exceptions), earlier
    versions use click itself."""
    bundled = getattr(sys.modules.get("typer.core"), "_click", None)
    if bundled is not None:
        from typer import exceptions as typer_exceptions

        return (bundled.exceptions.ClickException, bundled.exceptions.UsageError,
                getattr(bundled.exceptions, "Exit", typer_exceptions.Exit),
                getattr(bundled.exceptions, "Abort", typer_exceptions.Abort))
    import click

    return click.ClickException, click.UsageError, click.exceptions.Exit, click.exceptions.Abort


class Stopped(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM, raised wherever the process is, so that outputs are cleaned up on
    the way out; a BaseException, so no `except Exception` (Typer's included) swallows it."""

    CODES = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.exit_code, self.word = self.CODES[signum]


def _stop(signum, frame) -> None:
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and is the single place errors become messages and exit codes."""
    try:
        previous = {sig: signal.signal(sig, _stop) for sig in Stopped.CODES}
    except ValueError:  # not the main thread (an embedding program): leave the signals alone
        previous = {}
    try:
        return _run(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(argv: list[str] | None) -> int:
    debug = os.environ.get("ODMACTL_DEBUG") == "1"
    click_exception, usage_error, exit_, abort = _click_errors()
    try:
        result = app(args=argv, prog_name="odmactl", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except OdmaError as exc:
        if debug:
            raise
        print_error(str(exc))
        return 1
    except exit_ as exc:
        return exc.exit_code
    except Stopped as exc:
        print_error(f"{exc.word}; nothing was written", label="aborted")
        return exc.exit_code
    except (abort, KeyboardInterrupt):
        print_error("interrupted; nothing was written", label="aborted")
        return 130
    except usage_error as exc:  # click's usage line, the hint to --help, and the error
        if debug:
            raise
        exc.show()
        return exc.exit_code
    except click_exception as exc:
        if debug:
            raise
        print_error(exc.format_message())
        return exc.exit_code
    except Exception as exc:  # a bug in odmactl, not bad input
        if debug:
            raise
        print_error(f"{exc.__class__.__name__}: {exc} (this is a bug in odmactl; rerun with ODMACTL_DEBUG=1 for the "
                    "traceback)", label="internal error")
        return 1


def entry() -> None:
    sys.exit(main())
