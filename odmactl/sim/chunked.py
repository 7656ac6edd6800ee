"""A chunked engine's token budget (vLLM v1, vllm/v1/core/sched/scheduler.py `Scheduler.schedule`):
what one step computes of the prompts.

Each step spends `max_num_batched_tokens`: the running requests first, one token each (their growth
is the engine's, sim/growth.py), then the prompts being chunked, oldest first, each taking what
its rest needs of what is left, then, unless the step preempted, the scheduler's admissions, each
chunked into what is left (the scheduler applies the budget rule, Scheduler.over_budget). An
admitted request's KV is reserved at admission for its prompt (and recomputed tokens) and its
first token, where v1 allocates block by block as chunks are computed: odmactl's choice, so that a
prompt being chunked is never preempted (the running requests are the victims) and the engine's
closed form needs no growth inside a prompt; it differs only while a long prompt is computed in a
nearly full pool.

Compiled (setup.py, chunked.pxd), Chunker is an extension type whose methods the engine calls as
C functions; the same source runs in Python.
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.core.errors import ConfigError
from odmactl.sim.batch import Batch
from odmactl.sim.growth import Growth
from odmactl.sim.prefill import PrefillClock
from odmactl.sim.schedulers.base import Scheduler
from odmactl.sim.segment import Segment
from odmactl.sim.tally import Tally


class Chunker:
    """The prompt work of a chunked replay's steps, over its batch (whose `prefilling` holds the
    prompts being chunked), scheduler, growth and tally; `budget_tokens` is the step's budget.
    After `plan`, `tokens`, `squares` and `count` describe the step's chunks for the cost model:
    their new tokens, the squares' difference sum((x + c)^2 - x^2) over chunks of c new tokens
    after x computed ones (hw/cost.py, "mixed"), and how many."""

    __slots__ = ("batch", "sched", "growth", "tally", "budget_tokens", "tokens", "squares", "count", "clock", "segment")

    def __init__(self, batch: Batch, sched: Scheduler, growth: Growth, tally: Tally, budget_tokens: int,
                 engine: str, tier, clock: PrefillClock, segment: Segment) -> None:
        """For a replay under `engine` (its name); `tier` its policy's host tier, which
        is refused: a chunked engine (v1) has no swap space, and odmactl offloads a prefill's KV
        under whole-prompt prefills only."""
        if tier is not None:  # eLLM's host buffer is the only host tier (allocator/ellm.py)
            raise ConfigError(f"a host buffer takes a prefill's KV to host memory, which odmactl replays under "
                              f"whole-prompt prefills only; {engine} has no swap space",
                              key="allocator.ellm_host_buffer_bytes",
                              hint="replay it with --engine vllm-v0, or with ellm_host_buffer_bytes = 0")
        self.batch = batch
        self.sched = sched
        self.growth = growth
        self.tally = tally
        self.budget_tokens = budget_tokens
        self.clock = clock  # the replay's prefill clock and segment (its decode GEMMs by batch size)
        self.segment = segment
        self.tokens = self.squares = self.count = 0

    def plan(self, n: cython.longlong, admit: cython.bint) -> list:
        """The step's chunks beside n decodes, as [request, new tokens, ...]: the prompts being
        chunked, then (`admit`: the step preempted no one) the scheduler's admissions, which join
        `prefilling`; empty: the step has no prompt work."""
        b: Batch = self.batch
        i: cython.longlong
        c: cython.longlong
        k: cython.longlong
        budget: cython.longlong = self.budget_tokens - n  # decodes first, one token each
        chunks: list = []
        self.tokens = self.squares = self.count = 0
        for i in b.prefilling:  # prompts being chunked, oldest first
            if budget <= 0:
                break
            c = min(b.prompt[i] + b.gen[i] - b.prefilling[i], budget)
            self._add(chunks, i, c)
            budget -= c
        if budget > 0 and admit:
            self.sched.budget = budget
            admitted = self.sched.schedule()
            if admitted:
                for i in admitted:
                    k = b.prompt[i] + b.gen[i]
                    self.tally.recomputed += b.gen[i]
                    self.growth.first_token_room(i, k)
                    b.begin_prefill(i)
                    if b.start_ps[i] < 0:
                        b.start_ps[i] = self.sched.now
                    c = min(k - b.cached[i], budget)  # a cached prefix is computed already
                    self._add(chunks, i, c)
                    budget -= c
        return chunks

    def extra_ps(self, n: cython.longlong) -> cython.longlong:
        """What the planned chunks add to a decode step of n requests, their GEMMs run with the
        decodes' (hw/cost.py, "mixed"); with no decode (n = 0), the prefill iteration they take."""
        if n == 0:
            return self.clock.ps(self.tokens, self.squares, self.count)
        return self.clock.beside_decodes_ps(n, self.tokens, self.squares, self.count) - self.segment.gemm_ps[n]

    def _add(self, chunks: list, i: cython.longlong, c: cython.longlong) -> None:
        x: cython.longlong = self.batch.prefilling[i]
        chunks.append(i)
        chunks.append(c)
        self.tokens += c
        self.squares += (x + c) * (x + c) - x * x
        self.count += 1

    def computed(self, chunks: list) -> list:
        """The step ran: each chunk's tokens are computed; returns the requests whose prompt is
        now whole (out of `prefilling`, their first token due)."""
        b: Batch = self.batch
        j: cython.longlong
        i: cython.longlong
        x: cython.longlong
        done: list = []
        for j in range(0, len(chunks), 2):
            i = chunks[j]
            x = b.prefilling[i] + chunks[j + 1]
            if x < b.prompt[i] + b.gen[i]:
                b.prefilling[i] = x
                continue
            b.end_prefill(i)
            done.append(i)
        return done
