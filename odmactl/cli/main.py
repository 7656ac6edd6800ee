"""`main`: the single place where errors become messages and exit codes.

Exit codes: 0 success; 1 bad input or data (an OdmaError: one plain-text message naming the file,
row, column or key) or a failed check, or standard output that cannot be written (a full disk);
2 a command-line usage error (click's usage line, its hint and the error); 130 interrupted (143
terminated); 141 standard output closed by its reader (`| head`), silently, as a shell would.
Nothing a user types gives a traceback unless ODMACTL_DEBUG=1.
"""

from __future__ import annotations

import errno
import io
import importlib
import os
import re
import signal
import sys

from odmactl.cli.app import app, print_error
from odmactl.core.atomic import completed, forget_completed
from odmactl.core.errors import OdmaError
from odmactl.core.stops import Stopped, handler, reset, settle

# the command modules, each registering its command on `app`, in the order `odmactl --help` lists them
COMMANDS = ("ingest", "stats", "fit", "replay", "plan", "check", "capacity", "profiles", "calibrate", "version")
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


class StdoutFailed(Exception):
    """Standard output could not be written: its reader went away (EPIPE) or its file is full."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc.strerror or str(exc))
        self.errno = exc.errno


class _GuardedStream:
    """sys.stdout as it was, with a failed write or flush raised as StdoutFailed, so that it is told
    apart from an error writing an output file."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutFailed(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutFailed(exc) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _ClosedStream(io.TextIOBase):
    """What stands for standard output when the process started with it closed (`>&-`: Python's
    sys.stdout is then None): a write fails as one to a closed descriptor does."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def _detach_stdout(stream) -> None:
    """After a failed write: point file descriptor 1 at /dev/null, so that the interpreter's own
    flush at exit cannot fail again and print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's captured stream)
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and is the single place errors become messages and exit codes."""
    try:
        previous = {sig: signal.signal(sig, handler) for sig in Stopped.CODES}
    except ValueError:  # not the main thread (an embedding program): leave the signals alone
        previous = {}
    forget_completed()
    reset()
    stdout = sys.stdout
    sys.stdout = _GuardedStream(stdout if stdout is not None else _ClosedStream())
    try:
        code = _run(argv)
        settle()  # decided: a stop from here to the process's end changes nothing (core/stops.py)
        sys.stdout.flush()
        return code
    except Stopped as exc:  # a stop between the command's return and `settle`: the command had finished
        settle()
        print_error(f"{exc.word}; {_written()}", label="aborted")
        return exc.exit_code
    except StdoutFailed as exc:
        _detach_stdout(stdout)
        if exc.errno == errno.EPIPE:  # `odmactl ... | head`: the reader has what it wanted
            return 141
        done = completed()  # the outputs are put in place before the report is printed
        print_error(f"could not write standard output: {exc}"
                    + (f"; written before it, each complete: {', '.join(str(p) for p in done)}" if done else ""))
        return 1
    finally:
        sys.stdout = stdout
        for sig, before in previous.items():
            signal.signal(sig, before)


def _written() -> str:
    """What an interrupted command leaves: the outputs it had completed (each whole), or nothing."""
    done = completed()
    if not done:
        return "nothing was written"
    return f"complete before the stop: {', '.join(str(p) for p in done)}; nothing else was written"


def _run(argv: list[str] | None) -> int:
    try:
        result = app(args=argv, prog_name="odmactl", standalone_mode=False)
    except BaseException as exc:
        settle()  # this exception decides the outcome: a stop while its message is printed changes nothing
        return _outcome(exc, argv)
    return result if isinstance(result, int) else 0


def _outcome(exc: BaseException, argv: list[str] | None) -> int:
    """The message and exit code for the exception `exc` that ended a command (re-raised for what
    is not the command's: a failed stdout, SystemExit)."""
    debug = os.environ.get("ODMACTL_DEBUG") == "1"
    click_exception, usage_error, exit_, abort = _click_errors()
    try:
        raise exc
    except StdoutFailed:
        raise
    except OdmaError as exc:
        if debug:
            raise
        print_error(str(exc))
        return 1
    except exit_ as exc:
        return exc.exit_code
    except Stopped as exc:
        print_error(f"{exc.word}; {_written()}", label="aborted")
        return exc.exit_code
    except (abort, KeyboardInterrupt):
        print_error(f"interrupted; {_written()}", label="aborted")
        return 130
    except usage_error as exc:  # click's usage line, the hint to --help, and the error
        if debug:
            raise
        args = sys.argv[1:] if argv is None else argv
        hint = _list_hint(args, exc.message)
        if hint:
            exc.message = f"{exc.message}; {hint}"
        if exc.ctx is None:  # click's parser raises "Option '--slo' requires an argument." without one
            exc.ctx = _context_for(args)
        if getattr(exc, "possibilities", None):  # NoSuchOption: the options like the one typed
            exc.possibilities = _like(exc.option_name, exc.possibilities)
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


def _context_for(argv: list[str]):
    """A context of the (sub)command `argv` names, made without parsing its options, so that a usage
    error raised without one still prints that command's usage line and --help hint; None where
    argv names no command."""
    import typer.main

    command = typer.main.get_command(app)
    ctx = command.make_context("odmactl", [], resilient_parsing=True)
    for word in argv:
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            continue
        command, ctx = sub, sub.make_context(word, [], parent=ctx, resilient_parsing=True)
    return ctx


def _like(name: str, options: list[str]) -> list[str]:
    """The options like `name`, compared without their dashes: click compares them with, and the
    shared "--" made "--bogus" look like "--out" (difflib's ratio 0.67 with, 0.25 without)."""
    import difflib

    bare = {option.lstrip("-"): option for option in options}
    return [bare[b] for b in difflib.get_close_matches(name.lstrip("-"), list(bare), n=3, cutoff=0.6)]


def _list_hint(argv: list[str], message: str) -> str | None:
    """For click's "unexpected extra argument(s) (2 4)" right after an option's value (`--tp 1 2 4`):
    how a list is given (`--tp 1,2,4`); None otherwise."""
    found = re.search(r"unexpected extra argument(?:s|\(s\))? \((.*)\)", message)
    if found is None:
        return None
    from odmactl.core.units import KINDS

    extras = found.group(1).split()
    for i, arg in enumerate(argv[:-1]):
        if arg.startswith("--") and "=" not in arg and argv[i + 2:i + 2 + len(extras)] == extras:
            value = argv[i + 1]
            if len(extras) == 1 and value[-1:].isdigit() and any(extras[0] in units for units, _ in KINDS.values()):
                # `--slo ttft_p99=2 s`: the shell split a number from its unit
                return f"a value and its unit go in one argument: {arg} {value}{extras[0]} (or quote it: \"{value} {extras[0]}\")"
            return f"several values go in one argument, separated by commas: {arg} {','.join([value, *extras])}"
    return None


def entry() -> None:
    sys.exit(main())
