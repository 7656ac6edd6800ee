"""Event-driven continuous-batching replay of a trace through one allocator policy -> ReplayResult.

The scheduler is vLLM's (v0) in miniature. Arrivals queue FCFS. At an iteration boundary where
something changed (a release, or an arrival into an empty queue), requests are admitted from the head
while the policy can reserve for them and the batch caps allow; the first that does not fit blocks
the rest (head-of-line). Admitted requests share one prefill iteration (decodes pause), which writes
their prompt and yields their first token; then every decode iteration grows each running request by
one token. A request is done when it has its realized output length; completion releases its memory.

The loop asks the policy how it grows (the Allocator protocol, allocator/base.py), never its name:
- a policy with `block_size_tokens` None gives each request one contiguous block; growing past it
  asks the policy to `extend` (ODMA migrates into the large pool, S3 with s3_overflow "migrate"
  moves to a larger bucket; the copy time is charged to the iteration), and a failed extend
  preempts the request itself (S3's supervisor, s3_overflow "preempt"): no prefill runs at that
  boundary, and admission is retried after one decode iteration, as vLLM schedules at every step;
- a policy with a block size grows a request a block at a time from its `num_blocks` blocks; when
  they run out the newest running requests are preempted (released, queued at the front,
  recomputed later), and no prefill runs at that boundary (vLLM's recompute preemption);
- `boundaries_tokens` / `boundary_updates`, when the policy has bucket boundaries that change, are
  recorded in the time series.

Time is integer picoseconds. Between events the batch is fixed, so `Segment` sums the next k
iterations in closed form and the clock jumps to the next completion, overflow, block exhaustion or
(when the queue is empty) the first boundary after the next arrival. With `fast_forward=False` the
same scheduler advances one iteration at a time, computes each step request by request, and extends
every allocation every token: the reference the closed form is tested against. When
fast-forwarding, growth reaches the allocator lazily: a request's length at its overflow
(`_catch_up`) and at completion (`release(a, final_tokens)`), blocks past the first token never
(those a completed or preempted request would take and return at once are not taken); the loop
counts what every request holds, so decisions are those of eager growth, and it hands the
allocator the peak that eager growth reaches (`record_peak`). An on-device replay
(device/ondevice.py) steps and hands each decode iteration's batch to a `probe`, which runs and
times it on the device; the clock still advances by the modelled step.

The same source runs compiled (setup.py, core/native.py): loop.pxd makes `Replay` an extension type
whose state below is C fields and whose helpers are C methods; Cython reads the `cython.longlong`
annotations of locals as 64-bit C integers (Python never evaluates them). That bounds the clock at
2**63 ps (106 days of simulated time) and admissions at 2**32 (see SEQ_SPAN); an overflow raises
OverflowError instead of wrapping. Sums of bytes x picoseconds stay Python integers. Per-request
state is in array('q') buffers, which both forms index quickly. Results are byte-identical
(tests/test_native.py).
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.allocator.base import Allocation, AllocatorBase
from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_NUM_SEQS, MAX_TOKENS, whole_number_problem
from odmactl.hw.cost import KvLayout, to_ps
from odmactl.sim.keyheap import KeyHeap
from odmactl.sim.metrics import ReplayResult, Timeline, replay_result
from odmactl.sim.prefill import PrefillClock
from odmactl.sim.segment import Segment
from odmactl.sim.series import Series
from odmactl.sim.workload import PS, Workload

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


def _seconds(t_ps) -> float:
    """Picoseconds as seconds, Python's exactly rounded int / int (also when t_ps comes from a C integer)."""
    return t_ps / PS


VLLM_MIN_BATCHED_TOKENS = 2048  # vLLM's default budget is max(max_model_len, this) without chunked prefill


@dataclass(frozen=True)
class SchedulerSettings:
    """The batch caps, in vLLM's terms, and how time advances.

    Admission follows vLLM 0.6's default scheduler (vllm/core/scheduler.py, `_schedule_default` and
    `_schedule_prefills`; Cambricon-vLLM 0.6.2 is built on it): at every iteration, while requests
    wait, prefills are scheduled from the head of the queue in arrival order as long as KV space,
    `max_num_seqs` and the iteration's token budget `max_num_batched_tokens` allow; an iteration
    that schedules prefills runs only them, otherwise it decodes the batch. The budget defaults as
    vLLM's does without chunked prefill (vllm/config.py, SchedulerConfig): max(max_model_len, 2048).

    `max_new_tokens` is vLLM's per-request `max_tokens` (SamplingParams): a request stops after
    that many output tokens (counted as truncated, like one that reaches max_model_len); None: no cap.

    Invariant (checked): `max_num_seqs`, `max_num_batched_tokens` and `max_new_tokens` (None: the
    defaults above) are whole numbers >= 1, so every iteration admits or runs at least one request;
    `series_points` >= 2.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: max(max_model_len, VLLM_MIN_BATCHED_TOKENS)
    max_new_tokens: int | None = None
    fast_forward: bool = True
    series_points: int = 512

    def batched_tokens(self, max_model_len: int) -> int:
        """The prefill token budget of one iteration."""
        return self.max_num_batched_tokens or max(max_model_len, VLLM_MIN_BATCHED_TOKENS)

    def __post_init__(self) -> None:
        for key, low, high in (("max_num_seqs", 1, MAX_NUM_SEQS), ("max_num_batched_tokens", 1, MAX_TOKENS),
                               ("max_new_tokens", 1, MAX_TOKENS), ("series_points", 2, 1 << 20)):
            value = getattr(self, key)
            problem = None if value is None else whole_number_problem(value, low, high)
            if problem is not None:
                raise ConfigError(problem, key=key)


class Replay:
    """One replay of `workload` through `allocator`; `run()` returns the ReplayResult.
    `max_model_len` caps every request's KV tokens and the settings' `max_new_tokens` its output:
    longer outputs are truncated (counted), prompts that leave no room for one output token are
    rejected (counted).

    State during `run()`, per request i (int64 buffers): `gen[i]` tokens generated as of the last
    boundary it ran at; while running, its KV tokens at decode iteration I are `base[i] + I` and
    `seq_of[i]` is its admission number (-1 otherwise); `start_ps[i]` / `first_ps[i]` / `done_ps[i]`
    the start of its first prefill, its first token and its completion (-1 until then, -2
    rejected); `reserved_tokens[i]` what it held at the end.
    `running` maps request -> admission number in admission order; `finish` and `overflow` are
    heaps of iteration * SEQ_SPAN + admission number (an entry is stale once its request left that
    admission). `kv_sum` is the running requests' KV tokens at iteration `it`; for block growth
    `runs_now` the blocks they need and `phase[r]` how many have base = r mod the block size.
    """

    __slots__ = (
        "w", "alloc", "settings", "max_len", "block", "paged", "coeff", "cost", "progress", "probe",
        # per run
        "ff", "track_boundaries", "retry", "B", "num", "max_seqs", "max_prefill", "num_blocks", "block_bytes",
        "prompt", "target", "output", "arrival", "gen", "base", "seq_of", "start_ps", "first_ps", "done_ps",
        "reserved_tokens", "request_of_seq", "phase", "runs", "pred", "unc", "ids", "allocs", "queue",
        "running", "finish", "overflow", "segment", "prefill_clock", "series", "boundaries",
        "t", "it", "span", "kv_sum", "runs_now", "peak_blocks", "next_arrival", "next_seq", "dirty",
        "preemptions", "rejections", "too_long", "truncated", "recomputed", "migrations", "peak", "prefills",
        "decodes", "completed", "migrated_bytes", "migration_ps", "occupancy_byte_ps", "occupancy_acc",
        "series_next_ps", "updates_seen",
        # the protocol's optional parts (allocator/base.py): page ranges, the host link, borrowed
        # activation memory, adapters, the host buffer
        "runs_tracked", "borrows", "adapters", "serves_adapters", "offload", "slo_aware", "parked", "host_seen",
        "host_link_bytes", "link_ps", "link_bottleneck_ps", "offloaded",
        "kv_pool_bytes", "pending_link_ps",
    )

    def __init__(self, workload: Workload, allocator: AllocatorBase, cost, max_model_len: int,
                 settings: SchedulerSettings = SchedulerSettings(), progress=None, probe=None) -> None:
        if probe is not None and settings.fast_forward:
            raise ValueError("an on-device probe runs every decode iteration: replay with fast_forward=False")
        self.w = workload
        self.alloc = allocator
        self.settings = settings
        self.max_len = max_model_len
        self.block = allocator.block_size_tokens  # None: one contiguous block per request
        self.paged = self.block is not None
        self.coeff = cost.step_coefficients(KvLayout(allocator.read_block_tokens), max_batch=settings.max_num_seqs)
        self.cost = cost
        self.progress = progress
        self.probe = probe  # device.ondevice.DecodeProbe: runs and times each decode iteration on the device

    # ------------------------------------------------------------------------------------ run

    def run(self) -> ReplayResult:
        n: cython.longlong
        total_steps: cython.longlong = 0
        preempted: cython.longlong
        prompt_np, target_np = self._start()
        while True:
            self._arrive()
            if self.parked:
                self._fetch()
            if self.dirty and self.queue:
                self.dirty = False
                admitted = self._admit()
                if admitted:
                    self._prefill(admitted)
                    continue
            if not self.running:
                assert not self.parked, "an offloaded request could not be fetched into an empty pool"
                if self.queue:
                    self.dirty = True  # an empty system: the head is retried (and rejected if it can never fit)
                    continue
                if self.next_arrival < self.num:
                    self.t = max(self.t, self.arrival[self.next_arrival])
                    continue
                break
            n = len(self.running)
            if n > self.peak:
                self.peak = n
            if self.track_boundaries and self.updates_seen != self.alloc.boundary_updates:
                self.updates_seen = self.alloc.boundary_updates
                self.boundaries.append((_seconds(self.t), list(self.alloc.boundaries_tokens)))
            if self.t >= self.series_next_ps:
                self.series_next_ps = self.series.add(self.t, self._reserved_bytes(), n, len(self.queue))
            # growth before the next iteration: blocks that overflow, blocks that run out
            preempted = self.preemptions
            if self.ff:
                self._grow_fast()
            else:
                self._grow_stepping()
            if self.preemptions != preempted:
                self.dirty = False
                if not self.running:
                    continue
                # a contiguous policy's failed extend freed a whole block: admission is retried
                # after one iteration (block growth waits for a release: its blocks ran out, unless
                # offloaded requests wait, which vLLM swaps in at the next step if they fit)
                self.retry = not self.paged or len(self.parked) > 0
            if self.ff:
                self._decode_fast()
            else:
                self._decode_stepping()
            self._complete()
            if self.retry:
                self.retry = False
                self.dirty = True
            total_steps += 1
            if self.progress is not None and total_steps % 4096 == 0:
                self.progress("replay", self.completed, self.num)
        return self._finish(prompt_np, target_np)

    def _start(self) -> tuple[np.ndarray, np.ndarray]:
        """Fresh per-run state (see the class docstring); returns the prompt and target arrays."""
        w, alloc, settings = self.w, self.alloc, self.settings
        self.ff = settings.fast_forward
        self.track_boundaries = len(alloc.boundaries_tokens) > 0
        self.B = self.block if self.paged else 1
        self.num = w.size
        prompt_np = w.prompt_tokens.astype(np.int64)
        target_np = np.minimum(w.output_tokens, np.maximum(self.max_len - w.prompt_tokens, 0)).astype(np.int64)
        if settings.max_new_tokens is not None:
            target_np = np.minimum(target_np, settings.max_new_tokens)
        self.prompt = _int64s(prompt_np)
        self.target = _int64s(target_np)
        self.output = _int64s(w.output_tokens)
        self.arrival = _int64s(w.arrival_ps)
        self.pred = None if w.predicted_output_tokens is None else np.maximum(w.predicted_output_tokens, 1.0).tolist()
        self.unc = None if w.uncertainty is None else w.uncertainty.tolist()
        self.ids = w.request_ids
        self.max_seqs = settings.max_num_seqs
        self.max_prefill = settings.batched_tokens(self.max_len)
        self.num_blocks = alloc.num_blocks if self.paged else 0
        self.block_bytes = alloc.block_bytes if self.paged else 0
        self.segment = Segment(self.coeff, self.block)  # the batch between two events, reset at each
        self.prefill_clock = PrefillClock(self.cost.prefill)
        self.runs = self.segment.runs  # its run counts at offsets 0..B, written at each event
        num = self.num
        self.gen = _filled(num, 0)
        self.base = _filled(num, 0)
        self.seq_of = _filled(num, -1)
        self.start_ps = _filled(num, -1)
        self.first_ps = _filled(num, -1)
        self.done_ps = _filled(num, -1)
        self.reserved_tokens = _filled(num, 0)
        self.allocs = [None] * num
        self.t = self.it = 0
        self.queue = deque()
        self.running = {}
        self.finish = KeyHeap()
        self.overflow = KeyHeap()
        self.request_of_seq = _filled(num + 1, 0)  # admission number -> request; doubles when full
        self.span = SEQ_SPAN
        self.kv_sum = self.runs_now = self.peak_blocks = 0
        self.phase = _filled(self.B, 0)
        self.next_arrival = self.next_seq = 0
        self.dirty = self.retry = False
        self.preemptions = self.rejections = self.too_long = self.truncated = self.recomputed = 0
        self.migrations = self.peak = self.prefills = self.decodes = self.completed = 0
        # byte x ps sums outgrow 64 bits: Python integers (occupancy_acc is the part not yet added)
        self.migrated_bytes = 0
        self.occupancy_byte_ps = 0
        self.occupancy_acc = 0
        self.migration_ps = 0
        self.series = Series(settings.series_points)
        self.series_next_ps = 0  # the series takes no sample before this time
        self.boundaries = []
        self.updates_seen = -1
        self.runs_tracked = bool(alloc.runs_tracked)
        self.borrows = bool(alloc.borrows_activation) and self.paged
        self.serves_adapters = bool(alloc.serves_adapters) and w.adapters is not None
        self.adapters = _int64s(w.adapters) if self.serves_adapters else None
        self.offload = alloc.host_buffer_bytes > 0 and self.paged
        self.slo_aware = bool(alloc.slo_aware)
        self.parked = deque()  # offloaded after their prefill, waiting to be fetched back to decode
        self.host_seen = alloc.host_bytes
        self.host_link_bytes = 0
        self.link_ps = self.link_bottleneck_ps = 0
        self.offloaded = {}  # request -> admitted this round with its KV in the host buffer
        self.pending_link_ps = 0  # a fetch's transfer, overlapped with the next decode iteration
        self.kv_pool_bytes = alloc.kv_pool_bytes if self.borrows else alloc.pool_bytes
        return prompt_np, target_np

    def _finish(self, prompt_np: np.ndarray, target_np: np.ndarray) -> ReplayResult:
        if self.paged and self.ff:
            # block growth reached the allocator lazily (at completion and preemption); the peak is eager growth's
            self.alloc.record_peak(self.peak_blocks * self.block_bytes)
        self.occupancy_byte_ps += self.occupancy_acc
        counters = {"preemptions": self.preemptions, "rejections": self.rejections,
                    "rejected_prompt_too_long": self.too_long, "truncated": self.truncated,
                    "recomputed_tokens": self.recomputed, "migrations": self.migrations,
                    "migrated_bytes": self.migrated_bytes, "peak_concurrency": self.peak,
                    "prefill_iterations": self.prefills, "decode_iterations": self.decodes,
                    "occupancy_byte_ps": self.occupancy_byte_ps, "migration_ps": self.migration_ps,
                    "end_ps": self.t, "host_link_bytes": self.host_link_bytes, "host_link_ps": self.link_ps,
                    "link_bottleneck_ps": self.link_bottleneck_ps, "kv_pool_bytes": self.kv_pool_bytes}
        timeline = Timeline(np.asarray(self.arrival), np.asarray(self.start_ps), np.asarray(self.first_ps),
                            np.asarray(self.done_ps), target_np,
                            prompt_np, np.asarray(self.reserved_tokens), self.arrival[0] if self.num else 0)
        return replay_result(self.alloc, counters, timeline, self.series, self.boundaries)

    # ------------------------------------------------------------------------------ requests

    def _reserved_bytes(self):
        return self.runs_now * self.block_bytes if self.paged and self.ff else self.alloc.reserved_bytes

    def _arrive(self) -> None:
        """Queue the arrivals up to now (rejecting prompts no policy could serve)."""
        i: cython.longlong
        while self.next_arrival < self.num and self.arrival[self.next_arrival] <= self.t:
            i = self.next_arrival
            self.next_arrival += 1
            if self.prompt[i] >= self.max_len:
                self._reject(i)
                self.too_long += 1  # no policy could serve it
                continue
            if self.target[i] < self.output[i]:
                self.truncated += 1
            if not self.queue:
                self.dirty = True
            self.queue.append(i)

    def _leave(self, i: cython.longlong) -> None:
        v: cython.longlong = self.base[i] + self.it
        self.kv_sum -= v
        if self.paged:
            self.runs_now -= -(-v // self.B)
            self.phase[self.base[i] % self.B] -= 1
        del self.running[i]
        self.seq_of[i] = -1
        self._unpin(i)

    def _unpin(self, i: cython.longlong) -> None:
        """Request i left the batch or the host buffer: its adapter, if any, is unpinned."""
        if self.serves_adapters and self.adapters[i] >= 0:
            self.alloc.release_adapter(self.adapters[i])

    def _catch_up(self, i: cython.longlong) -> cython.longlong:
        """Tell the allocator request i's KV length now (growth inside a contiguous block reaches
        it lazily when fast-forwarding); returns that length."""
        a: Allocation
        v: cython.longlong = self.base[i] + self.it
        a = self.allocs[i]
        if a.used_tokens != v:
            self.alloc.extend(a, v)
        return v

    def _finish_request(self, i: cython.longlong) -> None:
        a: Allocation
        v: cython.longlong = self.base[i] + self.it
        a = self.allocs[i]
        # what the request held at the end: with block growth, the blocks for its v tokens (those
        # grown lazily are never taken: release counts them in)
        self.reserved_tokens[i] = max(a.capacity_tokens, -(-v // self.B) * self.B) if self.paged else a.capacity_tokens
        self._leave(i)
        self.alloc.release(a, v)
        self._done(i)

    def _done(self, i: cython.longlong) -> None:
        """Request i completed now (its memory released)."""
        self.allocs[i] = None
        self.done_ps[i] = self.t
        self.completed += 1
        self.dirty = True

    def _preempt(self, i: cython.longlong) -> None:
        self.gen[i] = self.base[i] + self.it - self.prompt[i]
        self._leave(i)
        self.alloc.release(self.allocs[i])
        self.allocs[i] = None
        self.queue.appendleft(i)
        self.preemptions += 1

    def _reject(self, i: cython.longlong) -> None:
        self.rejections += 1
        self.done_ps[i] = -2

    def _push_events(self, i: cython.longlong, seq: cython.longlong) -> None:
        cap: cython.longlong
        self.finish.push((self.prompt[i] + self.target[i] - self.base[i]) * self.span + seq)
        if self.ff and not self.paged:
            cap = self.allocs[i].capacity_tokens
            if cap < self.prompt[i] + self.target[i]:
                self.overflow.push((cap - self.base[i]) * self.span + seq)

    # ------------------------------------------------------------------------------ admission

    def _admit(self) -> list:
        """Admit from the head while it fits (SchedulerSettings: KV space, max_num_seqs, the token
        budget); returns the admitted (not yet prefilled). Stopped by the budget alone, admission is
        retried at the next iteration (`dirty`), as vLLM schedules prefills at every step; stopped by
        space or the batch cap, it waits for a release."""
        a: Allocation
        i: cython.longlong
        g: cython.longlong
        kv: cython.longlong
        tokens: cython.longlong = 0
        adapter: cython.longlong
        need: cython.longlong
        room: cython.longlong
        free_blocks: cython.longlong
        B: cython.longlong = self.B
        alloc: AllocatorBase = self.alloc
        queue = self.queue
        pred, unc = self.pred, self.unc
        admitted: list = []
        # block growth: blocks free before this round (the allocator's count lags when fast-forwarding)
        free_blocks = (self.num_blocks - self.runs_now if self.ff else alloc.free_blocks) if self.paged else 0
        while queue and len(self.running) + len(admitted) < self.max_seqs:
            i = queue[0]
            g = self.gen[i]
            kv = self.prompt[i] + g
            if admitted and tokens + kv > self.max_prefill:
                self.dirty = True
                break
            adapter = self.adapters[i] if self.serves_adapters else -1
            if adapter >= 0 and not alloc.acquire_adapter(adapter):
                if not self.running and not admitted:
                    self._reject(queue.popleft())
                    continue
                break
            if self.paged:
                need = -(-(kv + 1) // B)
                room = free_blocks
                if self.borrows:  # the prefill's activations take their share of the shared pool first
                    room -= self.num_blocks - self._blocks_limit(tokens + kv, len(admitted) + 1)
                if need > room:
                    a = None
                    if self.offload and room >= 0 and need <= self._blocks_limit(1, 1):
                        a = alloc.reserve_offloaded(self.ids[i], kv + 1)
                    if a is None:
                        if adapter >= 0:
                            alloc.release_adapter(adapter, False)
                        if not self.running and not admitted and not self.parked:
                            self._reject(queue.popleft())
                            continue
                        break
                    self.offloaded[i] = True
                else:
                    a = alloc.reserve(self.ids[i], kv)
                    assert a is not None
                    free_blocks -= need
            else:
                p_out = None if pred is None else max(pred[i] - g, 1.0)
                a = alloc.reserve(self.ids[i], kv, p_out, None if unc is None else unc[i])
                if a is None:
                    if adapter >= 0:
                        alloc.release_adapter(adapter, False)
                    if not self.running and not admitted:
                        self._reject(queue.popleft())
                        continue
                    break
            queue.popleft()
            self.allocs[i] = a
            admitted.append(i)
            tokens += kv
        return admitted

    def _prefill(self, admitted: list) -> None:
        """One prefill iteration over the admitted requests: their prompts (and recomputed tokens),
        yielding each its first token."""
        a: Allocation
        i: cython.longlong
        k: cython.longlong
        dt: cython.longlong
        prompt_sum: cython.longlong = 0  # the prefill's cost depends on these two sums and the count only
        prompt_squares: cython.longlong = 0
        ttft: cython.longlong = -1
        for i in admitted:
            k = self.prompt[i] + self.gen[i]
            prompt_sum += k
            prompt_squares += k * k
            self.recomputed += self.gen[i]
            self.gen[i] += 1
            if self.offload and i in self.offloaded:
                continue  # its KV goes to the host buffer as the prefill writes it
            a = self.allocs[i]
            # the first token needs room: the reservation was for the prompt. Block growth takes the
            # block now; a contiguous block that already holds it is told lazily (_catch_up at an
            # overflow, release(a, final_tokens) at completion)
            if (self.paged or not self.ff or k + 1 > a.capacity_tokens) and not self.alloc.extend(a, k + 1):
                raise AssertionError(f"admission of {self.ids[i]} left no room for its first token")
            self._join(i, k + 1)
        dt = self.prefill_clock.ps(prompt_sum, prompt_squares, len(admitted))
        # adapters loaded and KV offloaded for this prefill cross the host link layer by layer,
        # beside its compute (eLLM §4.3.2, ADR-006's warm tier): the iteration takes the longer
        dt += self._link_beyond(self._link_ps(), dt)
        started: cython.longlong = self.t
        self.t += dt
        self.occupancy_byte_ps += self._reserved_bytes() * dt
        self.prefills += 1
        for i in admitted:
            if self.first_ps[i] < 0:
                self.start_ps[i] = started
                self.first_ps[i] = self.t
                if self.t - self.arrival[i] > ttft:
                    ttft = self.t - self.arrival[i]
            if self.offload and i in self.offloaded:
                del self.offloaded[i]
                if self.gen[i] >= self.target[i]:
                    self._finish_offloaded(i)
                else:
                    self.parked.append(i)
            elif self.gen[i] >= self.target[i]:
                self._finish_request(i)
            else:
                self._push_events(i, self.seq_of[i])
        if self.slo_aware and ttft >= 0:
            self.alloc.latency_feedback(_seconds(ttft), None)

    def _join(self, i: cython.longlong, v: cython.longlong) -> None:
        """Request i, holding v KV tokens, joins the running batch (a new admission number)."""
        seq: cython.longlong = self.next_seq
        B: cython.longlong = self.B
        self.next_seq += 1
        assert seq < self.span, "more than 2**32 admissions"
        if seq == len(self.request_of_seq):  # re-admissions after preemptions outnumber the requests
            self.request_of_seq = _doubled(self.request_of_seq)
        self.request_of_seq[seq] = i
        self.running[i] = seq
        self.seq_of[i] = seq
        self.base[i] = v - self.it
        self.kv_sum += v
        if self.paged:
            self.runs_now += -(-v // B)
            self.phase[self.base[i] % B] += 1
            if self.runs_now > self.peak_blocks:
                self.peak_blocks = self.runs_now

    def _link_ps(self) -> cython.longlong:
        """The host-link time of the bytes the policy moved since the last call (0 without)."""
        moved = self.alloc.host_bytes - self.host_seen
        if moved == 0:
            return 0
        self.host_seen = self.alloc.host_bytes
        self.host_link_bytes += moved
        dt: cython.longlong = to_ps(self.cost.host_link_s(moved))
        self.link_ps += dt
        return dt

    def _fetch(self) -> None:
        """Offloaded requests back from the host buffer, oldest first, while their blocks fit
        beside the running batch's (and its activations, when the pool is shared) and the batch
        cap allows; before any admission, as vLLM swaps in before it prefills. Their transfer
        overlaps the next decode iteration."""
        i: cython.longlong
        v: cython.longlong
        n: cython.longlong
        need: cython.longlong
        held: cython.longlong
        while self.parked and len(self.running) < self.max_seqs:
            i = self.parked[0]
            v = self.prompt[i] + self.gen[i]
            need = -(-(v + 1) // self.B)
            n = len(self.running) + 1
            held = self.runs_now if self.ff else self.num_blocks - self.alloc.free_blocks
            if held + need > self._blocks_limit(n, n) or not self.alloc.fetch(self.allocs[i]):
                break
            self.parked.popleft()
            self._join(i, v)
            self._push_events(i, self.seq_of[i])
        self.pending_link_ps += self._link_ps()

    def _finish_offloaded(self, i: cython.longlong) -> None:
        """A request done at its first token while its KV was in the host buffer."""
        a: Allocation = self.allocs[i]
        self.reserved_tokens[i] = a.capacity_tokens
        self.alloc.release(a)
        self._unpin(i)
        self._done(i)

    def _blocks_limit(self, tokens: cython.longlong, sequences: cython.longlong) -> cython.longlong:
        """The blocks KV may hold during an iteration that runs `tokens` tokens for `sequences`
        sequences: all of them, unless the pool is shared with activations: then the KV pool and
        what the iteration's activation demand leaves of the borrowable memory (a demand past it
        was the static engine's to reserve too, and takes nothing from the KV pool)."""
        if not self.borrows:
            return self.num_blocks
        borrow = self.alloc.pool_bytes - self.kv_pool_bytes  # the activation memory the KV may borrow
        return (self.alloc.pool_bytes - min(self.cost.activation_bytes(tokens, sequences), borrow)) // self.block_bytes

    # ------------------------------------------------------------------------------ growth

    def _grow_contiguous(self, i: cython.longlong) -> None:
        """Request i needs one more token than its block holds: extend (migrate) or preempt it."""
        a: Allocation
        dt: cython.longlong
        v: cython.longlong
        a = self.allocs[i]
        v = self._catch_up(i)
        before = self.alloc.migrated_bytes
        if self.alloc.extend(a, v + 1):
            copied = self.alloc.migrated_bytes - before
            if copied:  # moved; a policy that grows a request by more page ranges copies nothing
                self.migrations += 1
                self.migrated_bytes += copied
                dt = to_ps(self.cost.migration_s(copied))
                self.t += dt
                self.migration_ps += dt
                self.occupancy_byte_ps += self._reserved_bytes() * dt
            if a.capacity_tokens < self.prompt[i] + self.target[i]:
                self.overflow.push((a.capacity_tokens - self.base[i]) * self.span + self.seq_of[i])
        else:
            self._preempt(i)

    def _preempt_newest_until_fits(self, need_at: cython.longlong, limit: cython.longlong) -> None:
        """Block growth: preempt the newest running requests until the next iteration's blocks fit
        in `limit` blocks."""
        newest: cython.longlong
        v: cython.longlong
        while self.running and need_at > limit:
            newest = next(reversed(self.running))
            v = self.base[newest] + self.it
            need_at -= -(-(v + 1) // self.B)
            self._preempt(newest)

    def _grow_fast(self) -> None:
        """Fast-forwarding: the overflows due at this iteration, then block exhaustion."""
        key: cython.longlong
        seq: cython.longlong
        i: cython.longlong
        need: cython.longlong
        limit: cython.longlong
        span: cython.longlong = self.span
        while self.overflow.size:
            key = self.overflow.top()
            if key // span != self.it:
                break
            self.overflow.pop()
            seq = key % span
            i = self.request_of_seq[seq]
            if self.seq_of[i] == seq:
                self._grow_contiguous(i)
        if self.paged:
            need = self.runs_now + self.phase[(-self.it) % self.B]
            limit = self._blocks_limit(len(self.running), len(self.running))
            if need > limit:
                if not self.borrows:  # eager growth takes the last free block, then fails
                    self.peak_blocks = self.num_blocks
                self._preempt_newest_until_fits(need, limit)

    def _grow_stepping(self) -> None:
        """Stepping: every running request grows by one token now, eagerly."""
        a: Allocation
        i: cython.longlong
        v: cython.longlong
        need: cython.longlong = 0
        if self.borrows:  # the shared pool's limit first, as _grow_fast applies it
            for i in self.running:
                need += -(-(self.base[i] + self.it + 1) // self.B)
            self._preempt_newest_until_fits(need, self._blocks_limit(len(self.running), len(self.running)))
        for i in list(self.running):
            if i not in self.running:
                continue
            a = self.allocs[i]
            v = self.base[i] + self.it
            if not self.paged:
                if v + 1 > a.capacity_tokens:
                    self._grow_contiguous(i)
                else:
                    self.alloc.extend(a, v + 1)
                continue
            while i in self.running and not self.alloc.extend(a, v + 1):
                self._preempt(next(reversed(self.running)))

    # ------------------------------------------------------------------------------ decode

    def _next_event(self) -> cython.longlong:
        """Iterations until the next live completion or overflow (stale heap entries dropped)."""
        key: cython.longlong
        seq: cython.longlong
        k: cython.longlong
        span: cython.longlong = self.span
        while True:  # drop stale entries: their request left that admission
            key = self.finish.top()
            seq = key % span
            if self.seq_of[self.request_of_seq[seq]] == seq:
                break
            self.finish.pop()
        k = key // span - self.it
        while self.overflow.size:
            key = self.overflow.top()
            seq = key % span
            if self.seq_of[self.request_of_seq[seq]] == seq:
                if key // span - self.it < k:
                    k = key // span - self.it
                break
            self.overflow.pop()
        return k

    def _decode_fast(self) -> None:
        """k decode iterations of the fixed batch, summed in closed form."""
        n: cython.longlong = len(self.running)
        k: cython.longlong = 1 if self.retry else self._next_event()
        rho: cython.longlong
        dt: cython.longlong
        reserved_now: cython.longlong
        B: cython.longlong = self.B
        segment: Segment = self.segment
        runs: cython.longlong[:] = self.runs
        flush: cython.longlong = OCCUPANCY_FLUSH
        if self.paged:
            runs[0] = self.runs_now
            for rho in range(B):
                runs[rho + 1] = runs[rho] + self.phase[(-self.it - rho) % B]
        else:
            runs[0] = runs[1] = self.alloc.kv_runs if self.runs_tracked else n
        segment.reset(n, self.kv_sum)
        if self.paged:
            k = segment.first_over(self._blocks_limit(n, n), k)
        if not self.queue and self.next_arrival < self.num and n < self.max_seqs:
            k = segment.iterations_until(self.arrival[self.next_arrival] - self.t, k)
        dt, held = segment.advance(k, self.paged)
        if self.pending_link_ps:
            stall = self._overlap_fetch(segment.elapsed_ps(1))
            dt += stall
            if self.paged:  # the first iteration's blocks are held while the transfer finishes
                held += runs[1] * stall
        if self.slo_aware:
            self.alloc.latency_feedback(None, _seconds(dt // k))
        if self.paged:
            self.occupancy_byte_ps += held * self.block_bytes
            self.runs_now = runs[k % B] + n * (k // B)  # = the blocks held during the last iteration
            if self.runs_now > self.peak_blocks:
                self.peak_blocks = self.runs_now
        else:
            # reserved bytes x ps, summed in 64 bits and handed to the Python sum near 2**62
            reserved_now = self.alloc.reserved_bytes
            if dt == 0 or reserved_now <= flush // dt:
                self.occupancy_acc += reserved_now * dt
                if self.occupancy_acc > flush:
                    self.occupancy_byte_ps += self.occupancy_acc
                    self.occupancy_acc = 0
            else:
                self.occupancy_byte_ps += int(reserved_now) * dt
        self._advance(n, k, dt)

    def _decode_stepping(self) -> None:
        """One decode iteration, its step computed request by request (and run on the device by
        the probe, when there is one)."""
        n: cython.longlong = len(self.running)
        dt: cython.longlong
        kv_now = [self.base[i] + self.it for i in self.running]
        dt = self.coeff.step_ps(kv_now, [self.alloc.runs_of(self.allocs[i]) for i in self.running]
                                if self.runs_tracked else None)
        if self.pending_link_ps:
            dt += self._overlap_fetch(dt)
        if self.slo_aware:
            self.alloc.latency_feedback(None, _seconds(dt))
        if self.probe is not None:
            self.probe.step([self.allocs[i] for i in self.running], kv_now, dt)
        self.occupancy_byte_ps += self.alloc.reserved_bytes * dt
        self._advance(n, 1, dt)

    def _overlap_fetch(self, first_ps: cython.longlong) -> cython.longlong:
        """Fetched KV crosses the host link beside the first decode iteration after the fetch
        (`first_ps` long): returns what the transfer takes beyond it."""
        link: cython.longlong = self.pending_link_ps
        self.pending_link_ps = 0
        return self._link_beyond(link, first_ps)

    def _link_beyond(self, link_ps: cython.longlong, compute_ps: cython.longlong) -> cython.longlong:
        """A transfer overlapped layer by layer with the compute it serves: what it takes beyond
        that compute (0 when hidden), counted as time the link was the bottleneck."""
        if link_ps <= compute_ps:
            return 0
        self.link_bottleneck_ps += link_ps - compute_ps
        return link_ps - compute_ps

    def _advance(self, n: cython.longlong, k: cython.longlong, dt: cython.longlong) -> None:
        self.t += dt
        self.it += k
        self.kv_sum += n * k
        self.decodes += k

    def _complete(self) -> None:
        """Release the requests whose last token the iterations just run produced."""
        key: cython.longlong
        seq: cython.longlong
        i: cython.longlong
        span: cython.longlong = self.span
        while self.finish.size:
            key = self.finish.top()
            if key // span > self.it:
                break
            self.finish.pop()
            seq = key % span
            i = self.request_of_seq[seq]
            if self.seq_of[i] == seq:
                assert key // span == self.it
                self._finish_request(i)
