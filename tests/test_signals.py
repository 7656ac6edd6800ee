"""A stop signal is never lost and a stopped run never replaces an output (core/stops.py,
core/atomic.py `write_outputs`, run/executors.py).

Each race is provoked where it was seen, not hoped for: a child process runs the CLI with a hook that
sends the signal at the moment in question, so every try lands in the window:
- `fork-parent`: in the parent's own after-fork hook as the first worker starts (Python drops an
  exception raised there: the stop used to be swallowed and the outputs replaced);
- `fork-child`: from the first worker before its initializer runs, to the parent and to itself, as a
  terminal's Ctrl-C reaches the whole process group (the worker used to die, a broken pool);
- `fork-later`: 40 ms after the second worker starts, as results come back (a worker killed while
  sending one used to leave the pool's thread reading for the rest forever: a hang);
- `commit`: after the first of a command's outputs is put in place (the others must not follow, and
  the first must be taken back).
Every try starts with existing outputs and --force, and must exit 130 or 143 with one message, no
traceback, the old outputs byte for byte, no temp file, and no worker left holding the pipes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from odmactl.core import stops
from odmactl.core.atomic import write_outputs
from odmactl.core.errors import OutputError

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"
TRIES = 20  # per signal and command, for the fork races

DRIVER = r"""
import os, signal, sys
mode, sig = sys.argv[1], getattr(signal, sys.argv[2])
parent = os.getpid()
fired = []

forks = []

def first_fork_parent():
    forks.append(1)
    if mode == "fork-later" and len(forks) == 2:  # 40 ms after the last worker starts: its first results
        import threading
        threading.Timer(0.04, os.kill, (parent, sig)).start()
    if not fired and mode.startswith("fork"):
        fired.append(1)
        if mode == "fork-parent":
            os.kill(parent, sig)

def first_fork_child():
    if not fired and mode == "fork-child":
        os.kill(parent, sig)
        os.kill(os.getpid(), sig)

os.register_at_fork(after_in_parent=first_fork_parent, after_in_child=first_fork_child)
if mode == "commit":
    from odmactl.core import atomic
    put = atomic._put_in_place
    def put_then_stop(tmp, path, force):
        put(tmp, path, force)
        if not fired:
            fired.append(1)
            os.kill(parent, sig)
    atomic._put_in_place = put_then_stop
from odmactl.cli.main import main
sys.exit(main(sys.argv[3:]))
"""

CODES = {"SIGINT": (130, "aborted: interrupted; nothing was written"),
         "SIGTERM": (143, "aborted: terminated; nothing was written")}


@pytest.fixture(scope="module")
def small(conv_sample_head) -> Path:
    return conv_sample_head(300)


def _commands(trace: Path, folder: Path) -> dict[str, tuple[list[str], list[Path]]]:
    """Each command with worker processes, and the outputs it writes."""
    plan = [folder / "p.toml", folder / "p.html"]
    capacity = [folder / "c.json", folder / "c.html", folder / "c.prom"]
    common = ["--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--workers", "2", "--force"]
    return {
        "plan": (["plan", str(trace), *common, "--objective", "capacity", "--slo", "ttft_p99=2s", "--replays", "2",
                  "--out", str(plan[0]), "--report", str(plan[1])], plan),
        "capacity": (["capacity", str(trace), *common, "--slo", "ttft_p99=2s", "--policies", "paged,odma",
                      "--out", str(capacity[0]), "--report", str(capacity[1]), "--metrics-out", str(capacity[2])],
                     capacity),
    }


def _try(folder: Path, mode: str, sig: str, args: list[str], outputs: list[Path]) -> None:
    """One run of the command with the signal sent at `mode`'s moment, checked (module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(outputs):
        path.write_bytes(f"old output {i}\n".encode())
    proc = subprocess.run([sys.executable, "-c", DRIVER, mode, sig, *args], capture_output=True, text=True,
                          timeout=300)  # returns only once every process holding the pipes (the workers) is gone
    code, words = CODES[sig]
    where = f"{mode} {sig} {args[0]}"
    assert proc.returncode == code, f"{where}: exit {proc.returncode}\n{proc.stderr}"
    assert proc.stderr.strip() == words, f"{where}:\n{proc.stderr}"
    for i, path in enumerate(outputs):
        assert path.read_bytes() == f"old output {i}\n".encode(), f"{where}: {path.name} was replaced"
    left = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert left == [], f"{where}: temp files left: {left}"


@pytest.mark.parametrize("command", ["plan", "capacity"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_as_the_first_worker_starts_is_never_lost(small, tmp_path, command, sig):
    args, outputs = _commands(small, tmp_path)[command]
    # the parent's after-fork hook, then the worker's (a process group's Ctrl-C), alternating; two at a time
    moments = [("fork-parent", "fork-child", "fork-later")[i % 3] for i in range(TRIES)]

    def one(i: int) -> None:
        folder = tmp_path / f"try{i}"
        moved = [folder / p.name for p in outputs]
        _try(folder, moments[i], sig, [a.replace(str(tmp_path), str(folder)) for a in args], moved)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, range(TRIES)))


@pytest.mark.parametrize("command", ["plan", "capacity"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_while_outputs_are_put_in_place_takes_them_all_back(small, tmp_path, command, sig):
    args, outputs = _commands(small, tmp_path)[command]
    _try(tmp_path, "commit", sig, args, outputs)


def test_a_stop_at_a_random_moment_is_never_lost_and_never_replaces(small, tmp_path):
    """Signals at random moments of a run (seeded), through the `odmactl` entry point: the run either
    finished before the signal (exit 0, new outputs) or stopped (130/143, old outputs); never both,
    never a traceback. A signal in the interpreter's own start (before odmactl/launch.py takes the
    signals over: 0.8 s is long past it) or its own end (after the command returned, when Python has
    given the signals back to the system) kills the process silently: allowed, with the outputs all
    old or all new, never mixed."""
    rng = random.Random(40)
    args, outputs = _commands(small, tmp_path)["capacity"]
    for i in range(10):
        for j, path in enumerate(outputs):
            path.write_bytes(f"old output {j}\n".encode())
        sig = rng.choice(["SIGINT", "SIGTERM"])
        proc = subprocess.Popen([sys.executable, "-m", "odmactl", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            proc.communicate(timeout=rng.uniform(0.8, 4.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=300)
        old = [p.read_bytes() == f"old output {j}\n".encode() for j, p in enumerate(outputs)]
        if proc.returncode == 0:
            assert not any(old), f"try {i}: exit 0 but some outputs are old"
        elif proc.returncode == -getattr(signal, sig):
            assert err == "" and (all(old) or not any(old)), f"try {i}: {err}"
        else:
            assert proc.returncode == CODES[sig][0], f"try {i} {sig}: exit {proc.returncode}\n{err}"
            assert err.strip().endswith(CODES[sig][1]) and "Traceback" not in err, err
            assert all(old), f"try {i}: stopped, yet an output was replaced"
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_outputs_are_committed_together(tmp_path):
    """A failure writing the second output leaves the first as it was; one that cannot be put in
    place takes back those placed before it (a new one removed, a replaced one restored)."""
    a, b = tmp_path / "a.json", tmp_path / "b.png"
    a.write_text("old a")

    def full(tmp: Path) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="b.png.*no space left on the device; nothing was written"):
        write_outputs([(a, lambda tmp: tmp.write_text("new a")), (b, full)], force=True)
    assert a.read_text() == "old a" and not b.exists()

    class Racer:  # another run writes b while this one works
        def __call__(self, tmp: Path) -> None:
            tmp.write_text("new b")
            b.write_text("theirs")

    c = tmp_path / "c.txt"
    with pytest.raises(OutputError, match="another run wrote it"):
        write_outputs([(c, lambda tmp: tmp.write_text("new c")), (b, Racer())], force=False)
    assert not c.exists() and b.read_text() == "theirs"
    b.unlink()
    a.unlink()
    a.write_text("old a")
    with pytest.raises(OutputError, match="given for two outputs"):
        write_outputs([(a, lambda tmp: tmp.write_text("x")), (tmp_path / "." / "a.json", lambda tmp: tmp.write_text("y"))],
                      force=True)
    write_outputs([(a, lambda tmp: tmp.write_text("new a")), (b, lambda tmp: tmp.write_text("new b"))], force=True)
    assert a.read_text() == "new a" and b.read_text() == "new b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.png"]


def test_a_deferred_stop_is_raised_when_the_block_ends_and_dropped_with_an_error():
    stops.reset()
    with pytest.raises(stops.Stopped) as raised:
        with stops.deferred():
            stops.handler(signal.SIGTERM, None)
            stops.handler(signal.SIGINT, None)  # the first stop is the one raised
            assert stops.pending() == signal.SIGTERM
    assert raised.value.exit_code == 143 and stops.pending() is None
    with pytest.raises(ValueError):
        with stops.deferred():
            stops.handler(signal.SIGINT, None)
            raise ValueError("an error under way goes on")
    assert stops.pending() is None
    with pytest.raises(stops.Stopped):
        stops.handler(signal.SIGINT, None)  # outside a block: at once


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _start_with_workers(args: list[str]) -> tuple[subprocess.Popen, list[int]]:
    """The command in a child, once its two workers run."""
    import time

    proc = subprocess.Popen([sys.executable, "-m", "odmactl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while len(_children(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc, _children(proc.pid)


@pytest.fixture(scope="module")
def longer(conv_sample_head) -> Path:
    return conv_sample_head(1500)


def test_workers_die_with_a_parent_killed_outright(longer, tmp_path):
    """A red team's case (issue 40): SIGKILL to the parent left its workers waiting forever."""
    import time

    args, _ = _commands(longer, tmp_path)["capacity"]
    proc, workers = _start_with_workers(args)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{w}").exists() and "zombie" not in Path(f"/proc/{w}/status").read_text().lower()
              for w in workers if Path(f"/proc/{w}/status").exists()):
        assert time.monotonic() < deadline, f"workers {workers} outlived their parent"
        time.sleep(0.1)


def test_a_worker_killed_from_outside_is_a_message_not_a_bug(longer, tmp_path):
    """A red team's case (issue 40): a worker the OOM killer takes was reported as a bug in odmactl."""
    args, outputs = _commands(longer, tmp_path)["capacity"]
    for i, path in enumerate(outputs):
        path.write_bytes(f"old output {i}\n".encode())
    proc, workers = _start_with_workers(args)
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "a worker process died" in err and "internal error" not in err, err
    assert all(p.read_bytes() == f"old output {i}\n".encode() for i, p in enumerate(outputs))


def test_a_stop_once_the_outcome_is_decided_is_recorded_not_raised():
    """A red team's case (issue 40): a stop in Python's exit hooks raised inside an atexit callback."""
    stops.reset()
    stops.settle()
    stops.handler(signal.SIGINT, None)  # no exception
    assert stops.pending() == signal.SIGINT
    stops.reset()
    assert stops.pending() is None
