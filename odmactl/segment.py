"""The next k decode iterations of a fixed batch, summed in closed form (integer picoseconds).

Between two events every running request grows by one token per iteration, so iteration j (0-based)
reads `kv_tokens_sum + n * j` tokens and `runs[j]` runs, and with `StepCoefficients`

    step_j = max(weights + per_token * (S + n j) + per_run * runs[j], compute_per_seq * n) + overhead.

A contiguous request is one run whatever its length (period 1, runs constant); a paged request
starts a new block every `block` tokens, so along each residue class j = rho + m * block the run
count grows by exactly n per period. Along a class everything is therefore an arithmetic sequence in
m, and sums of steps, of steps times reserved blocks, and the first iteration that needs more
blocks than the pool holds all come out in O(period) integer arithmetic: the same integers that
stepping token by token adds up (`StepCoefficients.step_ps`), which is what tests/test_replay.py checks.
"""

from __future__ import annotations

from array import array

from odmactl.cost import StepCoefficients

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None


class Segment:
    """A batch of `n` requests at an iteration boundary: `kv_tokens_sum` tokens to read next and
    `runs[i]` runs at offset i (i = 0..period, `runs[i + 1]` also being the blocks held after
    iteration i). Paged: period = block size, runs grow by n per period; contiguous: period 1, runs
    constant. Invariant: runs is nondecreasing, so step times are nondecreasing in j.
    The replay keeps one Segment per run and `reset`s it at every event (the coefficients are
    read once, the per-offset buffers `m0` and `held` reused); compiled, it is an extension type
    with C fields (segment.pxd)."""

    __slots__ = ("weights_ps", "per_token_ps", "per_run_ps", "compute_per_seq_ps", "overhead_ps",
                 "period", "compute_ps", "m0", "dm", "held", "d_held")

    def __init__(self, coeff: StepCoefficients) -> None:
        """An empty batch; `reset` describes each real one."""
        self.weights_ps = coeff.weights_ps
        self.per_token_ps = coeff.per_token_ps
        self.per_run_ps = coeff.per_run_ps
        self.compute_per_seq_ps = coeff.compute_per_seq_ps
        self.overhead_ps = coeff.overhead_ps
        self.m0 = array("q")
        self.held = array("q")
        self.reset(0, 0, [0, 0], False)

    def reset(self, n: cython.longlong, kv_tokens_sum: cython.longlong, runs: list[int], paged: bool) -> Segment:
        """Describe the batch at the next boundary (see the class docstring); returns self."""
        period: cython.longlong = len(runs) - 1
        per_run: cython.longlong = self.per_run_ps
        step_tokens: cython.longlong = self.per_token_ps * n
        base: cython.longlong = self.weights_ps + self.per_token_ps * kv_tokens_sum
        growth: cython.longlong = n if paged else 0
        rho: cython.longlong
        self.period = period
        self.compute_ps = self.compute_per_seq_ps * n
        if len(self.m0) != period:  # the period is fixed for a replay: the buffers are reused
            self.m0 = array("q", bytes(8 * period))
            self.held = array("q", bytes(8 * period))
        m0: cython.longlong[:] = self.m0
        held: cython.longlong[:] = self.held
        for rho in range(period):
            m0[rho] = base + step_tokens * rho + per_run * runs[rho]
            held[rho] = runs[rho + 1]
        self.dm = step_tokens * period + per_run * growth
        self.d_held = growth
        return self

    def elapsed_ps(self, k: int) -> int:
        """Time of the next k iterations."""
        return self.advance(k, False)[0]

    def advance(self, k: int, held: bool = True) -> tuple[int, int]:
        """(time of the next k iterations, sum over them of runs held x iteration time); the second
        is the paged pool's time-weighted occupancy in blocks x ps (0 unless `held`).
        Compiled, the time terms are 64-bit: each is at most the segment's duration (nonnegative
        terms), which stays below 2**63 ps like the replay's clock; occupancy stays a Python int."""
        p: cython.longlong = self.period
        kk: cython.longlong = k
        q: cython.longlong = kk // p
        r: cython.longlong = kk % p
        c: cython.longlong = self.compute_ps
        dm: cython.longlong = self.dm
        ov: cython.longlong = self.overhead_ps
        g: cython.longlong = self.d_held
        total: cython.longlong = kk * ov
        rho: cython.longlong
        terms: cython.longlong
        m0: cython.longlong
        cut: cython.longlong
        rest: cython.longlong
        s1: cython.longlong
        m0s: cython.longlong[:] = self.m0
        helds: cython.longlong[:] = self.held
        occupancy: object = 0
        for rho in range(kk if kk < p else p):  # m < cut: compute-bound terms (memory below compute)
            terms = q + 1 if rho < r else q
            m0 = m0s[rho]
            if m0 >= c:
                cut = 0
            elif dm == 0:
                cut = terms
            else:
                cut = min(terms, -(-(c - m0) // dm))
            rest = terms - cut
            s1 = (terms * (terms - 1) - cut * (cut - 1)) // 2
            total += cut * c + m0 * rest + dm * s1
            if held:
                # (h0 + g m)(c + ov) for m < cut, (h0 + g m)(m0 + dm m + ov) after, as Python ints
                h0: object = helds[rho]
                a: object = m0 + ov
                go: object = g
                dmo: object = dm
                # sum of m^2 for cut <= m < terms; it only counts when the runs grow (g > 0)
                to: object = terms
                co: object = cut
                squares: object = ((to - 1) * to * (2 * to - 1) - (co - 1) * co * (2 * co - 1)) // 6 if g else 0
                occupancy += (c + ov) * (h0 * cut + go * (cut * (cut - 1) // 2))
                occupancy += h0 * a * rest + (h0 * dmo + go * a) * s1 + go * dmo * squares
        return total, occupancy

    def held_runs_ps(self, k: int) -> int:
        return self.advance(k)[1]

    def first_over(self, limit_runs: int, k: int) -> int:
        """The first iteration j < k during which more than `limit_runs` runs are held, else k."""
        best = k
        g = self.d_held
        p = self.period
        q, r = divmod(k, p)
        for rho in range(k if k < p else p):
            terms = q + 1 if rho < r else q
            h0 = self.held[rho]
            if h0 > limit_runs:
                m = 0
            elif g == 0:
                continue
            else:
                m = (limit_runs - h0) // g + 1
            if m < terms:
                best = min(best, rho + m * self.period)
        return best

    def iterations_until(self, deadline_ps: int, k: int) -> int:
        """The fewest iterations (1..k) whose time reaches `deadline_ps`, or k when they never do."""
        if self.elapsed_ps(k) < deadline_ps:
            return k
        lo, hi = 1, k  # elapsed(hi) >= deadline
        first = self.elapsed_ps(1)
        if first >= deadline_ps:
            return 1
        hi = min(hi, -(-deadline_ps // first))  # steps never get shorter
        while lo < hi:
            mid = (lo + hi) // 2
            if self.elapsed_ps(mid) >= deadline_ps:
                hi = mid
            else:
                lo = mid + 1
        return lo
