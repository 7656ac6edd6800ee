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
fast-forwarding, growth reaches the allocator lazily: paged blocks at completion, preemption and
exhaustion, a contiguous block's token count at completion and overflow (`catch_up`); the
scheduler counts what every request holds, so decisions are those of eager growth. An
on-device replay (ondevice.py) steps and hands each decode iteration's batch to a `probe`, which
runs and times it on the device; the clock still advances by the modelled step.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from odmactl.allocator import Allocator
from odmactl.cost import CostModel, KvLayout, to_ps
from odmactl.segment import Segment

PS = 10**12


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

    def add(self, t_ps: int, reserved_bytes: int, batch: int, queue: int) -> None:
        if t_ps < self.next_ps:
            return
        self.rows.append((t_ps, reserved_bytes, batch, queue))
        if len(self.rows) >= 2 * self.points:
            self.rows = self.rows[::2]
            self.gap_ps = max(2 * self.gap_ps, (t_ps - self.rows[0][0]) // self.points)
        self.next_ps = t_ps + self.gap_ps


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
        w, alloc, paged, B = self.w, self.alloc, self.paged, self.block
        ff = self.settings.fast_forward
        num = w.size
        prompt = w.prompt_tokens.tolist()
        target = np.minimum(w.output_tokens, np.maximum(self.max_len - w.prompt_tokens, 0)).tolist()
        arrival = w.arrival_ps.tolist()
        pred = None if w.predicted_output_tokens is None else np.maximum(w.predicted_output_tokens, 1.0).tolist()
        unc = None if w.uncertainty is None else w.uncertainty.tolist()
        ids = w.request_ids
        max_seqs = self.settings.max_num_seqs
        max_prefill = self.settings.max_prefill_tokens or self.max_len
        num_blocks = alloc.num_blocks if paged else 0

        # per request
        gen = [0] * num            # tokens generated so far (as of the last boundary it ran at)
        base = [0] * num           # while running: KV tokens at decode iteration I are base + I
        seq_of = [-1] * num        # admission number while running, -1 otherwise
        allocs: list = [None] * num
        first_ps = [-1] * num
        done_ps = [-1] * num
        reserved_tokens = [0] * num
        # state
        t = 0
        it = 0                      # decode iterations so far
        queue: deque[int] = deque()
        running: dict[int, int] = {}  # request -> admission number, in admission order
        finish: list[tuple[int, int, int]] = []    # (iteration, seq, request)
        overflow: list[tuple[int, int, int]] = []
        kv_sum = 0                  # sum of KV tokens of running requests at iteration `it`
        runs_now = 0                # paged: blocks the running requests need at iteration `it`
        phase = [0] * (B or 1)      # paged: running requests by base mod B
        next_arrival = 0
        next_seq = 0
        dirty = False
        c = {"preemptions": 0, "rejections": 0, "rejected_prompt_too_long": 0, "truncated": 0,
             "recomputed_tokens": 0, "migrations": 0,
             "migrated_bytes": 0, "peak_concurrency": 0, "prefill_iterations": 0, "decode_iterations": 0,
             "occupancy_byte_ps": 0, "migration_ps": 0}
        series = _Series(self.settings.series_points)
        boundaries: list[tuple[float, list[int]]] = []
        updates_seen = -1
        completed = 0
        first_arrival_ps = arrival[0] if num else 0

        def reserved_bytes() -> int:
            return runs_now * alloc.block_bytes if paged and ff else alloc.reserved_bytes

        def leave(i: int) -> None:
            nonlocal kv_sum, runs_now
            v = base[i] + it
            kv_sum -= v
            if paged:
                runs_now -= -(-v // B)
                phase[base[i] % B] -= 1
            del running[i]
            seq_of[i] = -1

        def catch_up(i: int) -> int:
            """Tell the allocator request i's KV length now (growth inside a block, and paged blocks
            when fast-forwarding, reach it lazily); returns that length."""
            v = base[i] + it
            if allocs[i].used_tokens != v:
                alloc.extend(allocs[i], v)
            return v

        def finish_request(i: int) -> None:
            nonlocal completed, dirty
            a = allocs[i]
            catch_up(i)
            reserved_tokens[i] = a.capacity_tokens
            leave(i)
            alloc.release(a)
            allocs[i] = None
            done_ps[i] = t
            completed += 1
            dirty = True

        def preempt(i: int) -> None:
            gen[i] = base[i] + it - prompt[i]
            leave(i)
            alloc.release(allocs[i])
            allocs[i] = None
            queue.appendleft(i)
            c["preemptions"] += 1

        def push_events(i: int, seq: int) -> None:
            heapq.heappush(finish, (prompt[i] + target[i] - base[i], seq, i))
            if ff and not paged:
                cap = allocs[i].capacity_tokens
                if cap < prompt[i] + target[i]:
                    heapq.heappush(overflow, (cap - base[i], seq, i))

        def admit() -> list[int]:
            """Admit from the head while it fits; returns the admitted (not yet prefilled)."""
            admitted: list[int] = []
            tokens = 0
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

        def reject(i: int) -> None:
            c["rejections"] += 1
            done_ps[i] = -2

        def prefill(admitted: list[int]) -> None:
            nonlocal t, kv_sum, runs_now, next_seq
            kv = [prompt[i] + gen[i] for i in admitted]
            c["recomputed_tokens"] += sum(gen[i] for i in admitted)
            for i, k in zip(admitted, kv):
                a = allocs[i]
                # the first token needs room: the reservation was for the prompt. Paged takes the
                # block now; a contiguous block that already holds it is told lazily (catch_up)
                if (paged or not ff or k + 1 > a.capacity_tokens) and not alloc.extend(a, k + 1):
                    raise AssertionError(f"admission of {ids[i]} left no room for its first token")
                gen[i] += 1
                seq = next_seq
                next_seq += 1
                running[i] = seq
                seq_of[i] = seq
                base[i] = k + 1 - it
                kv_sum += k + 1
                if paged:
                    runs_now += -(-(k + 1) // B)
                    phase[base[i] % B] += 1
            dt = to_ps(self.cost.prefill_s(kv))
            t += dt
            c["occupancy_byte_ps"] += reserved_bytes() * dt
            c["prefill_iterations"] += 1
            for i in admitted:
                if first_ps[i] < 0:
                    first_ps[i] = t
                if gen[i] >= target[i]:
                    finish_request(i)
                else:
                    push_events(i, running[i])

        def grow_contiguous(i: int) -> None:
            """Request i needs one more token than its block holds: extend (migrate) or preempt it."""
            nonlocal t
            a = allocs[i]
            v = catch_up(i)
            before = alloc.migrated_bytes
            if alloc.extend(a, v + 1):
                copied = alloc.migrated_bytes - before
                c["migrations"] += 1
                c["migrated_bytes"] += copied
                dt = to_ps(self.cost.migration_s(copied))
                t += dt
                c["migration_ps"] += dt
                c["occupancy_byte_ps"] += reserved_bytes() * dt
                if a.capacity_tokens < prompt[i] + target[i]:
                    heapq.heappush(overflow, (a.capacity_tokens - base[i], running[i], i))
            else:
                preempt(i)

        def preempt_newest_until_fits(need_at: int) -> None:
            """Paged: preempt the newest running requests until the next iteration's blocks fit."""
            if ff:
                for i in running:  # hand the lazily counted blocks to the allocator first
                    catch_up(i)
            while running and need_at > num_blocks:
                newest = next(reversed(running))
                v = base[newest] + it
                need_at -= -(-(v + 1) // B)
                preempt(newest)

        total_steps = 0
        while True:
            # arrivals up to now
            while next_arrival < num and arrival[next_arrival] <= t:
                i = next_arrival
                next_arrival += 1
                if prompt[i] >= self.max_len:
                    reject(i)
                    c["rejected_prompt_too_long"] += 1  # no policy could serve it
                    continue
                if target[i] < w.output_tokens[i]:
                    c["truncated"] += 1
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
            if n > c["peak_concurrency"]:
                c["peak_concurrency"] = n
            if alloc.name == "odma" and updates_seen != alloc.boundary_updates:
                updates_seen = alloc.boundary_updates
                boundaries.append((t / PS, list(alloc.boundaries_tokens)))
            series.add(t, reserved_bytes(), n, len(queue))

            # ---- growth before the next iteration: blocks that overflow, blocks that run out
            preempted = c["preemptions"]
            if ff:
                while overflow and overflow[0][0] == it:
                    _, seq, i = heapq.heappop(overflow)
                    if seq_of[i] == seq:
                        grow_contiguous(i)
                if paged:
                    need = runs_now + phase[(-it) % B]
                    if need > num_blocks:
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
            if c["preemptions"] != preempted:
                dirty = False
                if not running:
                    continue
            n = len(running)

            # ---- decode: k iterations of a fixed batch
            if ff:
                while finish and seq_of[finish[0][2]] != finish[0][1]:
                    heapq.heappop(finish)
                while overflow and seq_of[overflow[0][2]] != overflow[0][1]:
                    heapq.heappop(overflow)
                k = finish[0][0] - it
                if overflow and overflow[0][0] - it < k:
                    k = overflow[0][0] - it
                if paged:
                    runs = [runs_now]
                    for rho in range(B):
                        runs.append(runs[-1] + phase[(-it - rho) % B])
                    seg = Segment(self.coeff, n, kv_sum, runs, True)
                    k = seg.first_over(num_blocks, k)
                else:
                    seg = Segment(self.coeff, n, kv_sum, [n, n], False)
                if not queue and next_arrival < num and n < max_seqs:
                    k = seg.iterations_until(arrival[next_arrival] - t, k)
                dt, held = seg.advance(k, paged)
                if paged:
                    c["occupancy_byte_ps"] += held * alloc.block_bytes
                    runs_now = runs[k % B] + n * (k // B)
                else:
                    c["occupancy_byte_ps"] += alloc.reserved_bytes * dt
            else:
                k = 1
                kv_now = [base[i] + it for i in running]
                dt = self.coeff.step_ps(kv_now)
                if self.probe is not None:
                    self.probe.step([allocs[i] for i in running], kv_now, dt)
                c["occupancy_byte_ps"] += alloc.reserved_bytes * dt
            t += dt
            it += k
            kv_sum += n * k
            c["decode_iterations"] += k
            while finish and finish[0][0] <= it:
                f_it, seq, i = heapq.heappop(finish)
                if seq_of[i] == seq:
                    assert f_it == it
                    finish_request(i)
            total_steps += 1
            if self.progress is not None and total_steps % 4096 == 0:
                self.progress("replay", completed, num)

        return self._result(c, series, boundaries, arrival, first_ps, done_ps, target, prompt,
                            reserved_tokens, first_arrival_ps)

    def _result(self, c: dict, series: _Series, boundaries: list, arrival: list[int], first_ps: list[int],
                done_ps: list[int], target: list[int], prompt: list[int], reserved_tokens: list[int],
                first_arrival_ps: int) -> ReplayResult:
        alloc = self.alloc
        assert not alloc.live_allocations(), "allocations outlived the replay"
        alloc.check_invariants()
        done = np.asarray(done_ps, dtype=np.int64)
        ok = done >= 0
        arrival_np = np.asarray(arrival, dtype=np.int64)
        first_np = np.asarray(first_ps, dtype=np.int64)
        out_np = np.asarray(target, dtype=np.int64)
        kv_final = (np.asarray(prompt, dtype=np.int64) + out_np)[ok]
        kv_reserved = np.asarray(reserved_tokens, dtype=np.int64)[ok]
        ttft = (first_np[ok] - arrival_np[ok]) / PS
        multi = ok & (out_np > 1)
        tpot = (done[multi] - first_np[multi]) / (out_np[multi] - 1) / PS
        last_done = int(done[ok].max()) if ok.any() else first_arrival_ps
        span_ps = max(last_done - first_arrival_ps, 1)
        generated = int(out_np[ok].sum())
        num = self.w.size

        def pct(values: np.ndarray, q: float) -> float:
            return float(np.percentile(values, q)) if values.size else 0.0

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
            "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
            "tpot_p50": pct(tpot, 50), "tpot_p99": pct(tpot, 99),
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
