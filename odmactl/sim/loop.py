"""Event-driven continuous-batching replay of a trace through one allocator policy -> ReplayResult.

The scheduler is vLLM's (v0) in miniature. Arrivals queue FCFS. At an iteration boundary where
something changed (a release, or an arrival into an empty queue), requests are admitted from the head
while the policy can reserve for them and the batch caps allow; the first that does not fit blocks
the rest (head-of-line). Admitted requests share one prefill iteration (decodes pause), which writes
their prompt and yields their first token; then every decode iteration grows each running request by
one token. A request is done when it has its realized output length; completion releases its memory.
Growing past a contiguous block asks the policy to extend: ODMA migrates into the large pool, S3
moves to a larger bucket (copy time charged to the iteration), and a failed extend preempts the
request itself. Paged memory grows a block at a time; when the blocks run out the newest running
requests are preempted (released, queued at the front, recomputed later), and no prefill runs at
that boundary.

Time is integer picoseconds. Between events the batch is fixed, so `Segment` sums the next k
iterations in closed form and the clock jumps to the next completion, overflow, block exhaustion or
(when the queue is empty) the first boundary after the next arrival. With `fast_forward=False` the
same scheduler advances one iteration at a time, computes each step request by request, and extends
every allocation every token: the reference the closed form is tested against. When
fast-forwarding, growth reaches the allocator lazily: a request's length at its overflow
(`catch_up`) and at completion (`release(a, final_tokens)`), paged blocks past the first token
never (those a completed or preempted request would take and return at once are not taken); the
scheduler counts what every request holds, so decisions are those of eager growth, and it hands
the allocator the peak that eager growth reaches (`record_peak`). An
on-device replay (ondevice.py) steps and hands each decode iteration's batch to a `probe`, which
runs and times it on the device; the clock still advances by the modelled step.

The same source runs compiled (setup.py, odmactl/native.py): Cython reads the `cython.longlong`
annotations as 64-bit C integers (Python never evaluates them). That bounds the clock at 2**63 ps
(106 days of simulated time) and admissions at 2**32 (see SEQ_SPAN); an overflow raises
OverflowError instead of wrapping. Sums of bytes x picoseconds stay Python integers. Per-request
state is in array('q') buffers, which both forms index quickly. Results are byte-identical
(tests/test_native.py).
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

import numpy as np

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.allocator import Allocator
from odmactl.allocator.base import Allocation, AllocatorBase
from odmactl.hw.cost import CostModel, KvLayout, to_ps
from odmactl.sim.keyheap import KeyHeap
from odmactl.sim.prefill import PrefillClock
from odmactl.sim.segment import Segment

PS = 10**12
SEQ_SPAN = 1 << 32  # heap keys: iteration * SEQ_SPAN + admission number (admissions stay below 2**32)
OCCUPANCY_FLUSH = 1 << 62  # a 64-bit partial sum of byte x ps terms moves to the Python integer past this


def _int64s(values) -> array:
    """An array('q') copy of a numpy integer array: C-speed indexing when compiled, list-speed otherwise."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return out


def _filled(size: int, value: int) -> array:
    return array("q", [value]) * size


def _doubled(values) -> array:
    """An array('q') twice as long, starting with `values` (an array('q') or, compiled, a view of one)."""
    out = array("q", values)
    out.extend(out)
    return out


def _zeros(size: int) -> array:
    return _filled(size, 0)


def _seconds(t_ps) -> float:
    """Picoseconds as seconds, Python's exactly rounded int / int (also when t_ps comes from a C integer)."""
    return t_ps / PS


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, as numpy arrays (row i is request i). `arrival_ps` is
    nondecreasing; `output_tokens` >= 1; `predicted_output_tokens` and `uncertainty` are None when no
    predictor runs (then policies reserve without a prediction)."""

    request_ids: list[str]
    arrival_ps: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_output_tokens: np.ndarray | None = None
    uncertainty: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.request_ids)

    def kv_tokens(self, max_len: int) -> np.ndarray:
        """Each request's realized KV tokens (prompt + output), capped at max_len."""
        return np.minimum(self.prompt_tokens.astype(np.int64) + self.output_tokens.astype(np.int64), max_len)

    def take(self, start: int, stop: int) -> Workload:
        """Requests start..stop-1, arrival times unchanged (a replay starts at its first arrival)."""
        def cut(a):
            return None if a is None else a[start:stop]

        return Workload(self.request_ids[start:stop], self.arrival_ps[start:stop], self.prompt_tokens[start:stop],
                        self.output_tokens[start:stop], cut(self.predicted_output_tokens), cut(self.uncertainty))


@dataclass(frozen=True)
class SchedulerSettings:
    max_num_seqs: int = 256
    max_prefill_tokens: int | None = None  # None: max_model_len
    fast_forward: bool = True
    series_points: int = 512


@dataclass
class ReplayResult:
    """What one replay measured: `metrics` (names of DESIGN.md), per-request arrays, time series."""

    policy: str
    metrics: dict[str, float | int]
    series: dict[str, list]
    allocator: dict[str, object]
    ttft_s: np.ndarray = field(repr=False)
    tpot_s: np.ndarray = field(repr=False)


class _Series:
    """Samples at event boundaries, at most 2 * points: when full, every other sample is dropped and
    the spacing doubles (deterministic, bounded memory whatever the trace length)."""

    def __init__(self, points: int) -> None:
        self.points = max(points, 2)
        self.gap_ps = 0
        self.next_ps = 0
        self.rows: list[tuple[int, int, int, int]] = []

    def add(self, t_ps: int, reserved_bytes: int, batch: int, queue: int) -> int:
        """Sample (unless before `next_ps`); returns the next `next_ps`."""
        if t_ps < self.next_ps:
            return self.next_ps
        self.rows.append((t_ps, reserved_bytes, batch, queue))
        if len(self.rows) >= 2 * self.points:
            self.rows = self.rows[::2]
            self.gap_ps = max(2 * self.gap_ps, (t_ps - self.rows[0][0]) // self.points)
        self.next_ps = t_ps + self.gap_ps
        return self.next_ps


class Replay:
    """One replay of `workload` through `allocator`; `run()` returns the ReplayResult.
    `max_model_len` caps every request's KV tokens: longer outputs are truncated (counted), prompts
    that leave no room for one output token are rejected (counted)."""

    def __init__(self, workload: Workload, allocator: Allocator, cost: CostModel, max_model_len: int,
                 settings: SchedulerSettings = SchedulerSettings(), progress=None, probe=None) -> None:
        if probe is not None and settings.fast_forward:
            raise ValueError("an on-device probe runs every decode iteration: replay with fast_forward=False")
        self.w = workload
        self.alloc = allocator
        self.settings = settings
        self.max_len = max_model_len
        self.paged = allocator.name == "paged"
        self.block = allocator.block_size_tokens if self.paged else None
        self.layout = KvLayout.paged(self.block) if self.paged else KvLayout.contiguous()
        self.coeff = cost.step_coefficients(self.layout)
        self.cost = cost
        self.progress = progress
        self.probe = probe  # ondevice.DecodeProbe: runs and times each decode iteration on the device

    # ------------------------------------------------------------------------------------ run

    def run(self) -> ReplayResult:
        w = self.w
        alloc: AllocatorBase = self.alloc  # compiled: its operations are C calls (replay.pxd)
        paged: cython.bint = self.paged
        B: cython.longlong = self.block if self.paged else 1
        ff: cython.bint = self.settings.fast_forward
        odma: cython.bint = alloc.name == "odma"
        num: cython.longlong = w.size
        prompt_np = w.prompt_tokens.astype(np.int64)
        target_np = np.minimum(w.output_tokens, np.maximum(self.max_len - w.prompt_tokens, 0)).astype(np.int64)
        # per request, as int64 arrays (typed buffers when compiled, array('q') indexing otherwise)
        prompt: cython.longlong[:] = _int64s(prompt_np)
        target: cython.longlong[:] = _int64s(target_np)
        output: cython.longlong[:] = _int64s(w.output_tokens)
        arrival: cython.longlong[:] = _int64s(w.arrival_ps)
        pred = None if w.predicted_output_tokens is None else np.maximum(w.predicted_output_tokens, 1.0).tolist()
        unc = None if w.uncertainty is None else w.uncertainty.tolist()
        ids = w.request_ids
        max_len: cython.longlong = self.max_len
        max_seqs: cython.longlong = self.settings.max_num_seqs
        max_prefill: cython.longlong = self.settings.max_prefill_tokens or self.max_len
        num_blocks: cython.longlong = alloc.num_blocks if paged else 0
        block_bytes = alloc.block_bytes if paged else 0
        coeff, cost, probe = self.coeff, self.cost, self.probe
        segment: Segment = Segment(coeff)  # the batch between two events, reset at each
        prefill_clock: PrefillClock = PrefillClock(cost.prefill)
        runs: cython.longlong[:] = segment.runs  # its run counts at offsets 0..B, written at each event

        gen: cython.longlong[:] = _zeros(num)       # tokens generated so far (as of the last boundary it ran at)
        base: cython.longlong[:] = _zeros(num)      # while running: KV tokens at decode iteration I are base + I
        seq_of: cython.longlong[:] = _filled(num, -1)  # admission number while running, -1 otherwise
        first_ps: cython.longlong[:] = _filled(num, -1)
        done_ps: cython.longlong[:] = _filled(num, -1)
        reserved_tokens: cython.longlong[:] = _zeros(num)
        allocs: list = [None] * num
        # state
        t: cython.longlong = 0
        it: cython.longlong = 0     # decode iterations so far
        queue: deque[int] = deque()
        running: dict[int, int] = {}  # request -> admission number, in admission order
        # pending completions and block overflows, as heaps of iteration * span + admission number
        # (tuples' order, without the tuples); an entry is stale once its request left that admission
        finish: KeyHeap = KeyHeap()
        overflow: KeyHeap = KeyHeap()
        request_of_seq: cython.longlong[:] = _zeros(num + 1)  # admission number -> request; doubles when full
        span: cython.longlong = SEQ_SPAN
        kv_sum: cython.longlong = 0  # sum of KV tokens of running requests at iteration `it`
        runs_now: cython.longlong = 0  # paged: blocks the running requests need at iteration `it`
        peak_blocks: cython.longlong = 0  # paged, fast-forwarding: the most blocks eager growth holds
        phase: cython.longlong[:] = _zeros(B)  # paged: running requests by base mod B
        next_arrival: cython.longlong = 0
        next_seq: cython.longlong = 0
        dirty: cython.bint = False
        preemptions: cython.longlong = 0
        rejections: cython.longlong = 0
        too_long: cython.longlong = 0
        truncated: cython.longlong = 0
        recomputed: cython.longlong = 0
        migrations: cython.longlong = 0
        peak: cython.longlong = 0
        prefills: cython.longlong = 0
        decodes: cython.longlong = 0
        # byte x ps sums outgrow 64 bits: Python integers
        migrated_bytes = 0
        occupancy_byte_ps = 0
        occupancy_acc: cython.longlong = 0  # part of occupancy_byte_ps not yet added to it (below 2**63)
        flush: cython.longlong = OCCUPANCY_FLUSH
        reserved_now: cython.longlong
        migration_ps = 0
        series = _Series(self.settings.series_points)
        series_next_ps: cython.longlong = 0  # the series takes no sample before this time
        boundaries: list[tuple[float, list[int]]] = []
        updates_seen: cython.longlong = -1
        completed: cython.longlong = 0
        first_arrival_ps: cython.longlong = arrival[0] if num else 0
        i: cython.longlong
        a: Allocation
        n: cython.longlong
        k: cython.longlong
        v: cython.longlong
        key: cython.longlong
        seq: cython.longlong
        dt: cython.longlong
        need: cython.longlong
        rho: cython.longlong

        def reserved_bytes():
            return runs_now * block_bytes if paged and ff else alloc.reserved_bytes

        def leave(i: cython.longlong) -> None:
            nonlocal kv_sum, runs_now
            v: cython.longlong = base[i] + it
            kv_sum -= v
            if paged:
                runs_now -= -(-v // B)
                phase[base[i] % B] -= 1
            del running[i]
            seq_of[i] = -1

        def catch_up(i: cython.longlong) -> cython.longlong:
            """Tell the allocator request i's KV length now (growth inside a contiguous block reaches
            it lazily when fast-forwarding); returns that length."""
            a: Allocation
            v: cython.longlong = base[i] + it
            a = allocs[i]
            if a.used_tokens != v:
                alloc.extend(a, v)
            return v

        def finish_request(i: cython.longlong) -> None:
            nonlocal completed, dirty
            a: Allocation
            v: cython.longlong = base[i] + it
            a = allocs[i]
            # what the request held at the end: paged, the blocks for its v tokens (those grown
            # lazily are never taken: release counts them in)
            reserved_tokens[i] = max(a.capacity_tokens, -(-v // B) * B) if paged else a.capacity_tokens
            leave(i)
            alloc.release(a, v)
            allocs[i] = None
            done_ps[i] = t
            completed += 1
            dirty = True

        def preempt(i: cython.longlong) -> None:
            nonlocal preemptions
            gen[i] = base[i] + it - prompt[i]
            leave(i)
            alloc.release(allocs[i])
            allocs[i] = None
            queue.appendleft(i)
            preemptions += 1

        def push_events(i: cython.longlong, seq: cython.longlong) -> None:
            cap: cython.longlong
            finish.push((prompt[i] + target[i] - base[i]) * span + seq)
            if ff and not paged:
                cap = allocs[i].capacity_tokens
                if cap < prompt[i] + target[i]:
                    overflow.push((cap - base[i]) * span + seq)

        def admit() -> list[int]:
            """Admit from the head while it fits; returns the admitted (not yet prefilled)."""
            a: Allocation
            i: cython.longlong
            g: cython.longlong
            kv: cython.longlong
            tokens: cython.longlong = 0
            free_blocks: cython.longlong
            admitted: list[int] = []
            # paged: blocks free before this round (the allocator's count lags when fast-forwarding)
            free_blocks = (num_blocks - runs_now if ff else alloc.free_blocks) if paged else 0
            while queue and len(running) + len(admitted) < max_seqs:
                i = queue[0]
                g = gen[i]
                kv = prompt[i] + g
                if admitted and tokens + kv > max_prefill:
                    break
                if paged:
                    if -(-(kv + 1) // B) > free_blocks:
                        if not running and not admitted:
                            reject(queue.popleft())
                            continue
                        break
                    a = alloc.reserve(ids[i], kv)
                    assert a is not None
                    free_blocks -= -(-(kv + 1) // B)
                else:
                    p_out = None if pred is None else max(pred[i] - g, 1.0)
                    a = alloc.reserve(ids[i], kv, p_out, None if unc is None else unc[i])
                    if a is None:
                        if not running and not admitted:
                            reject(queue.popleft())
                            continue
                        break
                queue.popleft()
                allocs[i] = a
                admitted.append(i)
                tokens += kv
            return admitted

        def reject(i: cython.longlong) -> None:
            nonlocal rejections
            rejections += 1
            done_ps[i] = -2

        def prefill(admitted: list[int]) -> None:
            nonlocal t, kv_sum, runs_now, peak_blocks, next_seq, recomputed, prefills, occupancy_byte_ps, request_of_seq
            a: Allocation
            i: cython.longlong
            k: cython.longlong
            seq: cython.longlong
            dt: cython.longlong
            prompt_sum: cython.longlong = 0  # the prefill's cost depends on these two sums only
            prompt_squares: cython.longlong = 0
            for i in admitted:
                k = prompt[i] + gen[i]
                prompt_sum += k
                prompt_squares += k * k
                recomputed += gen[i]
                a = allocs[i]
                # the first token needs room: the reservation was for the prompt. Paged takes the
                # block now; a contiguous block that already holds it is told lazily (catch_up at an
                # overflow, release(a, final_tokens) at completion)
                if (paged or not ff or k + 1 > a.capacity_tokens) and not alloc.extend(a, k + 1):
                    raise AssertionError(f"admission of {ids[i]} left no room for its first token")
                gen[i] += 1
                seq = next_seq
                next_seq += 1
                assert seq < span, "more than 2**32 admissions"
                if seq == len(request_of_seq):  # re-admissions after preemptions outnumber the requests
                    request_of_seq = _doubled(request_of_seq)
                request_of_seq[seq] = i
                running[i] = seq
                seq_of[i] = seq
                base[i] = k + 1 - it
                kv_sum += k + 1
                if paged:
                    runs_now += -(-(k + 1) // B)
                    phase[base[i] % B] += 1
            if runs_now > peak_blocks:
                peak_blocks = runs_now
            dt = prefill_clock.ps(prompt_sum, prompt_squares)
            t += dt
            occupancy_byte_ps += reserved_bytes() * dt
            prefills += 1
            for i in admitted:
                if first_ps[i] < 0:
                    first_ps[i] = t
                if gen[i] >= target[i]:
                    finish_request(i)
                else:
                    push_events(i, seq_of[i])

        def grow_contiguous(i: cython.longlong) -> None:
            """Request i needs one more token than its block holds: extend (migrate) or preempt it."""
            nonlocal t, migrations, migrated_bytes, migration_ps, occupancy_byte_ps
            a: Allocation
            dt: cython.longlong
            v: cython.longlong
            a = allocs[i]
            v = catch_up(i)
            before = alloc.migrated_bytes
            if alloc.extend(a, v + 1):
                copied = alloc.migrated_bytes - before
                migrations += 1
                migrated_bytes += copied
                dt = to_ps(cost.migration_s(copied))
                t += dt
                migration_ps += dt
                occupancy_byte_ps += reserved_bytes() * dt
                if a.capacity_tokens < prompt[i] + target[i]:
                    overflow.push((a.capacity_tokens - base[i]) * span + seq_of[i])
            else:
                preempt(i)

        def preempt_newest_until_fits(need_at: cython.longlong) -> None:
            """Paged: preempt the newest running requests until the next iteration's blocks fit."""
            newest: cython.longlong
            v: cython.longlong
            while running and need_at > num_blocks:
                newest = next(reversed(running))
                v = base[newest] + it
                need_at -= -(-(v + 1) // B)
                preempt(newest)

        total_steps: cython.longlong = 0
        while True:
            # arrivals up to now
            while next_arrival < num and arrival[next_arrival] <= t:
                i = next_arrival
                next_arrival += 1
                if prompt[i] >= max_len:
                    reject(i)
                    too_long += 1  # no policy could serve it
                    continue
                if target[i] < output[i]:
                    truncated += 1
                if not queue:
                    dirty = True
                queue.append(i)
            if dirty and queue:
                dirty = False
                admitted = admit()
                if admitted:
                    prefill(admitted)
                    continue
            if not running:
                if queue:
                    dirty = True  # an empty system: the head is retried (and rejected if it can never fit)
                    continue
                if next_arrival < num:
                    t = max(t, arrival[next_arrival])
                    continue
                break
            n = len(running)
            if n > peak:
                peak = n
            if odma and updates_seen != alloc.boundary_updates:
                updates_seen = alloc.boundary_updates
                boundaries.append((_seconds(t), list(alloc.boundaries_tokens)))
            if t >= series_next_ps:
                series_next_ps = series.add(t, reserved_bytes(), n, len(queue))

            # ---- growth before the next iteration: blocks that overflow, blocks that run out
            preempted = preemptions
            if ff:
                while overflow.size:
                    key = overflow.top()
                    if key // span != it:
                        break
                    overflow.pop()
                    seq = key % span
                    i = request_of_seq[seq]
                    if seq_of[i] == seq:
                        grow_contiguous(i)
                if paged:
                    need = runs_now + phase[(-it) % B]
                    if need > num_blocks:
                        peak_blocks = num_blocks  # eager growth takes the last free block, then fails
                        preempt_newest_until_fits(need)
            else:
                for i in list(running):
                    if i not in running:
                        continue
                    a = allocs[i]
                    v = base[i] + it
                    if not paged:
                        if v + 1 > a.capacity_tokens:
                            grow_contiguous(i)
                        else:
                            alloc.extend(a, v + 1)
                        continue
                    while i in running and not alloc.extend(a, v + 1):
                        preempt(next(reversed(running)))
            if preemptions != preempted:
                dirty = False
                if not running:
                    continue
            n = len(running)

            # ---- decode: k iterations of a fixed batch
            if ff:
                while True:  # drop stale entries: their request left that admission
                    key = finish.top()
                    seq = key % span
                    if seq_of[request_of_seq[seq]] == seq:
                        break
                    finish.pop()
                k = key // span - it
                while overflow.size:
                    key = overflow.top()
                    seq = key % span
                    if seq_of[request_of_seq[seq]] == seq:
                        if key // span - it < k:
                            k = key // span - it
                        break
                    overflow.pop()
                if paged:
                    runs[0] = runs_now
                    for rho in range(B):
                        runs[rho + 1] = runs[rho] + phase[(-it - rho) % B]
                else:
                    runs[0] = runs[1] = n
                segment.reset(n, kv_sum)
                if paged:
                    k = segment.first_over(num_blocks, k)
                if not queue and next_arrival < num and n < max_seqs:
                    k = segment.iterations_until(arrival[next_arrival] - t, k)
                dt, held = segment.advance(k, paged)
                if paged:
                    occupancy_byte_ps += held * block_bytes
                    runs_now = runs[k % B] + n * (k // B)  # = the blocks held during the last iteration
                    if runs_now > peak_blocks:
                        peak_blocks = runs_now
                else:
                    # reserved bytes x ps, summed in 64 bits and handed to the Python sum near 2**62
                    reserved_now = alloc.reserved_bytes
                    if dt == 0 or reserved_now <= flush // dt:
                        occupancy_acc += reserved_now * dt
                        if occupancy_acc > flush:
                            occupancy_byte_ps += occupancy_acc
                            occupancy_acc = 0
                    else:
                        occupancy_byte_ps += int(reserved_now) * dt
            else:
                k = 1
                kv_now = [base[i] + it for i in running]
                dt = coeff.step_ps(kv_now)
                if probe is not None:
                    probe.step([allocs[i] for i in running], kv_now, dt)
                occupancy_byte_ps += alloc.reserved_bytes * dt
            t += dt
            it += k
            kv_sum += n * k
            decodes += k
            while finish.size:
                key = finish.top()
                if key // span > it:
                    break
                finish.pop()
                seq = key % span
                i = request_of_seq[seq]
                if seq_of[i] == seq:
                    assert key // span == it
                    finish_request(i)
            total_steps += 1
            if self.progress is not None and total_steps % 4096 == 0:
                self.progress("replay", completed, num)

        if paged and ff:
            # paged growth reached the allocator lazily (at completion and preemption); the peak is eager growth's
            alloc.record_peak(peak_blocks * block_bytes)
        occupancy_byte_ps += occupancy_acc
        c = {"preemptions": preemptions, "rejections": rejections, "rejected_prompt_too_long": too_long,
             "truncated": truncated, "recomputed_tokens": recomputed, "migrations": migrations,
             "migrated_bytes": migrated_bytes, "peak_concurrency": peak, "prefill_iterations": prefills,
             "decode_iterations": decodes, "occupancy_byte_ps": occupancy_byte_ps, "migration_ps": migration_ps}
        return self._result(c, series, boundaries, np.asarray(arrival), np.asarray(first_ps), np.asarray(done_ps),
                            target_np, prompt_np, np.asarray(reserved_tokens), first_arrival_ps)

    def _result(self, c: dict, series: _Series, boundaries: list, arrival: np.ndarray, first_ps: np.ndarray,
                done_ps: np.ndarray, target: np.ndarray, prompt: np.ndarray, reserved_tokens: np.ndarray,
                first_arrival_ps: int) -> ReplayResult:
        """The metrics from the per-request int64 arrays (run() converts its buffers once) and the counters."""
        alloc = self.alloc
        assert not alloc.live_allocations(), "allocations outlived the replay"
        alloc.check_invariants()
        ok = done_ps >= 0
        kv_final = (prompt + target)[ok]
        kv_reserved = reserved_tokens[ok]
        ttft = (first_ps[ok] - arrival[ok]) / PS
        multi = ok & (target > 1)
        tpot = (done_ps[multi] - first_ps[multi]) / (target[multi] - 1) / PS
        last_done = int(done_ps[ok].max()) if ok.any() else first_arrival_ps
        span_ps = max(last_done - first_arrival_ps, 1)
        generated = int(target[ok].sum())
        num = self.w.size

        def p50_p99(values: np.ndarray) -> tuple[float, float]:
            # one selection for both levels: the same values as two np.percentile calls
            return tuple(float(v) for v in np.percentile(values, [50, 99])) if values.size else (0.0, 0.0)

        ttft_p50, ttft_p99 = p50_p99(ttft)
        tpot_p50, tpot_p99 = p50_p99(tpot)

        metrics: dict[str, float | int] = {
            "requests": num,
            "completed": int(ok.sum()),
            "rejections": c["rejections"],
            "rejected_prompt_too_long": c["rejected_prompt_too_long"],
            "truncated": c["truncated"],
            "generated_tokens": generated,
            "kv_utilization": float(kv_final.sum() / kv_reserved.sum()) if kv_reserved.size else 0.0,
            "pool_occupancy": c["occupancy_byte_ps"] / (alloc.pool_bytes * span_ps),
            "tps": generated / (span_ps / PS),
            "ttft_p50": ttft_p50, "ttft_p99": ttft_p99,
            "tpot_p50": tpot_p50, "tpot_p99": tpot_p99,
            "migrations": c["migrations"],
            "migration_rate": c["migrations"] / num if num else 0.0,
            # every request that outgrew its memory: moved (migration) or, with no room to move to,
            # preempted; plan's migration-rate limit and check's max_overflow_rate apply to this
            "overflow_rate": (c["migrations"] + c["preemptions"]) / num if num else 0.0,
            "migrated_bytes": c["migrated_bytes"],
            "migration_time_s": c["migration_ps"] / PS,
            "preemptions": c["preemptions"],
            "recomputed_tokens": c["recomputed_tokens"],
            "peak_concurrency": c["peak_concurrency"],
            "mean_batch": generated / max(c["decode_iterations"] + c["prefill_iterations"], 1),
            "decode_iterations": c["decode_iterations"],
            "prefill_iterations": c["prefill_iterations"],
            "makespan_s": span_ps / PS,
        }
        rows = series.rows
        series_out = {
            "time_s": [r[0] / PS for r in rows],
            "pool_occupancy": [r[1] / alloc.pool_bytes for r in rows],
            "batch_size": [r[2] for r in rows],
            "queue_length": [r[3] for r in rows],
            "bucket_boundaries": [{"time_s": ts, "boundaries_tokens": b} for ts, b in boundaries],
        }
        return ReplayResult(alloc.name, metrics, series_out, alloc.stats().to_dict(), ttft, tpot)
