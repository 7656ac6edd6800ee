"""What happens when running requests outgrow their memory: the engine's growth step.

A contiguous block that one more token does not fit is extended by the policy (grown in place,
given more page ranges, or moved: the copy's time is charged) or, refused, its request stalls in
place when the policy says a release can make room (`overflow_waits`: ODMA's large pool; the
request keeps its block, leaves the batch and waits in the scheduler's `stalled` queue until a
release lets `resume` move it) and is preempted otherwise; block growth takes a block at a time, and when the blocks run out (or the
iteration's block limit, where the pool is shared) the scheduler's victims are preempted:
released, queued first, recomputed at their next prefill (vLLM's recompute preemption).

Compiled (setup.py, growth.pxd), Growth is an extension type whose methods the engine calls as C
functions; the same source runs in Python.
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.allocator.base import Allocation, AllocatorBase
from odmactl.hw.cost import to_ps
from odmactl.sim.batch import Batch
from odmactl.sim.schedulers.base import Scheduler
from odmactl.sim.tally import Tally


class Growth:
    """The growth step of one replay, over its batch, KV manager, scheduler and tally (`cache`:
    the policy's adapter cache, or None). Fast-forwarding (`batch.ff`), growth reaches the
    allocator lazily: a contiguous request's length at its overflow, blocks never (the batch
    counts them). `prefix`: the replay's prefix cache (allocator/prefix.py), or None."""

    __slots__ = ("batch", "alloc", "sched", "tally", "cost", "cache", "resumed_at", "prefix")

    def __init__(self, batch: Batch, alloc: AllocatorBase, sched: Scheduler, tally: Tally, cost, cache) -> None:
        self.batch = batch
        self.alloc = alloc
        self.sched = sched
        self.tally = tally
        self.cost = cost
        self.cache = cache
        self.resumed_at = 0  # the allocator's release count at the last `unstall` that resumed
        self.prefix = None

    def unpin(self, i: cython.longlong) -> None:
        """Request i left the batch or the host tier: its adapter, if any, is unpinned."""
        if self.cache is not None and self.batch.adapters[i] >= 0:
            self.cache.release_adapter(self.batch.adapters[i])

    def first_token_room(self, i: cython.longlong, k: cython.longlong) -> None:
        """Request i, admitted to compute k prompt (and recomputed) tokens, gets room for its first
        token (its reservation was for the prompt): block growth takes the block now; a contiguous
        block that already holds it is told lazily when fast-forwarding (`contiguous` at an
        overflow, release(a, final_tokens) at completion)."""
        b: Batch = self.batch
        a: Allocation = b.allocs[i]
        if (b.block_growth or not b.ff or k + 1 > a.capacity_tokens) and not self.alloc.extend(a, k + 1 - b.cached[i]):
            raise AssertionError(f"admission of {b.ids[i]} left no room for its first token")

    def preempt(self, i: cython.longlong) -> None:
        """Running request i is preempted."""
        b: Batch = self.batch
        v: cython.longlong = b.leave(i)
        b.gen[i] = v - b.prompt[i]
        self._evict(i, v)

    def give_back(self, i: cython.longlong, v: cython.longlong, completed: cython.bint) -> None:
        """Request i, just out of the batch holding v KV tokens, gives its memory back: to the
        prefix cache, which keeps its cached units (fast-forwarding, after evicting what eager
        growth had evicted with those v tokens still held), else to the allocator (`completed`: at
        its final length, of which its cached prefix is not its own)."""
        b: Batch = self.batch
        if self.prefix is not None:
            if b.ff:
                self.prefix.sync(b.num_blocks - b.held_blocks(self.alloc) + (-v // b.B))
            self.prefix.release(i, b.allocs[i])
        elif completed:
            self.alloc.release(b.allocs[i], v - b.cached[i])
        else:
            self.alloc.release(b.allocs[i])

    def _evict(self, i: cython.longlong, v: cython.longlong) -> None:
        """Request i, out of the batch holding v KV tokens, gives its memory back and waits again,
        first (recomputed at its next prefill)."""
        b: Batch = self.batch
        self.unpin(i)
        self.give_back(i, v, False)
        b.allocs[i] = None
        self.sched.requeue(i)
        self.tally.preemptions += 1

    def stall(self, i: cython.longlong) -> None:
        """Request i, refused growth, keeps its block and leaves the batch to wait for room."""
        b: Batch = self.batch
        b.gen[i] = b.leave(i) - b.prompt[i]
        self.sched.stalled.append(i)
        self.tally.stalls += 1

    def resume(self) -> cython.longlong:
        """The stalled requests, oldest first, extended again (a release may have made room): each
        that fits rejoins the batch; returns the copies' time."""
        b: Batch = self.batch
        a: Allocation
        i: cython.longlong
        v: cython.longlong
        dt: cython.longlong = 0
        step: cython.longlong
        for i in list(self.sched.stalled):
            a = b.allocs[i]
            v = b.prompt[i] + b.gen[i]
            step = self._extend(a, v + 1)
            if step < 0:
                continue
            dt += step
            self.sched.stalled.remove(i)
            b.join(i, v)
            b.push_finish(i, b.seq_of[i])
            if b.ff:
                b.push_overflow(i, b.seq_of[i], a.capacity_tokens)
        return dt

    def unstall(self) -> cython.longlong:
        """`resume` once a release happened since the last try, or when nothing runs; its time."""
        if self.alloc.releases == self.resumed_at and self.batch.running:
            return 0
        self.resumed_at = self.alloc.releases
        return self.resume()

    def release_offloaded(self, i: cython.longlong) -> None:
        """Request i, done at its first token while its KV was in the host tier, gives it back."""
        a: Allocation = self.batch.allocs[i]
        self.batch.reserved_tokens[i] = a.capacity_tokens
        self.alloc.release(a)
        self.unpin(i)

    def preempt_stalled(self) -> None:
        """Nothing runs and no stalled request fits: the oldest is preempted (its block released;
        recomputed when it is admitted again)."""
        self._evict(self.sched.stalled.popleft(), 0)  # a stalled block is contiguous: no prefix cache

    def contiguous(self, i: cython.longlong) -> cython.longlong:
        """Request i needs one more token than its block holds: extend (move), stall or preempt it;
        returns the copy's time. Growth inside the block reached the allocator lazily when
        fast-forwarding: it is caught up first."""
        b: Batch = self.batch
        a: Allocation = b.allocs[i]
        dt: cython.longlong
        v: cython.longlong = b.kv(i)
        if a.used_tokens != v:
            self.alloc.extend(a, v)
        dt = self._extend(a, v + 1)
        if dt < 0:
            if self.alloc.overflow_waits(a, v + 1):
                self.stall(i)
            else:
                self.preempt(i)
            return 0
        if b.ff:
            b.push_overflow(i, b.seq_of[i], a.capacity_tokens)
        return dt

    def _extend(self, a: Allocation, total: cython.longlong) -> cython.longlong:
        """Extend `a` to `total` tokens, charging a move's copy: its time, 0 when nothing was copied
        (grown in place, or by more page ranges), -1 when the policy refused."""
        dt: cython.longlong = 0
        before = self.alloc.migrated_bytes
        if not self.alloc.extend(a, total):
            return -1
        copied = self.alloc.migrated_bytes - before
        if copied:
            dt = to_ps(self.cost.migration_s(copied))
            self.tally.migrated(copied, dt, self.alloc.reserved_bytes)
        return dt

    def until_fits(self, need_at: cython.longlong, limit: cython.longlong) -> None:
        """Block growth: preempt the scheduler's victims until the next iteration's blocks fit in
        `limit` blocks."""
        victim: cython.longlong
        shared: cython.longlong
        b: Batch = self.batch
        if self.prefix is not None and b.running and need_at > limit:
            self.prefix.sync(0)  # eager growth took every free cached block before it failed
        while b.running and need_at > limit:
            victim = self.sched.victim()
            need_at -= -(-(b.kv(victim) + 1) // b.B)
            shared = b.shared
            self.preempt(victim)
            need_at += b.shared - shared  # what its cached units still hold for others

    def fast(self) -> cython.longlong:
        """Fast-forwarding: the overflows due at this iteration, then block exhaustion; returns
        the time the copies took."""
        i: cython.longlong
        b: Batch = self.batch
        need: cython.longlong
        limit: cython.longlong
        dt: cython.longlong = 0
        while True:
            i = b.due(b.overflow)
            if i < 0:
                break
            dt += self.contiguous(i)
        if b.block_growth:
            need = b.blocks_next()
            limit = self.alloc.block_limit(len(b.running), len(b.running))
            if need > limit:
                if limit == b.num_blocks:  # eager growth takes the last free block, then fails
                    b.peak_blocks = b.num_blocks
                self.until_fits(need, limit)
        return dt

    def stepping(self) -> cython.longlong:
        """Stepping: every running request grows by one token now, eagerly (first, where the
        iteration may hold fewer blocks than the pool, its victims preempted until it fits);
        returns the time the copies took."""
        a: Allocation
        i: cython.longlong
        b: Batch = self.batch
        need: cython.longlong = 0
        limit: cython.longlong
        dt: cython.longlong = 0
        if b.block_growth:
            limit = self.alloc.block_limit(len(b.running), len(b.running))
            if limit < b.num_blocks:
                need = b.prefilling_blocks + b.shared  # prompts being chunked hold theirs (chunked schedules)
                for i in b.running:
                    need += -(-(b.kv(i) + 1) // b.B)
                self.until_fits(need, limit)
        for i in list(b.running):
            if i not in b.running:
                continue
            a = b.allocs[i]
            if not b.block_growth:
                if b.kv(i) + 1 > a.capacity_tokens:
                    dt += self.contiguous(i)
                else:
                    self.alloc.extend(a, b.kv(i) + 1)
                continue
            while i in b.running and not self.alloc.extend(a, b.kv(i) + 1 - b.cached[i]):
                self.preempt(self.sched.victim())
        return dt
