"""The next k decode iterations of a fixed batch, summed in closed form (integer picoseconds).

Between two events every running request grows by one token per iteration, so iteration j (0-based)
reads `kv_tokens_sum + n * j` tokens and `runs[j]` runs, and with `StepCoefficients`

    step_j = batch(n) + per_token * (S + n j) + per_run * runs[j],

batch(n) being the GEMMs, the fixed and per-request costs and tensor parallelism's all-reduces
(StepCoefficients.batch_ps), constant while n is.

A contiguous request is one run whatever its length (period 1, runs constant; a policy whose requests
are a few page ranges has the loop write their count); a paged request
starts a new block every `block` tokens, so along each residue class j = rho + m * block the run
count grows by exactly n per period. Along a class everything is therefore an arithmetic sequence in
m, and sums of steps, of steps times reserved blocks, and the first iteration that needs more
blocks than the pool holds all come out in O(period) integer arithmetic: the same integers that
stepping token by token adds up (`StepCoefficients.step_ps`), which is what tests/test_replay.py checks.
"""

from __future__ import annotations

from array import array

from odmactl.hw.cost import StepCoefficients

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None


OCCUPANCY_C_LIMIT = 1 << 60  # held x step x k below this: occupancy sums fit 64 bits (see advance)
OCCUPANCY_MAX_K = 1 << 20  # and k below this, so the closed-form sum of m**2 does too


def _occupancy_c(h0: cython.longlong, g: cython.longlong, ov: cython.longlong, m0: cython.longlong,
                 dm: cython.longlong, terms: cython.longlong) -> cython.longlong:
    """Sum over m < terms of (h0 + g m) x (m0 + dm m + ov): one residue class of `Segment.advance`,
    as 64-bit integers (the caller checked the bound; every product below is at most the sum)."""
    s1: cython.longlong = terms * (terms - 1) // 2
    a: cython.longlong = m0 + ov
    out: cython.longlong = h0 * a * terms
    if s1:
        out += h0 * dm * s1 + g * a * s1
        if g:
            out += g * dm * ((terms - 1) * terms * (2 * terms - 1) // 6)
    return out


def _occupancy_py(h0, g, ov, m0, dm, terms):
    """`_occupancy_c` as Python integers, for segments whose sums may outgrow 64 bits."""
    s1 = terms * (terms - 1) // 2
    a = m0 + ov
    squares = (terms - 1) * terms * (2 * terms - 1) // 6 if g else 0  # sum of m^2 for m < terms
    return h0 * a * terms + (h0 * dm + g * a) * s1 + g * dm * squares


class Segment:
    """A batch of `n` requests at an iteration boundary: `kv_tokens_sum` tokens to read next and
    `runs[i]` runs at offset i (i = 0..period, `runs[i + 1]` also being the blocks held after
    iteration i). Paged: period = block size, runs grow by n per period; contiguous: period 1, runs
    constant (n). Invariant: runs is nondecreasing, so step times are nondecreasing in j.
    The replay keeps one Segment per run: at every event it writes the run counts into the int64
    buffer `runs` and calls `reset` (the coefficients are read once, the buffers reused, no
    Python integers made); compiled, it is an extension type with C fields (segment.pxd)."""

    __slots__ = ("gemm_ps", "fixed_ps", "per_seq_ps", "per_token_ps", "per_run_ps", "batch_ps",
                 "period", "block_growth", "read_per_request", "runs", "_runs", "m0", "dm", "held", "d_held")

    def __init__(self, coeff: StepCoefficients, growth_block=0) -> None:
        """An empty batch of the layout `coeff` describes; fill `runs` and `reset` to describe each
        real one. Memory grows in blocks of `growth_block` tokens (0: the layout's block; None:
        contiguous growth), the period; runs are read per block when the layout has blocks, else
        one per request (`read_per_request`: eLLM's chunks grow a request that is read as one run),
        or as many as the caller writes into `runs` for contiguous growth."""
        self.gemm_ps = array("q", coeff.gemm_ps)  # by batch size, 0..max_num_seqs
        self.fixed_ps = coeff.fixed_ps
        self.per_seq_ps = coeff.per_seq_ps
        self.per_token_ps = coeff.per_token_ps
        self.per_run_ps = coeff.per_run_ps
        block = coeff.block_tokens if growth_block == 0 else growth_block
        self.block_growth = block is not None
        self.read_per_request = self.block_growth and coeff.block_tokens is None
        self.period = block if self.block_growth else 1
        self.runs = array("q", bytes(8 * (self.period + 1)))  # the caller's input, read by reset
        self._runs = self.runs
        self.m0 = array("q", bytes(8 * self.period))
        self.held = array("q", bytes(8 * self.period))
        self.reset(0, 0)

    def reset(self, n: cython.longlong, kv_tokens_sum: cython.longlong) -> Segment:
        """Describe the batch at the next boundary from `n`, `kv_tokens_sum` and the run counts
        the caller wrote into `runs` (see the class docstring); returns self."""
        period: cython.longlong = self.period
        per_run: cython.longlong = self.per_run_ps
        step_tokens: cython.longlong = self.per_token_ps * n
        base: cython.longlong = self.per_token_ps * kv_tokens_sum
        gemm: cython.longlong[::1] = self.gemm_ps
        growth: cython.longlong = n if self.block_growth else 0
        read_growth: cython.longlong = 0 if self.read_per_request else growth
        per_request: cython.bint = self.read_per_request
        rho: cython.longlong
        runs: cython.longlong[::1] = self._runs
        m0: cython.longlong[::1] = self.m0
        held: cython.longlong[::1] = self.held
        self.batch_ps = gemm[n] + self.fixed_ps + self.per_seq_ps * n
        for rho in range(period):
            m0[rho] = base + step_tokens * rho + per_run * (n if per_request else runs[rho])
            held[rho] = runs[rho + 1]
        self.dm = step_tokens * period + per_run * read_growth
        self.d_held = growth
        return self

    def elapsed_ps(self, k: cython.longlong) -> cython.longlong:
        """Time of the next k iterations: along residue class rho, `terms` steps of
        m0[rho] + dm * m + batch_ps (m < terms)."""
        p: cython.longlong = self.period
        q: cython.longlong = k // p
        r: cython.longlong = k % p
        dm: cython.longlong = self.dm
        total: cython.longlong = k * self.batch_ps
        rho: cython.longlong
        terms: cython.longlong
        m0s: cython.longlong[::1] = self.m0
        for rho in range(k if k < p else p):
            terms = q + 1 if rho < r else q
            total += m0s[rho] * terms + dm * (terms * (terms - 1) // 2)
        return total

    def advance(self, k: cython.longlong, held: cython.bint = True) -> tuple:
        """(time of the next k iterations (`elapsed_ps`), sum over them of runs held x iteration
        time); the second is the paged pool's time-weighted occupancy in blocks x ps (0 unless
        `held`). Compiled, the time terms are 64-bit: each is at most the segment's duration
        (nonnegative terms), which stays below 2**63 ps like the replay's clock. Every occupancy
        term is a partial sum of held x step over the k iterations, so when held(last) x
        step(last) x k (both nondecreasing) stays below OCCUPANCY_C_LIMIT they are summed as
        64-bit integers too; a larger segment sums them as Python integers (the same integers
        either way)."""
        p: cython.longlong = self.period
        q: cython.longlong = k // p
        r: cython.longlong = k % p
        dm: cython.longlong = self.dm
        ov: cython.longlong = self.batch_ps
        g: cython.longlong = self.d_held
        rho: cython.longlong
        terms: cython.longlong
        m0s: cython.longlong[::1] = self.m0
        helds: cython.longlong[::1] = self.held
        small: cython.bint
        h_last: cython.longlong
        step_last: cython.longlong
        occupancy: object = 0
        occ: cython.longlong = 0
        if not held or k <= 0:
            return self.elapsed_ps(k), 0
        h_last = helds[(k - 1) % p] + g * ((k - 1) // p)
        step_last = m0s[(k - 1) % p] + dm * ((k - 1) // p) + ov
        small = k < OCCUPANCY_MAX_K and h_last <= OCCUPANCY_C_LIMIT // max(step_last, 1) // k
        for rho in range(k if k < p else p):
            terms = q + 1 if rho < r else q
            if small:
                occ += _occupancy_c(helds[rho], g, ov, m0s[rho], dm, terms)
            else:
                occupancy += _occupancy_py(helds[rho], g, ov, m0s[rho], dm, terms)
        return self.elapsed_ps(k), (occ if small else occupancy)

    def held_runs_ps(self, k: int) -> int:
        return self.advance(k)[1]

    def first_over(self, limit_runs: cython.longlong, k: cython.longlong) -> cython.longlong:
        """The first iteration j < k during which more than `limit_runs` runs are held, else k."""
        best: cython.longlong = k
        g: cython.longlong = self.d_held
        p: cython.longlong = self.period
        q: cython.longlong = k // p
        r: cython.longlong = k % p
        rho: cython.longlong
        terms: cython.longlong
        h0: cython.longlong
        m: cython.longlong
        helds: cython.longlong[::1] = self.held
        for rho in range(k if k < p else p):
            terms = q + 1 if rho < r else q
            h0 = helds[rho]
            if h0 > limit_runs:
                m = 0
            elif g == 0:
                continue
            else:
                m = (limit_runs - h0) // g + 1
            if m < terms and rho + m * p < best:
                best = rho + m * p
        return best

    def iterations_until(self, deadline_ps: cython.longlong, k: cython.longlong) -> cython.longlong:
        """The fewest iterations (1..k) whose time reaches `deadline_ps`, or k when they never do."""
        lo: cython.longlong
        hi: cython.longlong
        mid: cython.longlong
        first: cython.longlong
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
