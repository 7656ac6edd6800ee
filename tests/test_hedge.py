"""Hedge tables (odmactl/rules/hedge.py): the fit keeps within its limit and spends the overflow budget
where it saves the most, the allocator applies the table, and plan's bounds for a hedge candidate
agree with a replay of it."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from odmactl.allocator import AllocatorConfig, make_allocator
from odmactl.core.errors import ConfigError
from odmactl.rules.hedge import HedgeTable, fit_hedge_tables, group_costs, group_edges, lagrangian_pick

MAX_LEN = 4096


def _exact_least_reserved(costs, allowed):
    """Brute force over every combination of per-group candidates."""
    best = math.inf
    for picks in itertools.product(*(range(c[0].size) for c in costs)):
        over = sum(c[2][j] for c, j in zip(costs, picks))
        if over <= allowed:
            best = min(best, sum(c[1][j] for c, j in zip(costs, picks)))
    return best


def test_fit_keeps_the_limit_and_is_near_the_exact_optimum():
    rng = np.random.default_rng(3)
    n = 60
    l_hat = rng.integers(10, 400, n).astype(float)
    prompt = rng.integers(1, 200, n)
    output = np.maximum(1, (l_hat * rng.lognormal(0, 0.6, n)).astype(np.int64))
    for groups, limit in ((3, 0.05), (2, 0.02), (3, 0.0)):
        table = fit_hedge_tables(l_hat, prompt, output, max_len=MAX_LEN, groups=groups, limits=(limit,))[limit]
        need = np.minimum(prompt + table.outputs(l_hat), MAX_LEN)
        kv = np.minimum(prompt + output, MAX_LEN)
        outgrown = kv > need
        assert outgrown.sum() <= limit * n
        reserved = np.where(outgrown, MAX_LEN, need).sum()
        edges = np.asarray(group_edges(l_hat, groups))
        group = np.searchsorted(edges, l_hat, side="right")
        costs = [group_costs(prompt[group == g], output[group == g], MAX_LEN) for g in range(edges.size + 1)]
        exact = _exact_least_reserved(costs, limit * n)
        _, dual = lagrangian_pick(costs, limit * n)
        assert dual <= exact + 1e-6 <= reserved + 1e-6
        assert reserved <= exact * 1.05  # the Lagrangian pick is close to the exact optimum here


def test_the_budget_goes_where_it_saves_the_most():
    # group 0: 99 requests of 100 output tokens and one of 3,000; group 1: 100 requests spread 100..1,090.
    # One outgrown request is allowed: covering group 0's outlier would cost 99 * 2,900 tokens,
    # letting it outgrow costs one max_len block; group 1 must cover its own tail.
    l_hat = np.r_[np.full(100, 50.0), np.full(100, 500.0)]
    prompt = np.full(200, 10)
    output = np.r_[np.full(99, 100), [3000], np.arange(100, 1100, 10)]
    table = fit_hedge_tables(l_hat, prompt, output, max_len=MAX_LEN, groups=2, limits=(0.005,))[0.005]
    assert len(table.edges) == 1 and 50 < table.edges[0] <= 500
    assert tuple(table.outputs(np.array([50.0, 500.0])).tolist()) == (100, 1090)


def test_group_edges_leave_no_group_empty():
    l_hat = np.r_[np.full(50, 7.0), np.arange(8.0, 18.0)]
    edges = group_edges(l_hat, 8)
    group = np.searchsorted(np.asarray(edges), l_hat, side="right")
    assert np.bincount(group).min() >= 1 and len(edges) + 1 == np.unique(group).size
    assert group_edges(np.full(10, 3.0), 4) == ()


def test_table_invariants():
    with pytest.raises(ValueError, match="needs 2 output counts"):
        HedgeTable((5.0,), (1,))
    with pytest.raises(ValueError, match="strictly increasing"):
        HedgeTable((5.0, 5.0), (1, 2, 3))
    with pytest.raises(ValueError, match=">= 1"):
        HedgeTable((), (0,))
    t = HedgeTable((10.0, 20.0), (5, 50, 500))
    assert t.outputs(np.array([9.9, 10.0, 19.0, 20.0, 1e6])).tolist() == [5, 50, 50, 500, 500]
    assert t.outputs(np.array([9.9, 10.0, 20.0])).tolist() == [5, 50, 500]


def test_odma_reserves_by_the_table_and_tau_still_routes():
    cfg = {"max_model_len_tokens": 2048, "boundaries_tokens": [256, 512, 1024, 2048], "gamma": 5.0, "tau": 0.8,
           "refit": False, "hedge_edges": [100.0], "hedge_output_tokens": [50, 600]}
    alloc = make_allocator("odma", 1 << 22, 16, cfg)
    assert alloc.need_tokens(100, 99, 0.5) == 150 and alloc.need_tokens(100, 100, 0.0) == 700
    assert alloc.reserve("a", 100, 99, 0.5).capacity_tokens == 256   # gamma would have given 100 + 347
    assert alloc.reserve("b", 100, 100, 0.0).capacity_tokens == 1024
    assert alloc.reserve("c", 100, 10, 0.9).region == "large"        # u > tau
    assert alloc.reserve("d", 100, None, 0.0).region == "large"      # no prediction
    assert alloc.reserve("e", 100, 5000, None).capacity_tokens == 1024


def test_hedge_config_errors_name_the_key():
    for table, key in (({"hedge_edges": [1.0], "hedge_output_tokens": [1]}, "hedge_output_tokens"),
                       ({"hedge_edges": [2.0, 1.0], "hedge_output_tokens": [1, 2, 3]}, "hedge_edges"),
                       ({"hedge_edges": [], "hedge_output_tokens": [-4]}, "hedge_output_tokens")):
        with pytest.raises(ConfigError, match=f"key '{key}'"):
            AllocatorConfig.from_mapping(table, "c.toml")
    config = AllocatorConfig.from_mapping({"hedge_edges": [1.5], "hedge_output_tokens": [3, 9]})
    assert config.to_mapping()["hedge_output_tokens"] == [3, 9]
    assert "hedge_edges" not in AllocatorConfig().to_mapping()  # no table: nothing written


def test_plan_bounds_for_a_hedge_candidate_agree_with_its_replay(conv_sample_head):
    """A hedge candidate fitted on the first part and replayed on the rest: with a pool far larger
    than the load, the replay's migrations are the bounds' overflows, and the utilizations agree."""
    import polars as pl

    from odmactl.plan.bounds import estimate
    from odmactl.plan.grid import Candidate, fit_hedges, with_hedge
    from odmactl.run.executors import replay_candidate
    from odmactl.run.replay import ReplayContext
    from odmactl.run.serving import serving
    from odmactl.run.spec import LoadOptions
    from odmactl.run.workload import build_workload
    from odmactl.sim.settings import SchedulerSettings

    w, frame, _ = build_workload(pl.read_parquet(conv_sample_head(1200)), LoadOptions(), "oracle")
    rng = np.random.default_rng(0)  # a noisy predictor: oracle lengths times lognormal noise
    w = dataclasses.replace(w, predicted_output_tokens=w.output_tokens * rng.lognormal(0, 0.5, w.size),
                            uncertainty=np.zeros(w.size))
    setup = serving("a100-80gb-sxm", "DeepSeek-R1-Distill-Qwen-7B", "fp16", None)
    max_len, fit_rows = 8192, 800
    c = Candidate(64, "tail", 0.0, math.inf, 0.3, 2000, 200, 16, 0.01)
    hedges = fit_hedges(w.take(0, fit_rows), max_len, [c])
    later = w.take(fit_rows, w.size)
    est = estimate([c], later, max_len, setup.pool_bytes // setup.bytes_per_token, hedges=hedges)[0]
    ctx = ReplayContext(setup, later, max_len, SchedulerSettings())
    m = replay_candidate(ctx, with_hedge(c, hedges))
    assert m["preemptions"] == 0 and m["rejections"] == 0
    assert est["overflow_rate"] > 0 and abs(est["overflow_rate"] - m["migration_rate"]) <= 2 / (w.size - fit_rows)
    assert abs(est["kv_utilization"] - m["kv_utilization"]) < 0.03


def test_the_rules_ceiling_is_math_ceil_compiled_or_not():
    """rules/odma.ceil_tokens rounds up in C when compiled (its .pxd): the same integers as
    math.ceil, and an error rather than a wrapped integer past its range."""
    import math
    import random

    from odmactl.rules.odma import ceil_tokens

    limit = 2.0 ** 62  # rules/odma.CEIL_LIMIT (a C double when compiled, not importable then)

    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, 1.5, -1.5, 2.0 - 1e-12, 442.0000001, 1e15 + 0.5, -3.0, 4096.999999]
    values += [rng.uniform(-1e6, 1e6) for _ in range(2000)] + [float(rng.randint(-10**9, 10**9)) for _ in range(200)]
    for x in values:
        assert ceil_tokens(x) == math.ceil(x), x
    for bad in (float("inf"), float("-inf"), float("nan"), limit, -limit * 2):
        with pytest.raises(OverflowError):
            ceil_tokens(bad)
