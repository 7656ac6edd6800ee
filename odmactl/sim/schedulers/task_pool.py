"""`task_pool`: the ODMA papers' Task Pool (seeds/001 §3.1, Figure 1), the default for `odma`.

The papers: the predictor gives each request a bucket tag, tagged requests wait in a central Task
Pool "that exposes bucket tags as first-class scheduling signals", and the scheduler forms batches
from it, "preferentially co-batching requests with compatible bucket tags". The short paper (seeds/
000 §IV.A) says the vLLM scheduler was unchanged: that reading is `fcfs`.

The rule here, where the papers are silent:
- A request's tag is the KV manager's `tag_of` at its arrival (odma: its bucket index, or "large",
  with its pool), with the boundaries then in force; a preempted request is tagged again when it is
  requeued, and a head whose tag the boundaries have since changed is moved to the front of its
  current tag's queue before it is tried. The pool keeps one queue per tag, oldest first.
- Each round considers the queues' heads, oldest first, and admits each that fits (KV space,
  `max_num_seqs`, the iteration's token budget, as `fcfs` does). A head that does not fit closes
  its tag for the round: the younger requests of that tag wait behind it (first come, first served
  within a tag), but a request of another tag with room is admitted. So a waiting large-tag
  request never blocks small ones with room (the head-of-line blocking of `fcfs`).
- Aging bounds starvation: a head that has waited longer than `[scheduler] aging_s` and does not
  fit closes every tag that draws on the same pool (a tag is a (pool, bucket) pair: odma's buckets
  share the main pool, its large tag has the large pool to itself), so no younger request is
  admitted to the memory it waits for; it takes the next room a release makes there. (Closing its
  own tag alone would let younger requests of other buckets take that room; closing every tag
  would hold small requests behind one waiting for a large block.)
- "Co-batching": the engine batches continuously (every running request decodes every iteration),
  so batch composition is the running set, and a tag changes only who is admitted when.

When admission is retried: as `fcfs` (a release, a preemption, a budget stop), and on an arrival
whose tag's queue is empty (one behind a head of its tag cannot pass it).
"""

from __future__ import annotations

from array import array
from collections import deque

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.allocator.base import AllocatorBase
from odmactl.hw.cost import to_ps
from odmactl.sim.batch import Batch
from odmactl.sim.schedulers.base import NO_ROOM
from odmactl.sim.schedulers.fcfs import FcfsScheduler


def _pool(tag):
    """The pool a tag's blocks come from: a (pool, bucket) tag's first part; any other tag is its own."""
    return tag[0] if isinstance(tag, tuple) else tag


def _room_for(closed, n: cython.longlong) -> bytearray:
    """The round's closed flags with room for n tags (a re-tagged head may have added one)."""
    if closed is None:
        return bytearray(n)
    if len(closed) < n:
        closed.extend(bytes(n - len(closed)))
    return closed


WAKE_SCAN = 256  # arrivals `first_waking` looks through before it answers early


class Waiting:
    """The task pool's `waiting`, as the engine and the routers read a scheduler's (`len()`, truth):
    how many requests wait, `n`. The requests themselves wait in the tags' queues. (A dict of the
    waiting requests, looked up at random as each left, took 7% of bench_replay.py's underloaded
    odma replay, whose queue holds hundreds of thousands.)"""

    def __init__(self) -> None:
        self.n = 0

    def __len__(self) -> int:
        return self.n


class TaskPoolScheduler(FcfsScheduler):
    """The Task Pool (the module docstring). State: `queues` maps a tag to its record number t;
    `records[t]` is [queue, pool number, tag], the queue holding the tag's waiting requests,
    oldest first, the records in the order tags appeared (`pools` numbers the pools); `heads[t]`
    (int64, what a round scans in C) is the first request of that queue, -1 when it is empty.
    `waiting` counts the requests in the queues (`len(waiting)` is the queue length the engine
    samples). What keeps `first_waking` cheap under overload: `tags` caches the tags of
    requests not yet arrived, each valid while `tagged_at[i]` is the KV manager's
    `boundary_updates` (an entry leaves the cache when its request arrives); `shape` counts the
    times a queue became empty or non-empty, and `wake` is the last answer (from, answer, shape,
    boundary_updates), which stands while neither changed and the next arrival has not passed it.
    `failed` maps a tag to the head whose reservation last failed there and the KV manager's
    `room_version` then: while both stand, the head is not tried again (it would fail again).
    `tagged_at[i]` (int64) is the KV manager's `boundary_updates` when request i was last tagged.
    Invariants: `len(waiting)` is the sum of the queues' lengths, a request is in at most one
    queue; `heads[t]` is the first request of `records[t]`'s queue, or -1."""

    name = "task_pool"

    def __init__(self) -> None:
        FcfsScheduler.__init__(self)
        self.waiting = Waiting()
        self.queues = {}
        self.aging_ps = 0
        self.tags = {}
        self.shape = 0
        self.wake = (-1, -1, -1, -1)
        self.failed = {}
        self.records = []
        self._heads_buffer = array("q", [-1]) * 16  # room for 16 records; doubled when full
        self.heads = self._heads_buffer
        self.pools = {}
        self.tagged_at = array("q")

    def start(self, batch: Batch, alloc: AllocatorBase, tier, cache, max_num_seqs: cython.longlong,
              max_prefill_tokens: cython.longlong, settings=None) -> None:
        FcfsScheduler.start(self, batch, alloc, tier, cache, max_num_seqs, max_prefill_tokens, settings)
        self.tagged_at = array("q", [-1]) * batch.num
        self.aging_ps = to_ps(settings.aging_s) if settings is not None else 0

    def _tag(self, i: cython.longlong):
        """Request i's tag now (the KV manager's `tag_of`), noting the boundaries it was read under."""
        b: Batch = self.batch
        self.tagged_at[i] = self.alloc.boundary_updates
        return self.alloc.tag_of(b.prompt[i] + b.gen[i], self.left(i), None if b.unc is None else b.unc[i])

    def _tagged_now(self, i: cython.longlong) -> cython.bint:
        """Whether request i was last tagged under the boundaries in force now."""
        updates: cython.longlong = self.alloc.boundary_updates
        return self.tagged_at[i] == updates

    def _upcoming_tag(self, i: cython.longlong):
        """`_tag(i)` of a request not yet arrived, cached while the boundaries stand."""
        tag = self.tags.get(i)
        if tag is None or not self._tagged_now(i):
            tag = self.tags[i] = self._tag(i)
        return tag

    def _record(self, tag) -> cython.longlong:
        """The record number of `tag` (made with an empty queue when new); a queue about to
        become non-empty changes the shape."""
        t: cython.longlong
        found = self.queues.get(tag)
        if found is not None:
            t = found
        else:
            t = len(self.records)
            self.queues[tag] = t
            self.records.append([deque(), self.pools.setdefault(_pool(tag), len(self.pools)), tag])
            if t == len(self._heads_buffer):
                self.heads = None  # a buffer cannot be resized while a view of it is held
                self._heads_buffer.extend(array("q", [-1]) * t)
                self.heads = self._heads_buffer
        if self.heads[t] < 0:
            self.shape += 1
        return t

    def arrive(self, i: cython.longlong) -> None:
        t: cython.longlong
        tag = self.tags.pop(i, None)  # tagged already by a scan of the upcoming arrivals
        if tag is None or not self._tagged_now(i):
            tag = self._tag(i)
        t = self._record(tag)
        if self.heads[t] < 0:
            self.dirty = True
            self.heads[t] = i
        self.records[t][0].append(i)
        waiting: Waiting = self.waiting
        waiting.n += 1

    def requeue(self, i: cython.longlong) -> None:
        """Preempted: tagged again (its prediction may be spent), first in its tag's queue."""
        self._to_front(i, self._tag(i))

    def _to_front(self, i: cython.longlong, tag) -> None:
        """Request i first in the queue of `tag`."""
        t: cython.longlong = self._record(tag)
        self.records[t][0].appendleft(i)
        self.heads[t] = i
        waiting: Waiting = self.waiting
        waiting.n += 1

    def first_waking(self, n: cython.longlong, j: cython.longlong) -> cython.longlong:
        """The first arrival from j on that no request of its tag waits before (it may join a batch
        with room); past WAKE_SCAN arrivals, the next one (an early answer is safe)."""
        b: Batch = self.batch
        k: cython.longlong = j
        end: cython.longlong = min(b.num, j + WAKE_SCAN)
        if n + len(self.stalled) >= self.max_num_seqs:
            return -1
        if not self.waiting:
            return j
        start, found, shape, updates = self.wake
        if shape == self.shape and updates == self.alloc.boundary_updates and start <= j and (found < 0 or j <= found):
            return found
        while k < end:
            found = self.queues.get(self._upcoming_tag(k))
            if found is None or self.heads[found] < 0:
                break
            k += 1
        found = k if k < b.num else -1  # k == end < num: no waking one among them, answer early
        self.wake = (j, found, self.shape, self.alloc.boundary_updates)
        return found

    def schedule(self) -> list:
        """Admit the oldest fitting heads of the tags' queues (the module docstring); returns the
        admitted, their KV reserved, not yet prefilled (None: no admission was tried)."""
        b: Batch = self.batch
        i: cython.longlong
        kv: cython.longlong
        t: cython.longlong
        best: cython.longlong
        tokens: cython.longlong = 0
        admitted: list
        closed: bytearray
        if not (self.dirty and self.waiting):
            return None
        self.dirty = False
        admitted = []
        self.begin_round()
        closed = None  # the tags closed for this round (made at the first)
        seats: cython.longlong = self.seats()
        while seats + len(admitted) < self.max_num_seqs:
            best = -1
            oldest: cython.longlong = 0
            for t in range(len(self.records)):  # the oldest open head (request numbers are in arrival order)
                i = self.heads[t]
                if i < 0 or (closed is not None and t < len(closed) and closed[t]):
                    continue
                if best < 0 or i < oldest:
                    oldest = i
                    best = t
            if best < 0:
                break
            record = self.records[best]
            tag = record[2]
            i = oldest
            if self._stale(i, best, tag):  # tagged with boundaries since refitted: moved to its queue now
                continue
            kv = self.new_tokens(i)
            if self.over_budget(tokens, kv, len(admitted)):
                self.dirty = True  # stopped by the budget alone: retried at the next boundary
                break
            if self._tried(tag, i, tokens, len(admitted)) == NO_ROOM:
                if self.never_fits(len(admitted)):
                    self._pop(best)
                    b.reject(i)
                elif self.now - b.arrival[i] > self.aging_ps:  # aged: nothing younger takes its pool's room
                    closed = _room_for(closed, len(self.records))
                    for t in range(len(self.records)):
                        if self.records[t][1] == record[1]:
                            closed[t] = 1
                else:
                    closed = _room_for(closed, len(self.records))
                    closed[best] = 1
                continue
            self._pop(best)
            admitted.append(i)
            tokens = self.charged(tokens, kv)
        return admitted

    def _tried(self, tag, i: cython.longlong, tokens: cython.longlong, admitted: cython.longlong) -> cython.longlong:
        """`_take(i, ...)`, or NO_ROOM at once where it failed for this head and no room came since."""
        status: cython.longlong
        memo = self.failed.get(tag)
        if memo is not None and memo[0] == i and memo[1] == self.alloc.room_version(tag):
            return NO_ROOM
        status = self._take(i, tokens, admitted)
        if status == NO_ROOM:  # a failed reservation gives nothing back: the version after it is the one before
            version = self.alloc.room_version(tag)
            if version != -1:
                self.failed[tag] = (i, version)
        return status

    def _stale(self, i: cython.longlong, t: cython.longlong, tag) -> cython.bint:
        """Whether head i (of record t, `tag`)'s tag changed since it was queued (the boundaries
        were refitted); then it is moved to the front of its current tag's queue (it has waited
        longest of its own, and an insertion in arrival order would cost the queue's length), and
        True."""
        if self._tagged_now(i):
            return False
        now = self._tag(i)
        if now == tag:
            return False
        self._pop(t)
        self._to_front(i, now)
        return True

    def _pop(self, t: cython.longlong) -> None:
        """The first request of record t's queue leaves it."""
        queue = self.records[t][0]
        queue.popleft()
        waiting: Waiting = self.waiting
        waiting.n -= 1
        if queue:
            self.heads[t] = queue[0]
        else:
            self.heads[t] = -1
            self.shape += 1
