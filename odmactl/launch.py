"""The `odmactl` script's and `python -m odmactl`'s entry point: the stop signals are taken over
before the command line's imports (typer, rich, numpy, polars: about a second), so that a Ctrl-C or
SIGTERM that lands while they load ends the run with the same one-line message and exit code as
one that lands later, never with a KeyboardInterrupt traceback. What the interpreter does before
this module runs is left to Python's own handling (a SIGINT then prints KeyboardInterrupt's
traceback, a SIGTERM kills the process): its start, the site's path hooks and the `odmactl`
package's import: 30 ms on the 2-vCPU machine (a SIGTERM 25 ms after the start killed 4 of 4
tries, 30 ms 1 of 4, 35 ms none; `python -X importtime -m odmactl version`: site 15 ms, odmactl
10 ms, after the interpreter's own), more under load.

Once `main` has returned, the outcome (exit code, message, outputs) is decided, and both signals
are ignored for the rest of the process: Python's finalisation puts their default action back
before it is done (torch's and the worker pools' teardown take up to a second), and a stop landing
then killed the process with 130 and no message after its outputs were written."""

from __future__ import annotations

import signal
import sys

from odmactl.core import stops


def entry() -> None:
    try:
        for signum in stops.Stopped.CODES:
            signal.signal(signum, stops.handler)
    except ValueError:  # not the main thread: leave the signals alone
        pass
    try:
        with stops.deferred():  # a stop during the imports is recorded, and raised once they are done
            from odmactl.cli.main import main
    except stops.Stopped as exc:
        sys.stderr.write(f"aborted: {exc.word}; nothing was written\n")
        sys.exit(exc.exit_code)
    code = main()
    for signum in stops.Stopped.CODES:
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(code)
