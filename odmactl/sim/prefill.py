"""A prefill iteration's time in integer picoseconds from its batch's token sums: the replay's form
of `CostModel.prefill_s` (the reference, `PrefillCoefficients.seconds`).

The replay adds up each admitted prompt's tokens and squared tokens as it admits them, and the
clock turns the two sums and the prompt count into picoseconds by calling the reference itself
(one Python call per prefill, so the compiled and pure forms cannot disagree), rounded as
`cost.to_ps` rounds (to nearest, ties to even), with a check that the result fits the replay's
64-bit clock.
"""

from __future__ import annotations

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.hw.cost import PrefillCoefficients

MAX_CLOCK_PS = 9223372036854775808.0  # 2**63


class PrefillClock:
    """PrefillCoefficients behind `ps(total, squares, prompts)`, one call per prefill."""

    __slots__ = ("coeff",)

    def __init__(self, coeff: PrefillCoefficients) -> None:
        self.coeff = coeff

    def ps(self, total_tokens: cython.longlong, squared_tokens: cython.longlong,
           prompts: cython.longlong) -> cython.longlong:
        """One prefill over `prompts` prompts whose tokens sum to `total_tokens` and whose squared
        tokens sum to `squared_tokens`, in picoseconds: to_ps(PrefillCoefficients.seconds(...))."""
        return _round_half_even(self.coeff.seconds(total_tokens, squared_tokens, prompts) * 1e12)


def _round_half_even(y: cython.double) -> cython.longlong:
    """Python's round(y) for 0 <= y < 2**63: the nearest integer, ties to the even one (C's round()
    takes ties away from zero). For y >= 0 int() is floor, and y - floor(y) is exact."""
    if not 0.0 <= y < MAX_CLOCK_PS:  # the replay's clock would overflow (or y is NaN)
        raise OverflowError(f"a prefill of {y} ps does not fit the replay's 64-bit clock")
    whole: cython.longlong = int(y)
    fraction: cython.double = y - whole
    if fraction > 0.5 or (fraction == 0.5 and whole % 2 == 1):
        whole += 1
    return whole
