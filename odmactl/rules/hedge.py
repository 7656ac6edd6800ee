"""The hedge table: how many output tokens ODMA reserves for a request, looked up by its predicted
length L_hat, fitted on realized lengths so that the fewest KV tokens are reserved while at most a
given share of the requests outgrow their block.

ODMA's default rule hedges every request the same way, need = prompt + L_hat * (1 + gamma * u),
with one gamma for the whole trace. The table instead splits the requests into groups by L_hat
(quantiles of L_hat, so the groups hold about as many requests each) and gives each group its own
output reservation r_g: need = prompt + r_g. The r_g are chosen together, by a Lagrangian sweep
(`fit_hedge_tables`): for a penalty lam on each outgrown request, every group independently takes the
r that minimises its reserved tokens + lam * its outgrown requests; the sweep keeps the lam whose
choice reserves the least while outgrowing at most `limit` of all requests. So the overflow budget
goes where it saves the most reserved memory, instead of being spent evenly at one quantile level.

An outgrown request costs a block of max_model_len tokens (ODMA migrates it into the large pool),
which is what the fit counts. `odmactl plan` fits the table on the earlier part of its search part
and measures it on the later part (the table is only as good as it is out of sample); the
allocator applies it (`AllocatorConfig.hedge_edges` / `hedge_output_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PENALTIES = np.concatenate([[0.0], np.geomspace(1.0, 1e9, 400)])


@dataclass(frozen=True)
class HedgeTable:
    """Group g holds the requests with edges[g - 1] <= L_hat < edges[g] (group 0 is below
    edges[0], the last group from edges[-1] up); each reserves `output_tokens[g]` output tokens.

    Invariant (checked in __post_init__): edges strictly increasing, one more output count than
    edges, every count >= 1 (a request generates at least one token).
    """

    edges: tuple[float, ...]
    output_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.output_tokens) != len(self.edges) + 1:
            raise ValueError(f"a hedge table with {len(self.edges)} edges needs {len(self.edges) + 1} output "
                             f"counts, got {len(self.output_tokens)}")
        if list(self.edges) != sorted(set(self.edges)):
            raise ValueError(f"hedge edges must be strictly increasing, got {list(self.edges)}")
        if any(r < 1 for r in self.output_tokens):
            raise ValueError(f"hedge output counts must be >= 1 (every request generates a token), "
                             f"got {list(self.output_tokens)}")

    def outputs(self, l_hat: np.ndarray) -> np.ndarray:
        """The output tokens reserved for each request predicted at `l_hat`: its group's count."""
        return np.asarray(self.output_tokens, dtype=np.int64)[hedge_groups(self.edges, l_hat)]


def hedge_groups(edges: tuple[float, ...], l_hat: np.ndarray) -> np.ndarray:
    """The group of each L_hat: how many edges are <= it (`bisect_right`, as the allocator's
    scalar rule in rules/odma.py finds it)."""
    return np.searchsorted(np.asarray(edges, dtype=np.float64), np.asarray(l_hat, dtype=np.float64), side="right")


def group_costs(prompt: np.ndarray, output: np.ndarray, max_len: int,
                overflow_to_max: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one group of requests and every candidate output reservation r (the group's distinct
    output lengths: between two of them a larger r only costs more), exactly:
    (candidates, KV tokens reserved in all, requests outgrowing). An outgrown request's final
    reservation is one max_model_len block (`overflow_to_max`) or its own length (no cost)."""
    kv = np.minimum(prompt + output, max_len)
    outgrown_cost = np.full(kv.size, float(max_len)) if overflow_to_max else kv.astype(np.float64)
    candidates = np.unique(np.maximum(output, 1))  # a request generates a token (a prompt at max_len: none fits)
    reserved = np.empty(candidates.size)
    over = np.empty(candidates.size)
    for lo in range(0, candidates.size, 256):
        r = candidates[lo:lo + 256, None]
        need = np.minimum(prompt[None, :] + r, max_len)
        outgrown = kv[None, :] > need
        reserved[lo:lo + 256] = np.where(outgrown, outgrown_cost[None, :], need).sum(axis=1)
        over[lo:lo + 256] = outgrown.sum(axis=1)
    return candidates, reserved, over


def group_edges(l_hat: np.ndarray, groups: int) -> tuple[float, ...]:
    """Edges that split `l_hat` into at most `groups` groups at its quantiles, none of them empty."""
    values = np.sort(np.asarray(l_hat, dtype=np.float64))
    kept: list[float] = []
    low = 0  # index of the first value of the current group
    for edge in np.unique(np.quantile(values, np.linspace(0.0, 1.0, groups + 1)[1:-1])):
        at = int(np.searchsorted(values, edge, side="left"))
        if low < at < values.size:
            kept.append(float(edge))
            low = at
    return tuple(kept)


def lagrangian_pick(costs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], allowed: float) -> tuple[list[int], float]:
    """For per-group (candidates, reserved, outgrown) costs: the index each group picks under the
    penalty that reserves the least with at most `allowed` outgrown requests in all (the smallest
    candidates when none does), and the Lagrangian lower bound on that least reservation."""
    best: tuple[float, list[int]] | None = None
    dual = 0.0
    for lam in PENALTIES:
        picks = [int(np.argmin(reserved + lam * over)) for _, reserved, over in costs]
        reserved = sum(float(c[1][j]) for c, j in zip(costs, picks))
        over = sum(float(c[2][j]) for c, j in zip(costs, picks))
        dual = max(dual, reserved + lam * (over - allowed))
        if over <= allowed and (best is None or reserved < best[0]):
            best = (reserved, picks)
    if best is None:  # even the largest penalty outgrows too many: take each group's largest r
        return [c[0].size - 1 for c in costs], dual
    return best[1], dual


def fit_hedge_tables(l_hat: np.ndarray, prompt: np.ndarray, output: np.ndarray, *, max_len: int, groups: int,
                     limits: tuple[float, ...]) -> dict[float, HedgeTable]:
    """For each limit, the table over `groups` quantile groups of L_hat that reserves the fewest KV
    tokens on these requests with at most `limit` of them outgrowing their block (an outgrown one
    costing a max_model_len block); see the module docstring. The groups and their costs do not
    depend on the limit: they are computed once for all of them."""
    l_hat = np.asarray(l_hat, dtype=np.float64)
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    if l_hat.size == 0:
        raise ValueError("a hedge table needs realized lengths to fit on")
    edges = group_edges(l_hat, groups)
    group = hedge_groups(edges, l_hat)
    costs = [group_costs(prompt[group == g], output[group == g], max_len) for g in range(len(edges) + 1)]
    tables = {}
    for limit in limits:
        picks, _ = lagrangian_pick(costs, limit * l_hat.size)
        tables[limit] = HedgeTable(edges, tuple(int(c[0][j]) for c, j in zip(costs, picks)))
    return tables

