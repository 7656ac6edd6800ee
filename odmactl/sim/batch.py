"""The requests of one replay and its running batch: what the scheduler decides on and the engine
advances (sim/engine.py).

Compiled (setup.py, batch.pxd), Batch is an extension type whose state is C fields and whose
methods the engine and the schedulers call as C functions; the same source runs in Python.
"""

from __future__ import annotations

from array import array

import numpy as np

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.sim.keyheap import KeyHeap
from odmactl.sim.metrics import Timeline
from odmactl.sim.workload import Workload

SEQ_SPAN = 1 << 32  # heap keys: iteration * SEQ_SPAN + admission number (admissions stay below 2**32)


def int64s(values) -> array:
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


class Requests:
    """Every per-request array of a replay's Batch (its docstring says what each holds), made
    once: the engines of a cluster (sim/cluster.py) share one, since each reads and writes only
    the entries of the requests routed to it (R engines held R copies: about 1 GB for 253
    engines on 20,000 requests). `key` says what the arrays were made for: the workload (by
    identity), max_model_len and max_new_tokens."""

    __slots__ = ("key", "prompt", "target", "output", "arrival", "ids", "pred", "unc", "adapters", "gen", "base",
                 "seq_of", "start_ps", "first_ps", "done_ps", "reserved_tokens", "allocs", "cached")

    def __init__(self, w: Workload, max_len: int, max_new_tokens) -> None:
        num = w.size
        self.key = (id(w), max_len, max_new_tokens)
        prompt_np = w.prompt_tokens.astype(np.int64)
        target_np = np.minimum(w.output_tokens, np.maximum(max_len - w.prompt_tokens, 0)).astype(np.int64)
        if max_new_tokens is not None:
            target_np = np.minimum(target_np, max_new_tokens)
        self.prompt = int64s(prompt_np)
        self.target = int64s(target_np)
        self.output = int64s(w.output_tokens)
        self.arrival = int64s(w.arrival_ps)
        self.ids = w.request_ids if isinstance(w.request_ids, list) else list(w.request_ids)
        self.pred = None
        if w.predicted_output_tokens is not None:  # at least 1, and never past the output cap (parity: every policy
            pred_np = np.maximum(w.predicted_output_tokens, 1.0)  # runs under the cap, and a prediction knows it)
            self.pred = (pred_np if max_new_tokens is None else np.minimum(pred_np, float(max_new_tokens))).tolist()
        self.unc = None if w.uncertainty is None else w.uncertainty.tolist()
        self.adapters = None if w.adapters is None else int64s(w.adapters)
        self.gen = _filled(num, 0)
        self.base = _filled(num, 0)
        self.seq_of = _filled(num, -1)
        self.start_ps = _filled(num, -1)
        self.first_ps = _filled(num, -1)
        self.done_ps = _filled(num, -1)
        self.reserved_tokens = _filled(num, 0)
        self.allocs = [None] * num
        self.cached = _filled(num, 0)


class Batch:
    """The replay's requests, by index i in arrival order, and who is running.

    Per request (int64 buffers): `prompt[i]`; `pred[i]` its predicted output tokens (a list of
    floats, at least 1 and at most max_new_tokens; None without predictions); `target[i]` the output tokens it is to generate (its
    output, capped by max_model_len and by max_new_tokens); `arrival[i]` (ps); `gen[i]` the tokens
    generated as of the last boundary it ran at; while it runs, its KV tokens at decode iteration
    `it` are `base[i] + it` and `seq_of[i]` is its admission number (-1 otherwise); `start_ps[i]`,
    `first_ps[i]`, `done_ps[i]` the start of its first prefill, its first token and its completion
    (-1 until then; done_ps -2: rejected); `reserved_tokens[i]` the KV tokens it held at the end;
    `allocs[i]` its Allocation while it holds one. `offloaded` the requests of the prefill being
    scheduled whose KV goes to a host tier. `prefilling` (chunked schedules, vLLM v1) maps each
    admitted request whose prompt is still being computed, chunk by chunk, to the tokens computed
    so far, in admission order; its KV is reserved (for the prompt and its first token) and it is
    not running yet. `prefilling_blocks` counts their blocks (block growth, fast-forwarding).
    `cached[i]` the tokens of request i's prompt its admission found in the prefix cache (its
    prefill computes the rest); `shared` the blocks really held less the blocks the requests
    count (allocator/prefix.py: the cached units others hold for them; 0 without a prefix cache).

    `running` maps request -> admission number, in admission order (the last is the newest);
    `finish` and `overflow` are heaps of iteration * SEQ_SPAN + admission number, the iteration
    after which the request completes or outgrows its block (an entry is stale once its request
    left that admission). `kv_sum` is the running requests' KV tokens at iteration `it`.

    With block growth (`block_growth`, blocks of `B` tokens), the replay counts blocks itself when
    fast-forwarding (`ff`), as eager growth would take them, since growth reaches the allocator
    lazily: `runs_now` the blocks the running requests count, `phase[r]` how many of them have base
    = r mod B, `peak_blocks` the most held at once. Contiguous growth has B = 1.

    Invariants: `kv_sum` = sum of base[i] + it over `running`; `runs_now` = sum of ceil((base[i] +
    it) / B) over `running` and `prefilling_blocks` = sum of ceil((prompt[i] + gen[i] + 1) / B) over
    `prefilling` (block growth, fast-forwarding), the blocks held being runs_now +
    prefilling_blocks + shared; `request_of_seq[seq_of[i]] == i`; a request is in
    at most one of `running` and `prefilling`.
    """

    __slots__ = ("prompt", "target", "output", "arrival", "gen", "base", "seq_of", "start_ps", "first_ps", "done_ps",
                 "reserved_tokens", "allocs", "offloaded", "running", "prefilling", "prefilling_blocks", "request_of_seq", "next_seq", "span", "it",
                 "kv_sum", "B", "block_growth", "ff", "num_blocks", "runs_now", "phase", "peak_blocks", "finish", "overflow",
                 "num", "rejections", "ids", "pred", "unc", "adapters", "cached", "shared")

    def __init__(self, w: Workload, max_len: int, max_new_tokens, block, num_blocks: int, ff: bool,
                 requests: Requests | None = None) -> None:
        """`block`: the policy's growth block in tokens (None: contiguous growth); `requests`: the
        per-request arrays, when a cluster's engines share them (None: made here)."""
        num = w.size
        self.num = num
        r = requests if requests is not None else Requests(w, max_len, max_new_tokens)
        assert r.key == (id(w), max_len, max_new_tokens), "per-request arrays made for another replay"
        self.prompt, self.target, self.output, self.arrival = r.prompt, r.target, r.output, r.arrival
        self.ids, self.pred, self.unc, self.adapters = r.ids, r.pred, r.unc, r.adapters
        self.gen, self.base, self.seq_of = r.gen, r.base, r.seq_of
        self.start_ps, self.first_ps, self.done_ps = r.start_ps, r.first_ps, r.done_ps
        self.reserved_tokens, self.allocs, self.cached = r.reserved_tokens, r.allocs, r.cached
        self.offloaded = {}
        self.running = {}
        self.prefilling = {}
        self.prefilling_blocks = 0
        # admission number -> request; doubles when full (a cluster's engine admits its share)
        self.request_of_seq = _filled(num + 1 if requests is None else 1024, 0)
        self.next_seq = 0
        self.span = SEQ_SPAN
        self.it = 0
        self.kv_sum = 0
        self.block_growth = block is not None
        self.B = block if self.block_growth else 1
        self.ff = ff
        self.num_blocks = num_blocks
        self.runs_now = self.peak_blocks = 0
        self.phase = _filled(self.B, 0)
        self.finish = KeyHeap()
        self.overflow = KeyHeap()
        self.rejections = 0
        self.shared = 0

    def timeline(self, mine=None) -> Timeline:
        """The per-request times and tokens, as sim/metrics reads them; `mine` (a boolean mask): of
        those requests only (an engine of a cluster, sim/cluster.py), from the first one's arrival."""
        arrays = [np.asarray(self.arrival), np.asarray(self.start_ps), np.asarray(self.first_ps),
                  np.asarray(self.done_ps), np.asarray(self.target), np.asarray(self.prompt),
                  np.asarray(self.reserved_tokens)]
        if mine is not None:
            arrays = [a[mine] for a in arrays]
        return Timeline(*arrays, int(arrays[0][0]) if arrays[0].size else 0)

    def started(self, i: cython.longlong) -> cython.bint:
        """Whether request i's first prefill began."""
        return self.start_ps[i] >= 0

    def kv(self, i: cython.longlong) -> cython.longlong:
        """Running request i's KV tokens now."""
        return self.base[i] + self.it

    def join(self, i: cython.longlong, v: cython.longlong) -> None:
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
        if self.block_growth:
            self.runs_now += -(-v // B)
            self.phase[self.base[i] % B] += 1
            self.note_peak()

    def note_peak(self) -> None:
        """Block growth: the blocks held now (the running requests' and the prompts being chunked)
        enter `peak_blocks`."""
        if self.runs_now + self.prefilling_blocks + self.shared > self.peak_blocks:
            self.peak_blocks = self.runs_now + self.prefilling_blocks + self.shared

    def begin_prefill(self, i: cython.longlong) -> None:
        """Request i, admitted, starts its prompt (and recomputed tokens) chunk by chunk, its KV
        reserved for them and its first token."""
        self.prefilling[i] = self.cached[i]  # the cached prefix counts as computed
        if self.block_growth:
            self.prefilling_blocks += -(-(self.prompt[i] + self.gen[i] + 1) // self.B)
            self.note_peak()

    def end_prefill(self, i: cython.longlong) -> None:
        """Request i's prompt is computed: it leaves `prefilling` (to join the batch)."""
        del self.prefilling[i]
        if self.block_growth:
            self.prefilling_blocks -= -(-(self.prompt[i] + self.gen[i] + 1) // self.B)

    def leave(self, i: cython.longlong) -> cython.longlong:
        """Request i leaves the running batch; returns its KV tokens."""
        v: cython.longlong = self.base[i] + self.it
        self.kv_sum -= v
        if self.block_growth:
            self.runs_now -= -(-v // self.B)
            self.phase[self.base[i] % self.B] -= 1
        del self.running[i]
        self.seq_of[i] = -1
        return v

    def newest(self) -> cython.longlong:
        """The running request admitted last."""
        return next(reversed(self.running))

    def reject(self, i: cython.longlong) -> None:
        self.rejections += 1
        self.done_ps[i] = -2

    def held_blocks(self, alloc) -> cython.longlong:
        """Block growth: the blocks the running requests hold (the replay's count when
        fast-forwarding: the allocator's lags, as growth reaches it lazily)."""
        return self.runs_now + self.prefilling_blocks + self.shared if self.ff else self.num_blocks - alloc.free_blocks

    def blocks_next(self) -> cython.longlong:
        """Block growth: the blocks held after the next iteration, as eager growth takes them (the
        running requests' and the prefilling ones')."""
        return self.runs_now + self.prefilling_blocks + self.shared + self.phase[(-self.it) % self.B]

    def fill_runs(self, runs: cython.longlong[::1]) -> None:
        """Block growth: runs[rho] = the blocks the running requests hold after the next rho
        iterations, rho = 0..B (a Segment's run counts)."""
        B: cython.longlong = self.B
        rho: cython.longlong
        runs[0] = self.runs_now
        for rho in range(B):
            runs[rho + 1] = runs[rho] + self.phase[(-self.it - rho) % B]

    def push_finish(self, i: cython.longlong, seq: cython.longlong) -> None:
        """Request i (admission seq) completes after its target's last token."""
        self.finish.push((self.prompt[i] + self.target[i] - self.base[i]) * self.span + seq)

    def push_overflow(self, i: cython.longlong, seq: cython.longlong, capacity: cython.longlong) -> None:
        """Request i (admission seq) outgrows its `capacity` tokens, unless it completes first."""
        if capacity < self.prompt[i] + self.target[i]:
            self.overflow.push((capacity - self.base[i]) * self.span + seq)

    def live(self, key: cython.longlong) -> cython.bint:
        """Whether a heap key's request is still in that admission."""
        seq: cython.longlong = key % self.span
        return self.seq_of[self.request_of_seq[seq]] == seq

    def live_top(self, heap: KeyHeap) -> cython.longlong:
        """The smallest live key of `heap`, stale entries above it dropped (their request left that
        admission); -1 when none is left."""
        key: cython.longlong
        while heap.size:
            key = heap.top()
            if self.live(key):
                return key
            heap.pop()
        return -1

    def next_event(self) -> cython.longlong:
        """Iterations until the next live completion or overflow (a request runs, so one completes)."""
        span: cython.longlong = self.span
        k: cython.longlong = self.live_top(self.finish) // span - self.it
        key: cython.longlong = self.live_top(self.overflow)
        if key >= 0 and key // span - self.it < k:
            k = key // span - self.it
        return k

    def overflow_now(self) -> cython.bint:
        """Whether an overflow entry (perhaps a stale one) is due at this iteration."""
        return self.overflow.size > 0 and self.overflow.top() // self.span == self.it

    def completes_now(self) -> cython.bint:
        """Whether a running request completes at this iteration (stale entries dropped)."""
        key: cython.longlong = self.live_top(self.finish)
        return key >= 0 and key // self.span == self.it

    def due(self, heap: KeyHeap) -> cython.longlong:
        """The request of the next live entry of `heap` due at this iteration (popped), or -1."""
        key: cython.longlong
        span: cython.longlong = self.span
        while heap.size:
            key = heap.top()
            if key // span > self.it:
                return -1
            heap.pop()
            if self.live(key):
                assert key // span == self.it
                return self.request_of_seq[key % span]
        return -1
