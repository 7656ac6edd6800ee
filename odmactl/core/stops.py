"""Stop signals (SIGINT, Ctrl-C; SIGTERM) as an exception, and the moments a stop must wait for.

The CLI installs `handler` for both signals (cli/main.py): a stop raises `Stopped` wherever the
process is, so that outputs are cleaned up on the way out. A few moments cannot take an exception
without losing the stop or leaving a half-done state, and run inside `deferred()`:
- forking worker processes (run/executors.py): Python runs its at-fork hooks (logging's, threading's)
  in the parent after the fork, where an exception is printed as "Exception ignored" and dropped,
  so the run would carry on; and a worker forked with `handler` installed would raise in its own
  bootstrap (a broken pool) until its initializer sets its signals;
- putting a command's outputs in place (core/atomic.py `commit`): all of them or none; and
  removing its temp files (a second stop there would leave the rest behind);
- waiting for the workers' results (run/executors.py, in slices of WAIT_S): raised inside
  `threading.Condition.wait`, a stop can make it release a lock another thread holds; and shutting
  the idle pool down (raised inside its join, the pool's thread outlives the run and its exit hook
  writes to a closed pipe);
- stopping the workers of a stopped run (a second Ctrl-C is the same stop);
- importing torch (`import_whole`): a stop raised while its C++ runtime initialises can leave it
  half made, and the process then aborts (SIGABRT, a C++ stack) instead of ending with its message;
- drawing a figure with matplotlib (render/'s plot and report writers, `uninterrupted`): a stop
  raised in one of its callbacks is dropped (Python prints "Exception ignored in ... WeakKeyDictionary
  ... remove" and the draw carries on: 4 of 150 stops at random moments of a 0.8 s draw were lost)
  or replaced by its own error (its C++ argument converters answer ValueError "Invalid bounding
  box": `odmactl capacity --report` stopped that way ended as an internal error, exit 1).
Inside `deferred()` the handler records the signal instead of raising; when the outermost
`deferred()` block ends normally, the recorded stop is raised there. When the block ends by an
exception (the stop already under way, or an error), that exception goes on and the recorded stop
is dropped: the run is ending either way.

Once a command's outcome is decided, `settle()` makes every later stop a recorded one: the
process is exiting with the code and message already chosen.

Invariant: `_depth` counts the open `deferred()` blocks of this process, plus one once settled (a
forked worker inherits its parent's count, so a signal before its initializer runs is recorded,
never raised); `_pending` is the first signal received while `_depth > 0`, or None.
"""

from __future__ import annotations

import functools
import importlib
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType


class Stopped(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM, raised wherever the process is; a BaseException, so no
    `except Exception` (Typer's included) swallows it. `exit_code` is the shell's: 128 + signal."""

    CODES = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code, self.word = self.CODES[signum]


_depth = 0
_pending: int | None = None


def handler(signum, frame) -> None:
    """The CLI's handler for both signals: raise `Stopped`, or record it inside `deferred()`."""
    global _pending
    if _depth:
        if _pending is None:
            _pending = signum
        return
    raise Stopped(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """A block a stop does not interrupt: a stop received in it is raised when it ends (see the
    module docstring)."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    except BaseException:
        _depth -= 1
        if not _depth:
            _pending = None
        raise
    _depth -= 1
    if not _depth and _pending is not None:
        signum, _pending = _pending, None
        raise Stopped(signum)


def uninterrupted(function: Callable) -> Callable:
    """`function` run inside `deferred()` (see the module docstring): for a few seconds of work
    whose libraries lose or replace an exception raised in their callbacks (matplotlib's drawing).
    A stop received meanwhile is raised once it returns."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        with deferred():
            return function(*args, **kwargs)

    return run


def import_whole(name: str) -> ModuleType:
    """Module `name` imported inside `deferred()` (see the module docstring): for a C extension that
    must not be interrupted half-way through its initialisation (torch; a few seconds the first
    time, nothing once imported). A stop received meanwhile is raised once the import is done."""
    with deferred():
        return importlib.import_module(name)


def pending() -> int | None:
    """The stop recorded inside `deferred()`, not raised yet, or None."""
    return _pending


def settle() -> None:
    """The run's outcome is decided (its exit code and outputs): from now on a stop is recorded and
    never raised, so one that lands while Python exits (its atexit hooks: torch's, the worker
    pools') neither prints a traceback nor contradicts the message and exit code already chosen.
    `reset` (the next command run in this process) undoes it."""
    global _depth
    _depth += 1


def reset() -> None:
    """Forget any recorded stop and open block (the CLI at the start of a command; tests run many
    commands in one process)."""
    global _depth, _pending
    _depth, _pending = 0, None
