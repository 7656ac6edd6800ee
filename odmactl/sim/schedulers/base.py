"""What every scheduler shares: the Scheduler base class, the protocol the engine calls, and the
mechanism of admitting one request's KV (`_take`) and of swapping offloaded requests back in.

A scheduler decides each iteration's batch: which waiting requests are admitted, in what order,
within KV space, `max_num_seqs` and the token budget, and whom to preempt when the running
requests outgrow the pool. The engine (sim/engine.py) advances the clock and tells it what
happened (an arrival, a release, a preemption, a decode); the KV manager (the allocator) answers
whether a request fits. A scheduler is chosen by name ([scheduler] policy, sim/schedulers/
__init__.py), never by a policy's name.

Compiled (setup.py, base.pxd), Scheduler is an extension type whose methods the engine calls as C
functions; a scheduler of one's own may subclass it in Python.
"""

from __future__ import annotations

from collections import deque

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.allocator.base import AllocatorBase
from odmactl.sim.batch import Batch

TAKEN = 1  # _take: the request's KV is reserved in the pool
OFFLOADED = 2  # its KV goes to the host tier as its prefill writes it
NO_ROOM = 0  # it does not fit now (an adapter acquired for it was released again)


class Scheduler:
    """The protocol the engine calls (the engine's side, in order of a loop iteration):
    `arrive(i)` queues an arrival; `swap_in()` brings offloaded requests back into the batch when
    `parked` holds any; `schedule()` returns the requests to prefill now (None or empty: decode);
    when the running requests outgrow the pool, `victim()` names the one to preempt, `requeue(i)`
    takes it back and `preempted()` follows; `decode_limit()` caps the next decode's iterations
    (0: until the next event); `first_waking(n, j)` the first arrival from request j on that
    can change a batch of n (-1: none, arrivals do not stop a fast-forward until the next event;
    an earlier answer is always safe, a later one is not); `quiet()` whether `schedule()` would change
    nothing now (the engine may then run on through a boundary where only growth is due);
    `decoded()` after each decode, `released()` after a completion, `idle()` when nothing runs
    (True: retry at once). A scheduler of one's own subclasses this (or FcfsScheduler), overrides
    what its rule changes, and registers its class (sim/schedulers/__init__.py).

    State: `waiting` (the waiting requests: FCFS's queue, in the order they are considered; a
    scheduler may keep them its own way, as long as `len(waiting)` and its truth count them, which
    is all the engine and the routers read), `parked` (offloaded by their
    prefill, waiting to be fetched back: vLLM's swapped queue), `stalled` (refused growth, holding
    their blocks until a release makes room: sim/growth.py), and the batch caps; a stalled request
    keeps its seat (`seats()` counts it against max_num_seqs). `prefix` is the replay's prefix
    cache (allocator/prefix.py), None without one. Invariant: a request is in at most
    one of `waiting`, `parked`, `stalled` and the batch's `running`."""

    name = "base"

    def __init__(self) -> None:
        self.waiting = deque()
        self.parked = deque()
        self.stalled = deque()
        self.prefix = None

    def start(self, batch: Batch, alloc: AllocatorBase, tier, cache, max_num_seqs: cython.longlong,
              max_prefill_tokens: cython.longlong, settings=None) -> None:
        """Bind to a replay: its batch, the KV manager and its collaborators (None when absent), the
        caps, and the replay's SchedulerSettings (for a scheduler's own settings). `now` is the
        replay's clock (ps), which the engine writes before each `schedule()`. `chunked`: the
        engine chunks prompts into a step's budget (vLLM v1; SchedulerSettings.engine), and then
        writes `budget`, the tokens the step leaves for waiting prompts, before each `schedule()`."""
        self.batch = batch
        self.alloc = alloc
        self.tier = tier
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.chunked = settings is not None and settings.chunked
        self.budget = max_prefill_tokens
        self.free_blocks = 0
        self.now = 0

    # -- what the engine tells a scheduler (FCFS decides what to do with it) -----------------------

    def arrive(self, i: cython.longlong) -> None:
        self.waiting.append(i)

    def requeue(self, i: cython.longlong) -> None:
        """Preempted: its KV released, it waits again, first."""
        self.waiting.appendleft(i)

    def released(self) -> None:
        pass

    def preempted(self) -> None:
        pass

    def decoded(self) -> None:
        pass

    def idle(self) -> cython.bint:
        return False

    def quiet(self) -> cython.bint:
        """Whether `schedule()` would leave the batch as it is now (no admission, no swap-in):
        then the engine may run on through a boundary where only growth is due. Unknown to the
        base class: False, back to the main loop."""
        return False

    # -- what the engine asks ----------------------------------------------------------------------

    def schedule(self) -> list:
        """The requests to prefill now, their KV reserved (`_take`), in prefill order; None or
        empty: none, the batch decodes."""
        raise NotImplementedError

    def seats(self) -> cython.longlong:
        """The batch seats taken: the running requests, the stalled ones and those whose prompt is
        being chunked."""
        return len(self.batch.running) + len(self.stalled) + len(self.batch.prefilling)

    def over_budget(self, tokens: cython.longlong, kv: cython.longlong, admitted: cython.longlong) -> cython.bint:
        """Whether the step's token budget stops the admission of a prompt of `kv` tokens after
        `admitted` prompts of `tokens` budget tokens. Whole prompts (vLLM 0.6, `_schedule_prefills`)
        fit whole, the first always (the budget holds max_model_len); chunked (vLLM v1,
        `Scheduler.schedule`'s waiting loop, `while self.waiting and token_budget > 0`) a prompt
        takes what is left while anything is."""
        if self.chunked:
            return tokens >= self.budget
        return admitted > 0 and tokens + kv > self.max_prefill_tokens

    def charged(self, tokens: cython.longlong, kv: cython.longlong) -> cython.longlong:
        """The budget tokens spent once a prompt of `kv` tokens joins after `tokens`: chunked, its
        first chunk (at most what is left: vLLM v1's `min(num_new_tokens, token_budget)`)."""
        if self.chunked and kv > self.budget - tokens:
            return self.budget
        return tokens + kv

    def victim(self) -> cython.longlong:
        """The running request to preempt: the newest (vLLM preempts the lowest priority, the last
        admitted under FCFS: vllm/core/scheduler.py `_schedule_running`)."""
        return self.batch.newest()

    def decode_limit(self) -> cython.longlong:
        return 0

    def first_waking(self, n: cython.longlong, j: cython.longlong) -> cython.longlong:
        return j if n + len(self.stalled) < self.max_num_seqs else -1

    # -- the shared mechanism -----------------------------------------------------------------------

    def begin_round(self) -> None:
        """Before admitting: the blocks free now (block growth; the allocator's count lags when
        fast-forwarding, so the batch's is read: a chunked step admits after its running requests
        grew, so theirs after the growth)."""
        b: Batch = self.batch
        held: cython.longlong
        if not b.block_growth:
            self.free_blocks = 0
            return
        held = b.blocks_next() if self.chunked and b.ff else b.held_blocks(self.alloc)
        self.free_blocks = b.num_blocks - held
        if self.prefix is not None and b.ff:  # the cached units eager growth evicted by now
            self.prefix.sync(self.free_blocks)

    def new_tokens(self, i: cython.longlong) -> cython.longlong:
        """The tokens request i's prefill computes: its prompt and what it generated, less the
        prefix the cache holds now (what the step's token budget is charged: vLLM v1's
        `num_new_tokens` after `get_computed_blocks`)."""
        b: Batch = self.batch
        kv: cython.longlong = b.prompt[i] + b.gen[i]
        if self.prefix is None:
            return kv
        return kv - self.prefix.lookup(i, kv)

    def _take(self, i: cython.longlong, tokens: cython.longlong, admitted: cython.longlong) -> cython.longlong:
        """Reserve request i's KV (its prompt and what it generated) for a prefill that already
        holds `tokens` tokens of `admitted` requests: TAKEN, OFFLOADED or NO_ROOM (then anything
        acquired for it is given back). With block growth the prompt and its first token must fit
        in the blocks free now, less what the prefill's activations take where the pool is shared
        (block_limit), else its KV may go to a host tier; contiguous growth asks the policy, with
        the prediction of what is left to generate."""
        b: Batch = self.batch
        g: cython.longlong = b.gen[i]
        kv: cython.longlong = b.prompt[i] + g
        adapter: cython.longlong = b.adapters[i] if self.cache is not None else -1
        need: cython.longlong
        room: cython.longlong
        c: cython.longlong = 0
        status: cython.longlong = TAKEN
        if adapter >= 0 and not self.cache.acquire_adapter(adapter):
            return NO_ROOM
        if b.block_growth:
            need = 0
            if self.prefix is not None:  # its cached prefix is taken, not reserved: free units it hits stop being free
                c = self.prefix.lookup(i, kv)
                need = self.prefix.evictable_hit_blocks(i)
            need += -(-(kv + 1 - c) // b.B)
            room = self.free_blocks - (b.num_blocks - self.alloc.block_limit(tokens + kv, admitted + 1))
            if need <= room:
                if self.prefix is not None:  # the units it hits first: the blocks taken next may evict free ones
                    self.prefix.admit(i, kv)
                a = self.alloc.reserve(b.ids[i], kv - c)
                assert a is not None
                self.free_blocks -= need
            elif self.tier is not None and room >= 0 and need <= self.alloc.block_limit(1, 1):
                a = self.tier.reserve_offloaded(b.ids[i], kv + 1)
                status = OFFLOADED
            else:
                a = None
        else:
            a = self.alloc.reserve(b.ids[i], kv, self.left(i), None if b.unc is None else b.unc[i])
        if a is None:
            if adapter >= 0:
                self.cache.release_adapter(adapter, False)
            return NO_ROOM
        b.allocs[i] = a
        b.cached[i] = c
        if status == OFFLOADED:
            b.offloaded[i] = True
        return status

    def left(self, i: cython.longlong):
        """What request i's prediction leaves to generate, None without predictions; once a
        preempted request has generated it all, None too (the policy's fallback: ODMA's large
        block, never a block sized by the spent rest)."""
        b: Batch = self.batch
        rest: cython.double
        if b.pred is None:
            return None
        rest = b.pred[i] - b.gen[i]
        return rest if rest >= 1.0 else None

    def never_fits(self, admitted: cython.longlong) -> cython.bint:
        """Whether a request that does not fit now never will: nothing runs, nothing was admitted
        this round, nothing waits in the host tier, nothing is stalled and no prompt is being chunked
        (then it is rejected)."""
        return not self.batch.running and not admitted and not self.parked and not self.stalled \
            and not self.batch.prefilling

    def swap_in(self) -> None:
        """Offloaded requests back from the host tier, oldest first, while their blocks fit beside
        the running batch's (within block_limit, the iteration's share of a shared pool) and the
        batch cap allows; before any admission, as vLLM swaps in before it prefills."""
        b: Batch = self.batch
        i: cython.longlong
        v: cython.longlong
        n: cython.longlong
        need: cython.longlong
        while self.parked and self.seats() < self.max_num_seqs:
            i = self.parked[0]
            v = b.prompt[i] + b.gen[i]
            need = -(-(v + 1) // b.B)
            n = len(b.running) + 1
            if b.held_blocks(self.alloc) + need > self.alloc.block_limit(n, n) or not self.tier.fetch(b.allocs[i]):
                break
            self.parked.popleft()
            b.join(i, v)
            b.push_finish(i, b.seq_of[i])
