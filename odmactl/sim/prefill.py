"""A prefill iteration's time in integer picoseconds from its batch's two token sums: the replay's
form of `CostModel.prefill_s` (the reference, `PrefillCoefficients.seconds`).

The replay adds up each admitted prompt's tokens and squared tokens as it admits them, and the
clock turns the two sums into picoseconds with the reference's float operations in its order,
rounded as `cost.to_ps` rounds (to nearest, ties to even). Compiled (setup.py, prefill.pxd), the
operations are C doubles, IEEE like Python's floats, and setup.py turns off fused multiply-add
contraction, so both forms give the same integers (tests/test_cost.py compares them).
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.hw.cost import PrefillCoefficients


class PrefillClock:
    """PrefillCoefficients as floats, read once; `ps(total, squares)` per prefill."""

    __slots__ = ("flops_per_token", "flops_per_square", "weight_bytes", "kv_bytes_per_token", "peak_flops",
                 "seq_bw", "overhead_s", "comm_fixed_s", "comm_per_token_s")

    def __init__(self, coeff: PrefillCoefficients) -> None:
        self.flops_per_token = float(coeff.flops_per_token)
        self.flops_per_square = float(coeff.flops_per_square)
        # the reference adds and multiplies these ints with floats, which converts them exactly so
        self.weight_bytes = float(coeff.weight_bytes)
        self.kv_bytes_per_token = float(coeff.kv_bytes_per_token)
        self.peak_flops = float(coeff.peak_flops)
        self.seq_bw = float(coeff.seq_bw)
        self.overhead_s = float(coeff.overhead_s)
        self.comm_fixed_s = float(coeff.comm_fixed_s)
        self.comm_per_token_s = float(coeff.comm_per_token_s)

    def ps(self, total_tokens: cython.longlong, squared_tokens: cython.longlong) -> cython.longlong:
        """One prefill over prompts whose tokens sum to `total_tokens` and whose squared tokens sum
        to `squared_tokens`, in picoseconds: to_ps(PrefillCoefficients.seconds(total, squares))."""
        total: cython.double = float(total_tokens)
        squares: cython.double = float(squared_tokens)
        flops: cython.double = self.flops_per_token * total + self.flops_per_square * squares
        memory_bytes: cython.double = self.weight_bytes + total * self.kv_bytes_per_token
        compute_s: cython.double = flops / self.peak_flops
        memory_s: cython.double = memory_bytes / self.seq_bw
        seconds: cython.double = (memory_s if memory_s > compute_s else compute_s) + self.overhead_s  # max()
        seconds = seconds + (self.comm_fixed_s + self.comm_per_token_s * total)
        return _round_half_even(seconds * 1e12)


def _round_half_even(y: cython.double) -> cython.longlong:
    """Python's round(y) for 0 <= y < 2**63: the nearest integer, ties to the even one. For y >= 0
    int() is floor, and y - floor(y) is exact (the fraction's bits are y's own)."""
    if not 0.0 <= y < 9223372036854775808.0:  # 2**63: the replay's clock would overflow (or y is NaN)
        raise OverflowError(f"a prefill of {y} ps does not fit the replay's 64-bit clock")
    whole: cython.longlong = int(y)
    fraction: cython.double = y - whole
    if fraction > 0.5 or (fraction == 0.5 and whole % 2 == 1):
        whole += 1
    return whole
