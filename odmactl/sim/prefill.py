"""A prefill iteration's time in integer picoseconds from its batch's token sums and prompt count:
the replay's form of `CostModel.prefill_s` (the reference, `PrefillCoefficients.seconds`).

The replay adds up each admitted prompt's tokens and squared tokens as it admits them, and the
clock turns the two sums and the prompt count into picoseconds with the reference's float
operations in its order (the GEMMs' rooflines over the efficiency table, `gemm_efficiency`, then
attention and the fixed and per-token costs), rounded as `cost.to_ps` rounds (to nearest, ties to
even). Compiled (setup.py, prefill.pxd), the operations are C doubles, IEEE like Python's floats,
and setup.py turns off fused multiply-add contraction, so both forms give the same integers
(tests/test_cost.py compares them).
"""

from __future__ import annotations

from array import array

try:  # compiled by Cython (see setup.py), the annotations below are C types; in pure Python, never evaluated
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    cython = None

from odmactl.hw.cost import PrefillCoefficients

MAX_CLOCK_PS = 9223372036854775808.0  # 2**63


class PrefillClock:
    """PrefillCoefficients as floats, read once; `ps(total, squares, prompts)` per prefill."""

    __slots__ = ("layer_bytes", "layer_flops_per_token", "head_bytes", "head_flops_per_token", "peak_bw",
                 "peak_flops", "attention_flops_per_square", "attention_efficiency", "fixed_s", "per_token_s",
                 "attention_fixed_s",
                 "tokens", "efficiency", "entries", "_tokens", "_efficiency_table")

    def __init__(self, coeff: PrefillCoefficients) -> None:
        g = coeff.gemms
        self.layer_bytes = float(g.layer_bytes)
        self.layer_flops_per_token = float(g.layer_flops_per_token)
        self.head_bytes = float(g.head_bytes)
        self.head_flops_per_token = float(g.head_flops_per_token)
        self.peak_bw = float(g.peak_bw)
        self.peak_flops = float(g.peak_flops)
        self.attention_flops_per_square = float(coeff.attention_flops_per_square)
        self.attention_efficiency = float(coeff.attention_efficiency)
        self.fixed_s = float(coeff.fixed_s)
        self.per_token_s = float(coeff.per_token_s)
        self.attention_fixed_s = float(coeff.attention_fixed_s)
        self.tokens = array("d", g.tokens)
        self.efficiency = array("d", g.efficiency)
        self._tokens = self.tokens  # compiled: typed views of the two, made once (not at every prefill)
        self._efficiency_table = self.efficiency
        self.entries = len(g.tokens)

    def _efficiency(self, m: cython.double) -> cython.double:
        """hw.profiles.gemm_efficiency, operation for operation."""
        t: cython.double[::1] = self._tokens
        e: cython.double[::1] = self._efficiency_table
        i: cython.Py_ssize_t
        if m <= t[0]:
            return e[0]
        for i in range(1, self.entries):
            if m <= t[i]:
                return e[i - 1] + (e[i] - e[i - 1]) * ((m - t[i - 1]) / (t[i] - t[i - 1]))
        return e[self.entries - 1]

    def _roofline(self, weight_bytes: cython.double, flops_per_token: cython.double,
                  m: cython.double) -> cython.double:
        """hw.cost.Gemms.roofline_s, operation for operation."""
        memory_s: cython.double = weight_bytes / self.peak_bw
        compute_s: cython.double = flops_per_token * m / self.peak_flops
        return (memory_s if memory_s > compute_s else compute_s) / self._efficiency(m)

    def ps(self, total_tokens: cython.longlong, squared_tokens: cython.longlong,
           prompts: cython.longlong) -> cython.longlong:
        """One prefill over `prompts` prompts whose tokens sum to `total_tokens` and whose squared
        tokens sum to `squared_tokens`, in picoseconds: to_ps(PrefillCoefficients.seconds(...))."""
        total: cython.double = float(total_tokens)
        squares: cython.double = float(squared_tokens)
        count: cython.double = float(prompts)
        attention_s: cython.double = self.attention_flops_per_square * squares / (
            self.peak_flops * self.attention_efficiency)
        gemms_s: cython.double = self._roofline(self.layer_bytes, self.layer_flops_per_token, total) + \
            self._roofline(self.head_bytes, self.head_flops_per_token, count)
        seconds: cython.double = gemms_s + attention_s + self.fixed_s + self.per_token_s * total
        return _round_half_even(seconds * 1e12)


    def beside_decodes_ps(self, decodes: cython.longlong, total_tokens: cython.longlong,
                          squared_tokens: cython.longlong, chunks: cython.longlong) -> cython.longlong:
        """Prompt chunks beside `decodes` decodes in one chunked step, their GEMMs with the
        decodes' (PrefillCoefficients.beside_decodes_s), in picoseconds: to_ps of it, operation for
        operation. The step takes this plus the decode step less its GEMMs."""
        total: cython.double = float(total_tokens)
        squares: cython.double = float(squared_tokens)
        attention_s: cython.double = self.attention_flops_per_square * squares / (
            self.peak_flops * self.attention_efficiency)
        gemms_s: cython.double = self._roofline(self.layer_bytes, self.layer_flops_per_token,
                                                float(decodes) + total) + \
            self._roofline(self.head_bytes, self.head_flops_per_token, float(decodes + chunks))
        seconds: cython.double = gemms_s + attention_s + self.attention_fixed_s + self.per_token_s * total
        return _round_half_even(seconds * 1e12)


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
