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

from odmactl.cost import StepCoefficients


class Segment:
    """A batch of `n` requests at an iteration boundary: `kv_tokens_sum` tokens to read next and
    `runs[i]` runs at offset i (i = 0..period, `runs[i + 1]` also being the blocks held after
    iteration i). Paged: period = block size, runs grow by n per period; contiguous: period 1, runs
    constant. Invariant: runs is nondecreasing, so step times are nondecreasing in j."""

    __slots__ = ("period", "n", "growth", "compute_ps", "overhead_ps", "m0", "dm", "held", "d_held")

    def __init__(self, coeff: StepCoefficients, n: int, kv_tokens_sum: int, runs: list[int], paged: bool) -> None:
        self.period = period = len(runs) - 1
        self.n = n
        self.growth = n if paged else 0
        self.compute_ps = coeff.compute_per_seq_ps * n
        self.overhead_ps = coeff.overhead_ps
        base = coeff.weights_ps + coeff.per_token_ps * kv_tokens_sum
        step_tokens = coeff.per_token_ps * n
        self.m0 = [base + step_tokens * rho + coeff.per_run_ps * runs[rho] for rho in range(period)]
        self.dm = step_tokens * period + coeff.per_run_ps * self.growth
        self.held = runs[1:]
        self.d_held = self.growth

    def elapsed_ps(self, k: int) -> int:
        """Time of the next k iterations."""
        return self.advance(k, False)[0]

    def advance(self, k: int, held: bool = True) -> tuple[int, int]:
        """(time of the next k iterations, sum over them of runs held x iteration time); the second
        is the paged pool's time-weighted occupancy in blocks x ps (0 unless `held`)."""
        p = self.period
        q, r = divmod(k, p)
        c, dm, ov, g = self.compute_ps, self.dm, self.overhead_ps, self.d_held
        m0s, helds = self.m0, self.held
        total = k * ov
        occupancy = 0
        for rho in range(k if k < p else p):  # m < cut: compute-bound terms (memory below compute)
            terms = q + 1 if rho < r else q
            m0 = m0s[rho]
            if m0 >= c:
                cut = 0
            elif dm == 0:
                cut = terms
            else:
                cut = min(terms, -(-(c - m0) // dm))
            rest, s1 = terms - cut, (terms * (terms - 1) - cut * (cut - 1)) // 2
            total += cut * c + m0 * rest + dm * s1
            if held:
                # (h0 + g m)(c + ov) for m < cut, (h0 + g m)(m0 + dm m + ov) after
                h0 = helds[rho]
                a = m0 + ov
                # sum of m^2 for cut <= m < terms; it only counts when the runs grow (g > 0)
                squares = ((terms - 1) * terms * (2 * terms - 1) - (cut - 1) * cut * (2 * cut - 1)) // 6 if g else 0
                occupancy += (c + ov) * (h0 * cut + g * (cut * (cut - 1) // 2))
                occupancy += h0 * a * rest + (h0 * dm + g * a) * s1 + g * dm * squares
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
