"""The engine: one replay of a trace through a scheduler and a KV manager -> ReplayResult.

The scheduler (sim/schedulers/, chosen by name) decides each iteration's batch and whom to
preempt; the KV manager is the policy (allocator/), asked through its declared protocol
(allocator/base.Allocator), never by name; the engine advances the clock. A prefill iteration
runs the admitted prompts and yields each its first token; a decode iteration grows every running
request by a token; completion releases a request's memory. Growth past a reservation asks the
policy: a contiguous block is extended (a move's copy is charged) or its request preempted; block
growth takes a block at a time and, past the pool or the iteration's block limit, the scheduler's
victims are preempted (released, queued first, recomputed later).

Under a chunked engine (vLLM v1) a step grows the running requests, then runs their decodes beside
the prompt chunks the rest of its budget buys (sim/chunked.py; hw/cost.py, "mixed").

Time is integer picoseconds. Between events that change the batch the batch is fixed, so
`Segment` sums the next decode iterations in closed form, whatever the queue holds;
`fast_forward=False` steps token by token, the reference (README, "Replay"). Compiled (setup.py,
engine.pxd), the clock is a 64-bit C integer: at most 2**63 ps (106 days), else OverflowError.
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

import numpy as np

from odmactl.allocator.base import Allocation, AllocatorBase
from odmactl.allocator.prefix import prefix_cache
from odmactl.hw.cost import KvLayout
from odmactl.sim.batch import Batch
from odmactl.sim.chunked import Chunker
from odmactl.sim.collector import paused_collector
from odmactl.sim.growth import Growth
from odmactl.sim.link import HostLink
from odmactl.sim.metrics import ReplayResult, replay_result
from odmactl.sim.prefill import PrefillClock
from odmactl.sim.probing import chunk_pairs, decode_step
from odmactl.sim.schedulers import make_scheduler
from odmactl.sim.schedulers.base import Scheduler
from odmactl.sim.segment import Segment
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.tally import Tally, seconds
from odmactl.sim.workload import Workload


class Replay:
    """One replay of `workload` through `allocator`; `run()` returns the ReplayResult.
    `max_model_len` caps every request's KV tokens and the settings' `max_new_tokens` its output:
    longer outputs are truncated (counted), prompts that leave no room for one output token are
    rejected (counted). State during `run()`: the batch (sim/batch.py: per-request state, who
    runs, the event heaps), the scheduler, the host link, the clock `t` and the tally."""

    __slots__ = ("w", "alloc", "settings", "max_len", "coeff", "cost", "progress", "probe", "batch", "sched", "link",
                 "tier", "cache", "segment", "prefill_clock", "runs", "tally", "growth", "ff", "num", "next_arrival",
                 "block_bytes", "t", "chunked", "chunker", "owner", "me", "paused")

    def __init__(self, workload: Workload, allocator: AllocatorBase, cost, max_model_len: int,
                 settings: SchedulerSettings = SchedulerSettings(), progress=None, probe=None) -> None:
        if probe is not None and settings.fast_forward:
            raise ValueError("an on-device probe runs every iteration: replay with fast_forward=False")
        self.w = workload
        self.alloc = allocator
        self.settings = settings
        self.max_len = max_model_len
        self.coeff = cost.step_coefficients(KvLayout(allocator.read_block_tokens), max_batch=settings.max_num_seqs)
        self.cost = cost
        self.progress = progress
        self.probe = probe  # device.ondevice.StepProbe: runs and times each iteration on the device

    def run(self) -> ReplayResult:
        with paused_collector():  # sim/collector.py
            self.start(None, 0)
            self.resume()
            return self.finish()

    def resume(self) -> cython.bint:
        """Run until the replay ends (True) or, as engine `me` of a cluster (sim/cluster.py), until
        an unrouted request is due (False: `owner[i]` < 0)."""
        steps: cython.longlong = 0
        b: Batch = self.batch
        sched: Scheduler = self.sched
        self.paused = False
        while True:
            self._arrive()
            if self.paused:
                return False
            if sched.parked:
                sched.swap_in()
                self.link.pending_ps += self.link.moved_ps()
            if sched.stalled:
                self.t += self.growth.unstall()
            sched.now = self.t
            if self.chunked:
                if self._step_chunked():  # a step with prompt work; else the growth for a decode is done
                    self._complete()
                    sched.decoded()
                    continue
            else:
                admitted = sched.schedule()
                if admitted:
                    self._prefill(admitted)
                    continue
            if not b.running:
                assert not sched.parked, "an offloaded request could not be fetched into an empty pool"
                if sched.stalled:  # nothing runs and no stalled request fits: nothing else can progress
                    self.growth.preempt_stalled()
                    sched.released()
                    continue
                if sched.idle():
                    continue
                if self.next_arrival < self.num:
                    self.t = max(self.t, b.arrival[self.next_arrival])
                    continue
                break
            if not self.chunked and not self._grow():
                continue
            if self.ff:
                if not self._decode_fast():
                    continue
            else:
                self._decode_stepping()
            self._complete()
            sched.decoded()
            steps += 1
            if self.progress is not None and steps % 4096 == 0:
                self.progress("replay", self.tally.completed, self.num)
        return True

    def start(self, owner, me: cython.longlong, requests=None) -> None:
        """Fresh per-run state (see the class docstring); `owner` None, or an int64 buffer of the engine
        each request was routed to (-1: not yet) when engine `me` of a cluster, sharing `requests`."""
        w, alloc, settings = self.w, self.alloc, self.settings
        self.ff = settings.fast_forward
        self.chunked = settings.chunked
        block_growth: cython.bint = alloc.block_size_tokens is not None  # else one contiguous block a request
        self.batch = Batch(w, self.max_len, settings.max_new_tokens, alloc.block_size_tokens,
                           alloc.num_blocks if block_growth else 0, self.ff, requests)
        self.num = w.size
        self.block_bytes = alloc.block_bytes if block_growth else 0
        self.tier = alloc.host_tier() if block_growth else None
        self.cache = alloc.adapter_cache() if w.adapters is not None else None
        self.link = HostLink(self.cost, [self.tier, self.cache])
        self.sched = make_scheduler(settings.policy_for(alloc))
        self.sched.start(self.batch, alloc, self.tier, self.cache, settings.max_num_seqs,
                         settings.batched_tokens(self.max_len), settings)
        self.segment = Segment(self.coeff, alloc.block_size_tokens)  # the batch between two events
        self.prefill_clock = PrefillClock(self.cost.prefill)
        self.runs = self.segment.runs  # its run counts at offsets 0..B, written at each event
        self.t = self.next_arrival = 0
        self.owner, self.me = owner, me
        self.tally = Tally(settings.series_points, len(alloc.boundaries_tokens) > 0)
        self.growth = Growth(self.batch, alloc, self.sched, self.tally, self.cost, self.cache)
        self.sched.prefix = self.growth.prefix = prefix_cache(alloc, self.batch, w.prefix, settings.caches_prefixes,
                                                              w.prompt_tokens)
        self.chunker = Chunker(self.batch, self.sched, self.growth, self.tally, settings.batched_tokens(self.max_len),
                               settings.engine, self.tier, self.prefill_clock, self.segment) if self.chunked else None

    def finish(self) -> ReplayResult:
        """The result (a cluster's engine: over its own requests)."""
        b: Batch = self.batch
        if b.block_growth and self.ff:
            # block growth reached the allocator lazily (at completion and preemption); the peak is eager growth's
            self.alloc.record_peak(b.peak_blocks * self.block_bytes)
        counters = self.tally.counters(self.t, b.rejections, self.link, self.alloc.kv_pool_bytes, self.growth.prefix)
        mine = None if self.owner is None else np.frombuffer(self.owner, dtype=np.int64) == self.me
        return replay_result(self.alloc, counters, b.timeline(mine), self.tally.series, self.tally.boundaries)

    def reserved_bytes(self):
        """The KV bytes held now (with lazy block growth, the blocks the batch counts)."""
        b: Batch = self.batch
        return (b.runs_now + b.prefilling_blocks + b.shared) * self.block_bytes if b.block_growth and self.ff \
            else self.alloc.reserved_bytes

    def _arrive(self) -> None:
        """Queue the arrivals up to now (rejecting prompts no policy could serve)."""
        i: cython.longlong
        b: Batch = self.batch
        while self.next_arrival < self.num and b.arrival[self.next_arrival] <= self.t:
            i = self.next_arrival
            if self.owner is not None and self.owner[i] != self.me:
                if self.owner[i] < 0:  # not routed yet: the cluster decides first
                    self.paused = True
                    return
                self.next_arrival += 1  # another engine's
                continue
            self.next_arrival += 1
            if b.prompt[i] >= self.max_len:
                b.reject(i)
                self.tally.too_long += 1  # no policy could serve it
                continue
            if b.target[i] < b.output[i]:
                self.tally.truncated += 1
            self.sched.arrive(i)

    def _finish_request(self, i: cython.longlong) -> None:
        b: Batch = self.batch
        a: Allocation = b.allocs[i]
        v: cython.longlong = b.leave(i)
        # what the request held at the end: with block growth, the blocks for its v tokens (those
        # grown lazily are never taken: release counts them in)
        b.reserved_tokens[i] = max(a.capacity_tokens + b.cached[i], -(-v // b.B) * b.B) if b.block_growth else \
            a.capacity_tokens
        self.growth.unpin(i)
        self.growth.give_back(i, v, True)
        self._done(i)

    def _done(self, i: cython.longlong) -> None:
        """Request i completed now (its memory released)."""
        self.batch.allocs[i] = None
        self.batch.done_ps[i] = self.t
        self.tally.completed += 1
        self.sched.released()

    def _first_token(self, i: cython.longlong) -> None:
        """Request i, in the batch, has its first token (or, recomputed, its next) now: it
        completes, or runs until its completion or overflow (the events its heaps hold)."""
        b: Batch = self.batch
        if b.first_ps[i] < 0:
            b.first_ps[i] = self.t
        if b.gen[i] >= b.target[i]:
            self._finish_request(i)
            return
        b.push_finish(i, b.seq_of[i])
        if self.ff and not b.block_growth:
            b.push_overflow(i, b.seq_of[i], b.allocs[i].capacity_tokens)

    def _step_chunked(self) -> cython.bint:
        """One step of a chunked engine (the module docstring): the running requests' growth,
        then the prompts' chunks (sim/chunked.py); runs the step when it has prompt work (False:
        it has none, and the batch decodes, its growth done)."""
        b: Batch = self.batch
        i: cython.longlong
        dt: cython.longlong
        chunker: Chunker = self.chunker
        preempted: cython.longlong = self.tally.preemptions
        if b.running:
            self._grow()
        n: cython.longlong = len(b.running)
        chunks: list = chunker.plan(n, self.tally.preemptions == preempted)
        if not chunks:
            return False
        dt = chunker.extra_ps(n)  # what the chunks add to n decodes (or, alone, take)
        if n and self.ff:
            self._load_segment(n)
            self._run_segment(n, 1, dt, True)
        elif n:
            self._decode_stepping(dt, chunks)
        else:  # a prefill iteration over the chunks
            dt = self.link.with_moves(dt)
            if self.probe is not None:
                self.probe.step([], [], dt, chunk_pairs(b, chunks))
            self.tally.occupy(self.reserved_bytes(), dt)
            self.t += dt
        self.tally.prefills += 1
        for i in chunker.computed(chunks):
            b.gen[i] += 1
            b.join(i, b.prompt[i] + b.gen[i])
            self._first_token(i)
        return True

    def _prefill(self, admitted: list) -> None:
        """One prefill iteration over the admitted requests: their prompts (and recomputed tokens),
        yielding each its first token."""
        a: Allocation
        i: cython.longlong
        k: cython.longlong
        dt: cython.longlong
        b: Batch = self.batch
        prompt_sum: cython.longlong = 0  # the prefill's cost depends on these two sums and the count only
        prompt_squares: cython.longlong = 0
        ttft: cython.longlong = -1
        for i in admitted:
            k = b.prompt[i] + b.gen[i]
            prompt_sum += k - b.cached[i]  # a cached prefix is not computed; the rest attends to it
            prompt_squares += k * k - b.cached[i] * b.cached[i]
            self.tally.recomputed += b.gen[i]
            b.gen[i] += 1
            if self.tier is not None and i in b.offloaded:
                continue  # its KV goes to the host tier as the prefill writes it
            self.growth.first_token_room(i, k)
            b.join(i, k + 1)
        dt = self.link.with_moves(self.prefill_clock.ps(prompt_sum, prompt_squares, len(admitted)))  # + its host moves
        if self.probe is not None:  # (cached, computed) per prompt; each one's gen counts the token it yields
            self.probe.step([], [], dt, [(b.cached[i], b.prompt[i] + b.gen[i] - 1 - b.cached[i]) for i in admitted])
        started: cython.longlong = self.t
        self.t += dt
        self.tally.occupy(self.reserved_bytes(), dt)
        self.tally.prefills += 1
        for i in admitted:
            if b.first_ps[i] < 0:
                b.start_ps[i] = started
                b.first_ps[i] = self.t
                if self.t - b.arrival[i] > ttft:
                    ttft = self.t - b.arrival[i]
            if self.tier is None or i not in b.offloaded:
                self._first_token(i)
                continue
            del b.offloaded[i]
            if b.gen[i] >= b.target[i]:  # done at its first token while its KV was in the host tier
                self.growth.release_offloaded(i)
                self._done(i)
            else:
                self.sched.parked.append(i)
        if self.tier is not None and ttft >= 0:
            self.tier.latency_feedback(seconds(ttft), None)

    def _decode_fast(self) -> cython.bint:
        """Decode iterations of the fixed batch, summed in closed form up to the next event that
        changes it; a boundary where only contiguous growth is due (nothing completes, no arrival
        or retry for the scheduler) is handled here, as the main loop would, and the decode goes
        on. False: a preemption or a stall there emptied the batch."""
        b: Batch = self.batch
        while True:
            self._decode_segment()
            if b.block_growth or not b.overflow_now() or self.sched.decode_limit() or b.completes_now():
                return True
            self._arrive()
            if self.paused or not self.sched.quiet():
                return True
            if not self._grow():
                return False

    def _grow(self) -> cython.bint:
        """At a decode boundary: observe the batch, then the growth step (sim/growth.py); a
        preemption tells the scheduler. False: the batch is empty now."""
        b: Batch = self.batch
        preempted: cython.longlong = self.tally.preemptions
        if self.tally.observe(self.t, self.alloc, len(b.running)):
            self.tally.sample(self.t, self.reserved_bytes(), len(b.running), len(self.sched.waiting))
        self.t += self.growth.fast() if self.ff else self.growth.stepping()
        if self.tally.preemptions != preempted:
            self.sched.preempted()
        return len(b.running) > 0

    def _decode_segment(self) -> None:
        """k decode iterations of the fixed batch, to the next event, summed in closed form."""
        b: Batch = self.batch
        n: cython.longlong = len(b.running)
        k: cython.longlong = self.sched.decode_limit() or b.next_event()
        j: cython.longlong
        segment: Segment = self.segment
        self._load_segment(n)
        if b.block_growth:
            k = segment.first_over(self.alloc.block_limit(n, n) - b.shared, k)
        if self.next_arrival < self.num:  # routed: any arrival stops it (the router sees every engine there)
            j = self.sched.first_waking(n, self.next_arrival) if self.owner is None else self.next_arrival
            if j >= 0:
                k = segment.iterations_until(b.arrival[j] - self.t, k)
        self._run_segment(n, k, 0, False)

    def _load_segment(self, n: cython.longlong) -> None:
        """The segment describes the running batch at this boundary."""
        b: Batch = self.batch
        runs: cython.longlong[::1] = self.runs
        r: cython.longlong
        i: cython.longlong
        if b.block_growth:
            b.fill_runs(runs)
        else:
            r = self.alloc.kv_runs - len(self.sched.stalled)  # a stalled block is not read
            for i in b.prefilling:  # nor a block whose prompt is being chunked (its chunks are prefill)
                r -= self.alloc.runs_of(b.allocs[i], b.prompt[i] + b.gen[i])
            runs[0] = runs[1] = r
        self.segment.reset(n, b.kv_sum)

    def _run_segment(self, n: cython.longlong, k: cython.longlong, extra: cython.longlong,
                     mixed: cython.bint) -> cython.longlong:
        """The loaded segment's next k iterations run (k = 1 when `mixed`: beside prompt chunks
        that add `extra` ps, and whatever the host link moved for their admissions); returns their
        time."""
        b: Batch = self.batch
        dt: cython.longlong
        runs: cython.longlong[::1] = self.runs
        dt, held = self.segment.advance(k, b.block_growth)
        if mixed:
            dt += extra
            if b.block_growth:
                held += runs[1] * extra  # the one iteration's blocks are held for the chunks too
            dt = self.link.with_moves(dt)
        if self.link.pending_ps:
            stall = self.link.overlap_pending(self.segment.elapsed_ps(1))
            dt += stall
            if b.block_growth:  # the first iteration's blocks are held while the transfer finishes
                held += runs[1] * stall
        if self.tier is not None:
            self.tier.latency_feedback(None, seconds(dt // k))
        if b.block_growth:
            if b.prefilling_blocks + b.shared:
                held += (b.prefilling_blocks + b.shared) * dt
            self.tally.occupancy_byte_ps += held * self.block_bytes  # blocks x ps (may pass 64 bits) x bytes a block
            b.runs_now = runs[k % b.B] + n * (k // b.B)  # = the blocks held during the last iteration
            b.note_peak()
        else:
            self.tally.occupy(self.alloc.reserved_bytes, dt)
        self._advance(n, k, dt)
        return dt

    def _decode_stepping(self, extra: cython.longlong = 0, chunks: list = None) -> cython.longlong:
        """One decode iteration, its step computed request by request (and run on the device by
        the probe, when there is one); beside prompt `chunks` (Chunker.plan's, None: none) that add
        `extra` ps. Returns its time."""
        b: Batch = self.batch
        n: cython.longlong = len(b.running)
        dt: cython.longlong
        kv_now = [b.kv(i) for i in b.running]
        dt = self.coeff.step_ps(kv_now, [self.alloc.runs_of(b.allocs[i], b.kv(i)) for i in b.running])
        if chunks is not None:
            dt = self.link.with_moves(dt + extra)
        if self.link.pending_ps:
            dt += self.link.overlap_pending(dt)
        if self.tier is not None:
            self.tier.latency_feedback(None, seconds(dt))
        if self.probe is not None:
            decode_step(self.probe, b, self.growth.prefix, kv_now, dt, chunks)
        self.tally.occupy(self.alloc.reserved_bytes, dt)
        self._advance(n, 1, dt)
        return dt

    def _advance(self, n: cython.longlong, k: cython.longlong, dt: cython.longlong) -> None:
        self.t += dt
        self.batch.it += k
        self.batch.kv_sum += n * k
        self.tally.decodes += k

    def _complete(self) -> None:
        """Release the requests whose last token the iterations just run produced."""
        i: cython.longlong
        b: Batch = self.batch
        i = b.due(b.finish)
        while i >= 0:
            self._finish_request(i)
            i = b.due(b.finish)
