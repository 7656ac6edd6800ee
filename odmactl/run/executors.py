"""Where plan's and capacity's replays and bounds run: in this process, in worker processes, or as
Ray tasks. Jobs come back in their own order whichever finishes first, so results never depend on
the executor or the number of workers."""

from __future__ import annotations

import atexit
import ctypes
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from odmactl.core.errors import ConfigError, RunError
from odmactl.core.stops import Stopped, deferred, import_whole
from odmactl.run.replay import ReplayContext, replay_policy

EXECUTORS = ("process", "ray")
# How long the parent waits for its workers' next result at a time, inside `deferred()`: a stop
# that lands while it waits is raised when the wait ends (at most this late), never inside it.
# Raised inside `as_completed`'s wait, a stop could land in the lock re-acquire that ends
# `threading.Condition.wait`; the `with` block around it (`Event.wait`) then released the lock
# the pool's result thread held, and that thread died printing "RuntimeError: release unlocked
# lock" under the stop's message (CI, test_signals.py, a SIGTERM to `plan` as its workers started;
# CPython: Condition.wait is not safe against an exception from a signal handler, python/cpython
# issues 78667 and 118433).
WAIT_S = 0.05


def replay_candidate(ctx: ReplayContext, table: dict, policy: str = "odma", series: bool = False) -> dict:
    """One replay of `policy` with the [allocator] settings `table` on the context's workload: its
    metrics, or (series=True) metrics, time series, the config used and the queue's growth."""
    result, config, _, _ = replay_policy(ctx, policy, table)
    if not series:
        return result.metrics
    return {"policy": policy, "max_model_len": ctx.max_len, "metrics": result.metrics, "series": result.series,
            "config": config.to_mapping(), "queue": result.queue}


def run_jobs(jobs: list[tuple], workers: int, label: str, progress=None, fn=None, executor: str = "process") -> list:
    """`fn(*job)` (default `replay_candidate`) for every job, in `workers` processes or as Ray tasks
    (`executor`); results in the jobs' order (whichever finishes first), so the outcome does not
    depend on the executor or the number of workers."""
    fn = fn or replay_candidate
    if executor == "ray":
        return run_on_ray(jobs, fn, label, progress)
    results: list = [None] * len(jobs)
    if workers == 1 or len(jobs) == 1:
        for i, job in enumerate(jobs):
            results[i] = fn(*job)
            if progress is not None:
                progress(label, i + 1, len(jobs))
        return results
    method = "fork" if sys.platform == "linux" else "spawn"
    pool = None
    try:
        with deferred():  # the workers are forked in the first submit (core/stops.py: a stop then is raised after it)
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                                       initializer=_worker_signals, initargs=(os.getpid(),))
            futures = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
            finished = queue.SimpleQueue()  # the futures as they finish (their callbacks put them)
            for future in futures:
                future.add_done_callback(finished.put)
        for done in range(1, len(futures) + 1):
            future = None
            while future is None:
                with deferred():  # a stop is raised between waits, never inside one (WAIT_S)
                    try:
                        future = finished.get(timeout=WAIT_S)
                    except queue.Empty:
                        pass
            try:
                results[futures[future]] = future.result()
            except BrokenProcessPool:
                raise RunError("a worker process died before it finished its job (killed from outside: the "
                               "out-of-memory killer, a kill command)", hint="fewer --workers use less memory; "
                               "--workers 1 runs every job in this process") from None
            if progress is not None:
                progress(label, done, len(jobs))
        with deferred():  # the workers are idle: a stop while they exit is raised once the pool is down
            pool.shutdown(wait=True)
    except BaseException:  # an error, Ctrl-C or SIGTERM in this process: stop the workers now, not after their jobs
        if pool is not None:
            _stop_workers(pool)
        raise
    return results


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers and wait for its bookkeeping thread to see them go, so that nothing
    of the pool is left running at exit (its exit hook would write to a closed pipe). SIGKILL, not
    SIGTERM: a worker forked a moment ago may not have run its initializer yet, and the handler it
    inherited records a SIGTERM rather than die (core/stops.py), after which it would wait forever
    on the queue's lock a killed sibling held. Called while an error or a stop is under way: a stop
    meanwhile (a second Ctrl-C) is the same stop."""
    try:
        with deferred():
            processes = list((getattr(pool, "_processes", None) or {}).values())
            for process in processes:
                process.kill()
            for process in processes:
                process.join()
            # a worker killed while it sent a result leaves the rest unsent, and this process's own copy
            # of the pipe's write end would keep the pool's thread reading for it forever: close it, so
            # the thread reads the end; and the call queue's feeder, blocked on a pipe no one reads any
            # more, is not waited for (it is a daemon thread)
            writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
            if writer is not None:
                writer.close()
            calls = getattr(pool, "_call_queue", None)
            if calls is not None:
                calls.cancel_join_thread()
            pool.shutdown(wait=True, cancel_futures=True)
    except Stopped:
        pass


def _worker_signals(parent_pid: int) -> None:
    """A worker leaves Ctrl-C and SIGTERM to the parent, which stops it (a forked worker would
    otherwise inherit the CLI's handlers and raise in the middle of the pool's own bookkeeping; until
    this runs, the handler it inherited records a signal rather than raise: it was forked inside
    `deferred`). On Linux it also dies with its parent (PR_SET_PDEATHSIG): a parent killed outright
    (SIGKILL, which no handler sees) would otherwise leave it waiting on the pool's pipe forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform == "linux":
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent_pid:  # the parent died before the line above
            os._exit(1)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def run_on_ray(jobs: list[tuple], fn, label: str, progress=None) -> list:
    """The same jobs as Ray tasks (on `ray_session`'s Ray); a job's first item (its ReplayContext)
    is put in the object store once however many jobs share it."""
    return _ray_jobs(ray_session(), jobs, fn, label, progress)


_STARTED: list[str] = []  # the session folder of the Ray instance this process started (at most one)


# Ray's own log level where odmactl finds or starts the instance itself: its INFO and WARNING lines
# ("Started a local Ray instance", token authentication) came between odmactl's progress lines on
# stderr; a cluster named by RAY_ADDRESS keeps Ray's default
RAY_LOGGING = logging.ERROR


def ray_session():
    """Ray, connected: the instance already up in this process; else the cluster RAY_ADDRESS names,
    or one running on this machine (`ray start --head`), as `ray.init()` finds them, left as they
    are; else a local instance started for this process, once however many searches it runs (plan
    runs three). Ray keeps a session folder (logs, sockets) per start under /tmp/ray; this one's
    goes in a temporary folder, and `close_ray` stops the instance and removes the folder at exit,
    after a stop too, so no temp file outlives the run."""
    try:
        ray = import_whole("ray")
    except ImportError:
        raise ConfigError("--executor ray needs Ray installed", hint="pip install 'odmactl[ray]'") from None
    if ray.is_initialized():
        return ray
    while _STARTED:  # ours, shut down by someone else (ray.shutdown()): its folder goes now
        shutil.rmtree(_STARTED.pop(), ignore_errors=True)
    # connecting and starting run inside deferred() (core/stops.py), a stop raised once they are
    # done: one raised inside ray.init left its processes half made, and the process crashed
    # (SIGSEGV, exit 139) after its "interrupted" message (a red-team trial: 9 of 43 stops sent
    # 3-4 s into a run)
    with deferred():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
            return ray
        try:
            ray.init(address="auto", logging_level=RAY_LOGGING)
            return ray
        except ConnectionError:  # none running here (caught in the block, which a pending stop then ends)
            pass
        folder = tempfile.mkdtemp(prefix="odmactl-ray-")
        _STARTED.append(folder)
        atexit.register(close_ray)
        ray.init(_temp_dir=folder, include_dashboard=False, logging_level=RAY_LOGGING)
    return ray


def close_ray() -> None:
    """Stop the Ray instance `ray_session` started, and every process it left (Ray's agents outlive
    its shutdown by up to a minute, writing logs into the folder), then remove its session folder.
    Nothing where this process started none."""
    if not _STARTED:
        return
    import ray

    folder = _STARTED.pop()
    left = _ray_processes(folder)
    ray.shutdown()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass
    shutil.rmtree(folder, ignore_errors=True)


def _ray_processes(folder: str) -> list[int]:
    """The processes of the Ray instance whose session folder is `folder`: this process's children
    started with it on their command line (GCS, raylet, monitors, dashboard), and all below them
    (the agents and workers, whose command lines Ray rewrites to ray::...). Not this process's
    other children."""
    found: list[int] = []
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                command = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        if folder in command and pid not in found:
            found += [pid] + [p for p in _descendants(pid) if p not in found]
    return found


def _descendants(root: int) -> list[int]:
    """The processes below `root` (Linux: from /proc; none elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after the name, which may hold spaces: state, ppid
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _ray_jobs(ray, jobs: list[tuple], fn, label: str, progress=None) -> list:
    """`run_on_ray`'s jobs on the Ray instance it set up."""
    remote = ray.remote(fn)
    shared: dict[int, object] = {}
    refs = []
    for ctx, *rest in jobs:
        if id(ctx) not in shared:
            shared[id(ctx)] = ray.put(ctx)
        refs.append(remote.remote(shared[id(ctx)], *rest))
    # waited for inside `deferred()`, a slice at a time, as the process pool's results: a stop raised
    # inside Ray's C code came out as SystemError ("returned a result with an exception set"), an
    # internal error with exit 1 instead of "interrupted" and 130
    results: list = [None] * len(refs)
    position = {ref: i for i, ref in enumerate(refs)}
    waiting = list(refs)
    while waiting:
        with deferred():
            ready, waiting = ray.wait(waiting, num_returns=1, timeout=WAIT_S)
            for ref in ready:
                results[position[ref]] = ray.get(ref)
        if ready and progress is not None:
            progress(label, len(refs) - len(waiting), len(jobs))
    return results
