"""Replicas replayed together on one clock behind a router (sim/cluster.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from odmactl.capacity.search import served
from odmactl.core.errors import ConfigError
from odmactl.run.replay import ReplayContext, replay_policy, replayed_together
from odmactl.run.serving import serving
from odmactl.sim.cluster import ROUTERS
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.workload import PS, Workload

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


def _context(n: int = 400, gap_s: float = 2.0, fast_forward: bool = True) -> ReplayContext:
    """Requests alternating long (1,500 output tokens) and short (20), 500-token prompts, one every
    `gap_s` seconds: round-robin over two engines sends every long request to engine 0."""
    setup = serving(DEVICE, MODEL)
    output = np.where(np.arange(n) % 2 == 0, 1500, 20).astype(np.int64)
    w = Workload([f"r{i}" for i in range(n)], (np.arange(n) * gap_s * PS).astype(np.int64),
                 np.full(n, 500, dtype=np.int64), output)
    return ReplayContext(setup, w, 4096, SchedulerSettings(max_num_seqs=16, fast_forward=fast_forward))


def test_round_robin_overloads_the_engine_that_gets_every_long_request_and_least_outstanding_does_not():
    ctx = _context()
    rr = served(ctx, "paged", {}, 1.0, 2, "round-robin")
    lo = served(ctx, "paged", {}, 1.0, 2, "least-outstanding")
    assert rr["overloaded"] and not lo["overloaded"]
    assert lo["ttft_p99"] < rr["ttft_p99"] / 10
    assert rr["completed"] == lo["completed"] == 400 and rr["generated_tokens"] == lo["generated_tokens"]
    kv = served(ctx, "paged", {}, 1.0, 2, "least-kv")
    assert not kv["overloaded"]


def test_round_robin_replayed_together_equals_each_share_replayed_apart():
    """The engines' own requests, replayed on one clock (segments cut at every arrival, the
    router polling them), give what each share gives alone: the router saw nothing it acts on."""
    ctx = _context(n=120)
    together = replayed_together(ctx, "paged", {}, 3, "round-robin")
    apart = [replay_policy(dataclasses.replace(ctx, workload=ctx.workload.replica(r, 3)), "paged", {})[0]
             for r in range(3)]
    for a, b in zip(together, apart):
        assert a.metrics == b.metrics
        assert np.array_equal(a.ttft_s, b.ttft_s) and np.array_equal(a.tpot_s, b.tpot_s)


@pytest.mark.parametrize("router", ROUTERS)
def test_every_router_serves_every_request_once_alike_in_both_modes(router):
    results = {ff: replayed_together(_context(n=160, gap_s=0.2, fast_forward=ff), "odma" if router ==
                                     "cluster-manager" else "paged", {}, 3, router) for ff in (True, False)}
    fast, slow = results[True], results[False]
    assert [r.metrics for r in fast] == [r.metrics for r in slow]
    assert sum(r.metrics["requests"] for r in fast) == 160
    assert sum(r.metrics["completed"] for r in fast) == 160


def test_an_unknown_router_is_refused():
    with pytest.raises(ConfigError, match="unknown router 'random'"):
        replayed_together(_context(n=10), "paged", {}, 2, "random")
