"""Replicas replayed together: R engines on one clock and a router that sees their state.

Requests are routed in arrival order. Before request j is routed every engine has run up to its
arrival: each `Replay` of the cluster (engine.py `start(owner, me)`: it replays every request,
`owner[i]` the engine request i was routed to, -1 until then) pauses when an unrouted request is
due, skips the requests of other engines, and stops its decode segments at every arrival, so the router sees each engine at its first step boundary at
or after the arrival (a prefill iteration in flight finishes first), as a router polling engines
between their steps does. The router's rules (`ROUTERS`):

- `round-robin`: request j to engine j mod R, whatever their state (what capacity did before
  issue 38, replaying each engine's share apart);
- `least-outstanding`: the fewest requests in the engine (running, waiting, stalled, being
  prefilled), as vLLM's production-stack router and most L7 balancers do ("least request");
- `least-kv`: the least KV memory in demand, ties to fewer outstanding requests;
- `cluster-manager`: ODMA's Cluster Manager (sim/router.py): the most KV memory free of that
  demand, then the least load. The papers weigh "free capacity and bucket occupancy" per bucket;
  odmactl's ODMA carves every bucket's blocks from one main pool, so the free memory of the pool is
  that of every bucket, and the rule reads the pool's for every policy;
- `round-robin-ready`: round-robin over the engines ready to start the request: nothing routed
  to it still waiting to start, and room for the reservation the request would take there (the
  allocator's `room_for`: static's slot or s3's block in one free piece, odma's block in the
  region it goes to, the prompt's blocks or pages for paged, ellm and unified); where none is ready,
  `least-kv`'s choice. It reads no
  policy's reservations as load, so until memory or a queue tells engines apart it routes as
  round-robin does and policies that hold the same requests are routed alike (`least-kv` reads
  odma's insurance blocks and static's slots as demand); and it passes over an engine that would
  queue the request while another would start it, which round-robin does not (static at
  max_model_len: a third more devices behind round-robin, docs/capacity.md).

An engine's KV demand is what it holds (`Replay.reserved_bytes`) plus the prompts routed to it
that have not started their prefill (`Cluster.pending`): an engine reached at a boundary past two arrivals
has not admitted the first yet when the second is routed, and a router reading only what is
reserved would send it the second too (on 3,000 requests over 8 MLU370-X4 engines, batching their
prefills: TTFT p99 0.45 s against 0.29 s round-robin).

Ties go round-robin (`pick`). `Cluster.run` returns one ReplayResult per engine, each over its
own requests (capacity/search.py pools their latencies).
"""

from __future__ import annotations

from array import array
from collections import deque

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.core.errors import ConfigError
from odmactl.sim.batch import Batch, Requests
from odmactl.sim.collector import paused_collector
from odmactl.sim.engine import Replay
from odmactl.sim.router import ROUTERS, cluster_manager
from odmactl.sim.schedulers.base import Scheduler

ROUND_ROBIN, LEAST_OUTSTANDING, LEAST_KV, CLUSTER_MANAGER, ROUND_ROBIN_READY = 0, 1, 2, 3, 4  # ROUTERS' positions


def outstanding(engine: Replay) -> cython.longlong:
    """The requests in an engine: running, waiting, stalled, swapped out, or being prefilled."""
    s: Scheduler = engine.sched
    return s.seats() + len(s.waiting) + len(s.parked)


def pick(rule: cython.longlong, j: cython.longlong, engines: list, pending: cython.longlong[::1]) -> cython.longlong:
    """The engine the router `ROUTERS[rule]` sends request j to. Ties go round-robin: to the first
    tied engine from j mod R on (ties to the lowest index would load the first engines more, since
    small loads tie often: on Azure conv at 18 engines, 813 requests to engine 0 against 673 to
    engine 16). least-kv compares (demand, outstanding) in that order, least-outstanding the
    outstanding requests alone; the first engine in that order with the least wins."""
    n: cython.longlong = len(engines)
    first: cython.longlong = j % n
    e: cython.longlong
    p: cython.longlong
    best: cython.longlong = -1
    best_demand: cython.longlong = 0
    best_load: cython.longlong = 0
    demand: cython.longlong = 0
    load: cython.longlong
    engine: Replay
    if rule == ROUND_ROBIN:
        return first
    if rule == CLUSTER_MANAGER:  # its rule lives in sim/router.py
        order = list(range(first, n)) + list(range(first))
        pos = cluster_manager([engines[e].alloc.pool_bytes - engines[e].reserved_bytes() - pending[e] for e in order],
                              [outstanding(engines[e]) for e in order])
        return order[pos]
    for p in range(n):
        e = first + p if first + p < n else first + p - n
        engine = engines[e]
        if rule == LEAST_KV:
            demand = engine.reserved_bytes() + pending[e]
            if best >= 0 and demand > best_demand:
                continue
        load = outstanding(engine)
        if best < 0 or demand < best_demand or load < best_load:
            best, best_demand, best_load = e, demand, load
    return best


def ready_in_turn(engines: list, pending: cython.longlong[::1], turn: cython.longlong, i: cython.longlong) -> cython.longlong:
    """`round-robin-ready`'s engine for request i: the first from engine `turn` on that has no
    request waiting to start (no prompt routed to it still pending) and room for the reservation
    the request would take there (the allocator's `room_for`, with the prediction its scheduler
    passes a reserve: the region and the contiguous piece its block needs, odma's boundaries each
    engine's own); -1 where none has."""
    n: cython.longlong = len(engines)
    p: cython.longlong
    e: cython.longlong
    engine: Replay
    b: Batch
    for p in range(n):
        e = turn + p if turn + p < n else turn + p - n
        if pending[e]:
            continue
        engine = engines[e]
        b = engine.batch
        if engine.alloc.room_for(b.prompt[i], engine.sched.left(i), None if b.unc is None else b.unc[i]):
            return e
    return -1


class Cluster:
    """`replicas` engines made by `make_engine()` (a Replay of `workload`, not yet run), behind
    `router` (one of ROUTERS). Invariants while running: owner[i] is the engine request i was
    routed to, -1 for the requests not yet routed (all after the last routed one); pending[e] is
    the sum of prompt_tokens x bytes_per_token over unstarted[e]; 0 <= turn < R.

    An engine with no request in it (`outstanding` 0) is not resumed at an arrival it was not
    sent: all it would do is skip the other engines' requests and move its clock to the next
    arrival (an empty engine decodes nothing, so nothing is counted or sampled on the way), and
    it does the same when it is next resumed, so its state at every routing decision and its
    result are the same. Capacity's replica search replays up to hundreds of engines, most of
    them empty at any arrival.

    Compiled (setup.py, cluster.pxd), the routing loop calls the engines' C methods: with dozens
    of engines it visits every one at every arrival, which from Python cost more than the replays."""

    def __init__(self, make_engine, replicas: int, router: str, workload) -> None:
        if router not in ROUTERS:
            raise ConfigError(f"unknown router {router!r} (choose from: {', '.join(ROUTERS)})", key="router")
        self.engines = [make_engine() for _ in range(replicas)]
        self.rule = ROUTERS.index(router)
        self.owner = array("q", [-1]) * workload.size
        self.prompt_tokens = array("q", workload.prompt_tokens.tolist())
        self.arrival_ps = array("q", workload.arrival_ps.tolist())
        self.pending = array("q", [0]) * replicas  # per engine: the KV bytes of the prompts routed to it, not started
        self.unstarted = [deque() for _ in range(replicas)]  # those requests, in routing order
        self.turn = 0  # round-robin-ready: the engine its next search starts from (the one after the last it chose)

    def _settle(self) -> None:
        """Take the requests whose prefill began off each engine's pending demand (from the front:
        one admitted past an unstarted older one stays counted until that one starts)."""
        e: cython.longlong
        per_token: cython.longlong
        engine: Replay
        pending: cython.longlong[::1] = self.pending
        prompt: cython.longlong[::1] = self.prompt_tokens
        for e in range(len(self.engines)):
            queue = self.unstarted[e]
            if not queue:
                continue
            engine = self.engines[e]
            per_token = engine.alloc.bytes_per_token
            while queue and engine.batch.started(queue[0]):
                pending[e] -= prompt[queue.popleft()] * per_token

    def run(self) -> list:
        """Route every request as it arrives, run the engines to the end; their results, in order
        (the cycle collector paused: sim/collector.py)."""
        with paused_collector():
            return self._route()

    def _route(self) -> list:
        """`run` (its docstring)."""
        demand: cython.bint = self.rule in (LEAST_KV, CLUSTER_MANAGER, ROUND_ROBIN_READY)
        arrival: cython.longlong[::1] = self.arrival_ps
        owner: cython.longlong[::1] = self.owner
        pending: cython.longlong[::1] = self.pending
        prompt: cython.longlong[::1] = self.prompt_tokens
        n: cython.longlong = len(self.owner)
        j: cython.longlong
        k: cython.longlong
        e: cython.longlong
        due: cython.longlong
        last: cython.bint
        engine: Replay
        engine = self.engines[0]  # one set of per-request arrays: each engine touches its own requests' entries
        requests = Requests(engine.w, engine.max_len, engine.settings.max_new_tokens)
        for e in range(len(self.engines)):
            engine = self.engines[e]
            engine.start(self.owner, e, requests)  # engine e of the cluster: it pauses where owner[i] < 0 is due
        for engine in self.engines:
            engine.resume()  # each runs until request 0 is due
        for j in range(n):
            if demand:
                self._settle()
            if self.rule == ROUND_ROBIN_READY:
                k = ready_in_turn(self.engines, self.pending, self.turn, j)
                if k >= 0:
                    self.turn = k + 1 if k + 1 < len(self.engines) else 0
                else:  # no engine is ready: the one least in demand, where it queues for the least
                    k = pick(LEAST_KV, j, self.engines, self.pending)
            else:
                k = pick(self.rule, j, self.engines, self.pending)
            owner[j] = k
            if demand:
                self.unstarted[k].append(j)
                engine = self.engines[k]
                pending[k] += prompt[j] * engine.alloc.bytes_per_token
            last = j + 1 == n  # the last request: every engine runs to its end
            due = 0 if last else arrival[j + 1]
            for e in range(len(self.engines)):
                engine = self.engines[e]
                # an engine not paused has finished its part; one whose clock is past the next
                # arrival, not sent this request, would only skip it (it does when next resumed);
                # an empty one would only move its clock to the next arrival (the class docstring)
                if engine.paused and (e == k or last or (engine.t < due and outstanding(engine) > 0)):
                    engine.resume()
        return [engine.finish() for engine in self.engines]
