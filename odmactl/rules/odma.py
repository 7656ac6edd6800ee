"""ODMA's reservation rule: the KV tokens a request needs and the block it gets. The allocator
(`allocator/odma.py`, per request), plan's cheap bounds and the predictor's evaluation (whole
arrays, `reserved_kv_tokens`) all apply this one rule.

need = prompt + ceil(L_hat * (1 + gamma * u)) (ODMA's inflation; no u: none), or with a hedge
table (rules/hedge.py) prompt + the output reservation of L_hat's group (`HedgeTable`: the group
is bisect_right of L_hat over the edges); never below the prompt.
A request whose u exceeds tau, or whose need exceeds the last bucket boundary, goes to the large
pool; any other gets the smallest boundary >= need. A large-pool block holds what the request can
still need (`large_slot_tokens`): its prompt + its output cap (vLLM's max_tokens) when outputs are
capped, at most max_model_len; without a cap, max_model_len.

Compiled with the allocator (setup.py, odma.pxd): the allocator calls `need_tokens` as a C function.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from odmactl.rules.hedge import HedgeTable


def large_slot_tokens(prompt_tokens, max_new_tokens, max_tokens):
    """The KV tokens of a request's large-pool block (the module docstring): prompt + the output cap
    `max_new_tokens` (0 or None: no cap), at most `max_tokens` (max_model_len)."""
    if max_new_tokens:
        slot = prompt_tokens + max_new_tokens
        return slot if slot < max_tokens else max_tokens
    return max_tokens


CEIL_LIMIT = 2.0 ** 62  # ceil_tokens' range: far past any token count, within a C integer


def ceil_tokens(x):
    """math.ceil of a float of magnitude below CEIL_LIMIT, as C arithmetic when compiled
    (odma.pxd): its whole part, one more when it has a fraction."""
    if not -CEIL_LIMIT < x < CEIL_LIMIT:  # also NaN
        raise OverflowError(f"cannot round {x!r} up to a token count")
    whole = int(x)
    return whole + 1 if x > whole else whole


def need_tokens(prompt_tokens, predicted_output_tokens, uncertainty, gamma, hedge_edges, hedge_output_tokens):
    """One request's need in KV tokens (see the module docstring); `hedge_output_tokens` None
    means the gamma rule."""
    if hedge_output_tokens is not None:
        need = prompt_tokens + hedge_output_tokens[bisect_right(hedge_edges, predicted_output_tokens)]
    elif uncertainty is None:
        need = prompt_tokens + ceil_tokens(predicted_output_tokens)
    else:
        u = uncertainty  # a C double when compiled (odma.pxd); the argument itself may be None
        need = prompt_tokens + ceil_tokens(predicted_output_tokens * (1.0 + gamma * u))
    return need if need >= prompt_tokens else prompt_tokens


def need_tokens_array(prompt_tokens: np.ndarray, predicted_output_tokens: np.ndarray, uncertainty: np.ndarray,
                      gamma: float, hedge: HedgeTable | None = None) -> np.ndarray:
    """`need_tokens` of every request, vectorised (int64); `hedge` None means the gamma rule."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    l_hat = np.asarray(predicted_output_tokens, dtype=np.float64)
    if hedge is not None:
        need = prompt + hedge.outputs(l_hat)
    else:
        u = np.asarray(uncertainty, dtype=np.float64)
        need = prompt + np.ceil(l_hat * (1.0 + gamma * u)).astype(np.int64)
    return np.maximum(need, prompt)


def reserved_kv_tokens(prompt_tokens: np.ndarray, predicted_output_tokens: np.ndarray, uncertainty: np.ndarray,
                       boundaries_tokens: tuple[int, ...], *, gamma: float, tau: float,
                       max_tokens: int, max_new_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What the `odma` allocator reserves for each request with these boundaries (the gamma rule),
    outputs capped at `max_new_tokens` (None: uncapped): (reserved KV tokens, routed-to-large mask)."""
    u = np.asarray(uncertainty, dtype=np.float64)
    need = need_tokens_array(prompt_tokens, predicted_output_tokens, u, gamma)
    bounds = np.asarray(boundaries_tokens, dtype=np.int64)
    large = (u > tau) | (need > bounds[-1])
    slot = np.minimum(np.searchsorted(bounds, need, side="left"), bounds.size - 1)
    return np.where(large, large_slots(prompt_tokens, max_new_tokens, max_tokens), bounds[slot]), large


def large_slots(prompt_tokens: np.ndarray, max_new_tokens: int | None, max_tokens: int) -> np.ndarray:
    """`large_slot_tokens` of every request, vectorised (int64)."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    if max_new_tokens:
        return np.minimum(prompt + max_new_tokens, max_tokens)
    return np.full(prompt.shape, max_tokens, dtype=np.int64)


def equal_width_boundaries(max_tokens: int, num_buckets: int, granularity_tokens: int) -> tuple[int, ...]:
    """B equal-width upper bounds over [1, max_tokens], rounded up to the granularity: the start
    point before a refit has seen realized lengths."""
    raw = (-(-max_tokens * (i + 1) // num_buckets) for i in range(num_buckets))
    return tuple(sorted({min(-(-b // granularity_tokens) * granularity_tokens, max_tokens) for b in raw}))
