"""The Typer app the command modules register on, its --version, the consoles, the progress bar
and how a message is printed."""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from odmactl import __version__
from odmactl.render.tables import wrapped_lines

app = typer.Typer(
    name="odmactl",
    help="Trace replay and KV-cache capacity planning for LLM serving (ODMA).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # help texts name TOML tables ([allocator]): shown as written, never as markup
)


class _TrimmedStdout:
    """Standard output (whatever `sys.stdout` is at the time of each write) without the spaces
    before a line's end: rich pads table rows and wrapped lines to the console's width, which a
    reader of piped output (diff, grep, a CI log) sees as trailing spaces."""

    _TRAILING = re.compile(r" +(?=\n)")

    def write(self, text: str) -> int:
        sys.stdout.write(self._TRAILING.sub("", text))
        return len(text)

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:  # stdout is None when closed at the start (`odmactl ... >&-`): main.py says so
        return sys.stdout is not None and sys.stdout.isatty()

    def fileno(self) -> int:
        if sys.stdout is None:
            raise OSError(errno.EBADF, "standard output is closed")
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"


out = Console(file=_TrimmedStdout())
err = Console(stderr=True)


def _show_version(value: bool) -> None:
    if value:
        print(f"odmactl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="print the odmactl version and exit")] = False,
) -> None:
    """Trace replay and KV-cache capacity planning for LLM serving (ODMA)."""


@contextmanager
def progress_bar(enabled: bool, lines: bool = False) -> Iterator:
    """A progress callback (label, done, total) drawing a bar on stderr, or with `lines` (stderr is
    not a terminal) printing a plain line each time a job of a task finishes, at most every
    LINE_EVERY_S and not in the first LINE_AFTER_S, with an estimate of the time left; or None."""
    if lines:
        yield _progress_lines()
        return
    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        tasks: dict[str, int] = {}

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done, total=total)

        yield update


LINE_EVERY_S = 1.0  # a line per finished job (a capacity row), at most one a second but the last
LINE_AFTER_S = 5.0  # and none in a run's first seconds


def _progress_lines():
    started: dict[str, float] = {}
    shown: dict[str, float] = {}

    def update(label: str, done: int, total: int) -> None:
        now = time.monotonic()
        started.setdefault(label, now)
        if now - started[label] < LINE_AFTER_S:  # a short run says nothing
            return
        if done and (done == total or now - shown.get(label, started[label]) >= LINE_EVERY_S):
            shown[label] = now
            elapsed = now - started[label]
            left = f", about {elapsed / done * (total - done):,.0f} s left" if done < total else ""
            err.print(f"{printable(label)}: {done:,}/{total:,} ({elapsed:,.0f} s{left})", highlight=False, soft_wrap=True)

    return update


def progress_for(json_out: bool, lines_when_piped: bool = False):
    """The progress a command shows: a bar on a terminal; plain lines on stderr when it is not one
    and the command asks for them (`lines_when_piped`: long runs such as capacity); none with JSON."""
    return progress_bar(not json_out and err.is_terminal, lines=lines_when_piped and not json_out and not err.is_terminal)


def printable(text: str) -> str:
    """`text` on one line, with control characters (newlines, escape sequences from a file's bytes)
    shown as Python escapes so that they can neither break the line nor drive the terminal."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _labelled(label: str, style: str, message: str) -> None:
    """`label: message` on stderr, printed as written (never read as markup): one line in a pipe or
    a file (one message to grep), wrapped between words at a terminal's width (render/tables.
    wrapped_lines), where the terminal would cut a word or a figure from its unit."""
    text = f"{label}: {printable(message)}"
    lines = wrapped_lines(text, err.width) if err.is_terminal else [text]
    for n, line in enumerate(lines):
        head = f"{label}: " if n == 0 else ""
        err.print(Text.assemble((head, style), line[len(head):]), highlight=False, soft_wrap=True)


def print_error(message: str, label: str = "error") -> None:
    """One message on stderr (`_labelled`)."""
    _labelled(label, "bold red", message)


def print_note(message: str, label: str | None = None) -> None:
    """A line on stderr that informs and decides nothing (what was written, a warning beside --json's
    JSON): one that cannot be written (`2>/dev/full`) is dropped, so it cannot turn a passed check
    or a finished run into a failure."""
    try:
        if label:
            _labelled(label, "bold yellow", message)
        else:
            err.print(Text(printable(message)), highlight=False, soft_wrap=True)
    except OSError:
        pass


def print_warnings(lines: list[str]) -> None:
    """Warnings on stderr, a `print_note` each (beside --json's JSON, or before a command's work)."""
    for line in lines:
        print_note(line, label="warning")


def print_written(paths: list) -> None:
    """What a command wrote besides its report, on stderr (stdout stays the report, or pure JSON
    with --json): "wrote R.json, P.png"; nothing when it wrote nothing."""
    if paths:
        print_note(f"wrote {', '.join(str(p) for p in paths)}")
