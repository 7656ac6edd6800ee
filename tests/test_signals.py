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
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from odmactl.core import stops
from odmactl.core.atomic import write_outputs
from odmactl.core.errors import OutputError

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"
TRIES = 20  # per signal and command, for the fork races



@contextmanager
def _handled(signum: int) -> Iterator[None]:
    """The CLI's stop handler installed for `signum` in this process (no stop recorded), the
    previous handler put back after."""
    stops.reset()
    previous = signal.signal(signum, stops.handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)
        stops.reset()


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
    finished before the signal (exit 0, new outputs) or stopped (130/143, old outputs, or new ones
    all named as complete before the stop when it landed after they were committed); never mixed,
    never a traceback, never a silent death (a signal in Python's finalisation used to kill the
    process with the default action after its outputs were written: odmactl/launch.py). Only the
    interpreter's own start, before odmactl/launch.py takes the signals over, is Python's (0.8 s is
    long past it)."""
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
        else:
            assert proc.returncode == CODES[sig][0], f"try {i} {sig}: exit {proc.returncode}\n{err}"
            assert err.count("\n") == 1 and "Traceback" not in err, err
            if all(old):
                assert err.strip().endswith(CODES[sig][1]), err
            else:  # the stop came after the outputs were committed, and the message says so
                assert not any(old) and "complete before the stop" in err, f"try {i}: outputs mixed\n{err}"
                assert all(str(p) in err for p in outputs), err
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


def test_a_stop_while_waiting_for_ray_is_a_stop_not_an_internal_error():
    """Ray's C code turns an exception the signal handler raises inside it into SystemError
    ("returned a result with an exception set"): a red-team Ctrl-C of `capacity --executor ray`
    ended as an internal error, exit 1. The results are waited for inside `deferred()`, so the
    stop is raised between waits, and the results so far are not mixed up."""
    from odmactl.run.executors import _ray_jobs

    class FakeRay:  # what _ray_jobs calls; a stop lands in the second wait, inside "C code"
        waits = 0

        def remote(self, fn):
            return type("Remote", (), {"remote": staticmethod(lambda ctx, x: (ctx, x))})

        def put(self, value):
            return value

        def wait(self, refs, num_returns, timeout):
            FakeRay.waits += 1
            if FakeRay.waits == 2:
                try:
                    stops.handler(signal.SIGINT, None)
                except stops.Stopped as exc:
                    raise SystemError("<built-in method __new__> returned a result with an exception set") from exc
            return refs[:num_returns], refs[num_returns:]

        def get(self, ref):
            return ref[1] * 10

    stops.reset()
    with pytest.raises(stops.Stopped) as raised:
        _ray_jobs(FakeRay(), [("c", 1), ("c", 2), ("c", 3)], None, "x")
    assert raised.value.exit_code == 130 and FakeRay.waits == 2
    FakeRay.waits = 10  # no stop: every result, in the jobs' order
    assert _ray_jobs(FakeRay(), [("c", 1), ("c", 2), ("c", 3)], None, "x") == [10, 20, 30]


def test_a_stop_while_ray_starts_waits_until_it_has_started(monkeypatch):
    """A stop raised inside ray.init left Ray half started, and the process crashed (exit 139)
    after its message: ray_session starts Ray inside deferred(), so the stop comes once init is
    done, with the instance recorded for close_ray to stop and remove."""
    import types

    from odmactl.run import executors

    calls = []

    def init(**kwargs):
        if kwargs.get("address") == "auto":
            raise ConnectionError("none running")
        stops.handler(signal.SIGINT, None)  # the stop lands in the middle of the start-up
        calls.append("started")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: calls.append("shutdown"))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    stops.reset()
    with pytest.raises(stops.Stopped):
        executors.ray_session()
    assert calls == ["started"] and executors._STARTED  # started whole, and known to close_ray
    folder = executors._STARTED[-1]
    executors.close_ray()
    assert calls == ["started", "shutdown"] and not os.path.exists(folder)


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


def test_stops_from_the_last_output_to_the_end_give_one_outcome(small, tmp_path):
    """Red team's cases (issue 40): once plan had written its output and returned, a Ctrl-C in
    Python's finalisation (torch's teardown) killed the process: exit 130, no message, output new;
    and a second stop while the first one's message was printed printed a second message. Signals
    are sent every 2 ms from the moment the output is announced until the process ends: the run
    ends either with 0, or with the stop's code and one line naming the output as complete; never
    silently, never with two messages."""
    out = tmp_path / "p.toml"
    for attempt in range(3):
        out.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "odmactl", "plan", str(small), "--device", DEVICE,
                                 "--model", MODEL, "--predictor", "oracle", "--workers", "1", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        announced = False
        for line in proc.stdout:  # until the output is announced
            if line.startswith(f"wrote {out}"):
                announced = True
                break
        sent = 0
        while proc.poll() is None:
            proc.send_signal(signal.SIGINT if sent % 2 else signal.SIGTERM)
            sent += 1
            time.sleep(0.002)
        err = proc.stderr.read()
        assert announced and sent > 0 and out.exists()
        if proc.returncode == 0:
            assert err == ""
        else:
            assert proc.returncode in (130, 143), (proc.returncode, err)
            assert err.count("\n") == 1 and err.startswith("aborted: "), err
            assert err.endswith(f"complete before the stop: {out}; nothing else was written\n"), err


def test_a_stop_during_an_uninterruptible_import_is_raised_once_it_is_done(tmp_path, monkeypatch):
    """A red team's case (issue 40): a Ctrl-C while torch's C++ runtime initialised aborted the
    process (SIGABRT). torch is imported whole (core/stops.py `import_whole`); a module that stops
    itself half-way through stands in for it here."""
    (tmp_path / "half_way.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with _handled(signal.SIGINT):
        try:
            with pytest.raises(stops.Stopped):
                stops.import_whole("half_way")
            assert sys.modules["half_way"].DONE
        finally:
            sys.modules.pop("half_way", None)


def test_a_stop_once_the_outcome_is_decided_is_recorded_not_raised():
    """A red team's case (issue 40): a stop in Python's exit hooks raised inside an atexit callback."""
    stops.reset()
    stops.settle()
    stops.handler(signal.SIGINT, None)  # no exception
    assert stops.pending() == signal.SIGINT
    stops.reset()
    assert stops.pending() is None


def test_a_stop_while_a_figure_is_drawn_is_raised_once_it_is_drawn(tmp_path, monkeypatch):
    """CI's random-moment test once ended `capacity --report` as an internal error (ValueError
    "Invalid bounding box": matplotlib's C++ converters replace an exception raised in a callback),
    and a stop raised in one of matplotlib's weakref callbacks is dropped ("Exception ignored").
    The plot and report writers draw inside `deferred()` (core/stops.py `uninterrupted`): a stop
    sent while the figure is made is raised once the whole PNG is written, never inside matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from odmactl.render import plots

    def figure_stopped_half_way(doc):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here: without the deferral it raises now
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        return fig

    monkeypatch.setattr(plots, "capacity_figure", figure_stopped_half_way)
    out = tmp_path / "capacity.png"
    with _handled(signal.SIGINT):
        with pytest.raises(stops.Stopped):
            plots.write_capacity_plot({}, out)
        assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and out.stat().st_size > 1000
        assert stops.pending() is None


def test_every_figure_writer_draws_inside_the_deferral():
    """The writers that draw with matplotlib are `uninterrupted` (the test above shows why): a helper
    added above write_plan_report once took its decorator, and nothing failed."""
    from odmactl.render import html, plots

    for writer in (html.write_plan_report, html.write_capacity_report, plots.write_capacity_plot, plots.write_replay_plot):
        assert writer.__code__ is not getattr(writer, "__wrapped__", writer).__code__, writer.__name__


def test_a_stop_while_the_parent_waits_for_its_workers_is_raised_between_waits(monkeypatch):
    """CI once ended a SIGTERM to `plan` with "RuntimeError: release unlocked lock" printed by the
    worker pool's result thread above the stop's message: raised inside `as_completed`'s wait, the
    stop had landed in `threading.Condition.wait`'s lock re-acquire, and the `with` around it
    released the lock that thread held. The parent now waits in short slices inside `deferred()`
    (run/executors.py WAIT_S): a stop sent while the workers run their jobs is raised where a slice
    ends, long before the jobs would, and no thread fails."""
    from odmactl.run import executors

    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))  # the workers forked by then
    with _handled(signal.SIGTERM):
        started = time.monotonic()
        timer.start()
        try:
            with pytest.raises(stops.Stopped) as caught:
                executors.run_jobs([(60.0,)] * 3, 2, "sleep", fn=time.sleep)
        finally:
            timer.cancel()  # never left to signal a process without the handler
        assert time.monotonic() - started < 30
        frames = traceback.extract_tb(caught.value.__traceback__)
        assert "run_jobs" in [f.name for f in frames[-3:]]  # raised by run_jobs' waiting, between two waits
        # (`deferred`, or, in the moment between them, `handler`): never inside threading or futures
        assert not any(f.filename.endswith(("threading.py", "_base.py", "queue.py")) for f in frames), frames
        assert not failures


def test_a_stop_as_the_pool_shuts_down_is_raised_once_it_is_down(monkeypatch):
    """A red team's case: a stop that landed as the idle pool shut down escaped the pool's
    cleanup; its thread outlived the run and Python's exit hook printed "OSError: [Errno 9] Bad file
    descriptor" under the abort line. The shutdown runs inside `deferred()`: the stop is raised
    once the pool is down."""
    from odmactl.run import executors

    shut = []
    original = ProcessPoolExecutor.shutdown

    def shutdown_stopped_as_it_starts(pool, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here: without the deferral it raises now
        original(pool, *args, **kwargs)
        shut.append(pool)

    monkeypatch.setattr(ProcessPoolExecutor, "shutdown", shutdown_stopped_as_it_starts)
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    with _handled(signal.SIGTERM):
        with pytest.raises(stops.Stopped):
            try:
                executors.run_jobs([(0.01,)] * 3, 2, "sleep", fn=time.sleep)
            except stops.Stopped as stop:
                assert traceback.extract_tb(stop.__traceback__)[-1].name == "deferred"  # not `handler`
                raise
        assert shut and shut[0]._executor_manager_thread is None  # joined before the stop was raised
        assert not failures


def test_a_second_stop_while_the_temp_files_go_leaves_none_and_keeps_the_first(tmp_path, monkeypatch):
    """A red team's case: a SIGINT that landed while a SIGTERM'd command removed its temp files
    left the rest behind and ended the command as "interrupted" (exit 130). The temps go inside
    `deferred()`: all of them, and the first stop is the one raised."""
    def first(path):
        path.write_text("whole")

    def stopped(path):
        path.write_text("half")
        raise stops.Stopped(signal.SIGTERM)

    original = Path.unlink
    sent = []

    def unlink_stopped_once(self, *args, **kwargs):
        if not sent:
            sent.append(self)
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here: without the deferral it raises now
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink_stopped_once)
    with _handled(signal.SIGINT):
        with pytest.raises(stops.Stopped) as caught:
            write_outputs([(tmp_path / "a.json", first), (tmp_path / "b.json", stopped)], force=False)
        assert caught.value.signum == signal.SIGTERM and sent
        assert sorted(p.name for p in tmp_path.iterdir()) == []
