"""`fcfs`: vLLM 0.6's default scheduler (vllm/core/scheduler.py, `_schedule_default` and
`_schedule_prefills`), the base of Cambricon-vLLM 0.6.2, the ODMA papers' engine.

At every iteration, while requests wait, prefills are scheduled from the head of the queue in
arrival order as long as KV space, `max_num_seqs` and the iteration's token budget
`max_num_batched_tokens` allow; the first request that does not fit stops the round (head-of-line:
FCFS admits no one past it). An iteration that schedules prefills runs only them; otherwise the
batch decodes. A request that cannot fit even when nothing runs is rejected. A preempted request
waits first in the queue.

When admission is retried (what makes it cheap when nothing can be admitted): a round stopped by
the budget alone is retried at the next boundary (vLLM schedules prefills at every step); one
stopped by space or the batch cap waits for a release, since nothing else frees either. After a
contiguous policy's failed extend preempted a request (its whole block freed), no prefill runs at
that boundary and admission is retried after one decode iteration, as vLLM skips prefills in a
step that preempted; block growth that ran out waits for a release (its blocks are gone), unless
offloaded requests wait to be swapped in.
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.sim.batch import Batch
from odmactl.sim.schedulers.base import NO_ROOM, Scheduler


class FcfsScheduler(Scheduler):
    """First come, first served, head-of-line (the module docstring). `dirty`: admission may
    succeed at this boundary; `retry`: admission is retried after the next decode iteration."""

    name = "fcfs"

    def __init__(self) -> None:
        Scheduler.__init__(self)
        self.dirty = False
        self.retry = False

    def arrive(self, i: cython.longlong) -> None:
        if not self.waiting:
            self.dirty = True
        self.waiting.append(i)

    def released(self) -> None:
        self.dirty = True

    def preempted(self) -> None:
        b: Batch = self.batch
        self.dirty = False
        self.retry = len(b.running) > 0 and (not b.block_growth or len(self.parked) > 0)

    def decoded(self) -> None:
        if self.retry:
            self.retry = False
            self.dirty = True

    def idle(self) -> cython.bint:
        """Nothing runs: a waiting head is retried at once (and rejected if it can never fit)."""
        if self.waiting:
            self.dirty = True
            return True
        return False

    def quiet(self) -> cython.bint:
        return not (self.dirty and self.waiting) and not self.parked

    def decode_limit(self) -> cython.longlong:
        return 1 if self.retry else 0

    def first_waking(self, n: cython.longlong, j: cython.longlong) -> cython.longlong:
        """An arrival can join the batch only when no one waits before it and the batch has room."""
        return j if not self.waiting and n + len(self.stalled) < self.max_num_seqs else -1

    def schedule(self) -> list:
        """Admit from the head while it fits (KV space, max_num_seqs, the token budget); returns the
        admitted, their KV reserved (or headed for the host tier), not yet prefilled (None: no
        admission was tried at this boundary)."""
        b: Batch = self.batch
        i: cython.longlong
        kv: cython.longlong
        tokens: cython.longlong = 0
        admitted: list
        if not (self.dirty and self.waiting):
            return None
        self.dirty = False
        admitted = []
        self.begin_round()
        while self.waiting and self.seats() + len(admitted) < self.max_num_seqs:
            i = self.waiting[0]
            kv = self.new_tokens(i)
            if self.over_budget(tokens, kv, len(admitted)):
                self.dirty = True  # stopped by the budget alone: retried at the next boundary
                break
            if self._take(i, tokens, len(admitted)) == NO_ROOM:
                if self.never_fits(len(admitted)):
                    b.reject(self.waiting.popleft())
                    continue
                break
            self.waiting.popleft()
            admitted.append(i)
            tokens = self.charged(tokens, kv)
        return admitted
