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
    fit = served(ctx, "paged", {}, 1.0, 2, "round-robin-ready")  # it passes over an engine with a request waiting
    assert not fit["overloaded"] and fit["ttft_p99"] < rr["ttft_p99"] / 10


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


def _slots_context(outputs: list[int], gaps_s: list[float], slots: int, prompts: list[int] | None = None) -> ReplayContext:
    """Static at max_model_len (4,096 tokens), `slots` slots per engine, 500-token prompts unless given."""
    probe = serving(DEVICE, MODEL)
    setup = serving(DEVICE, MODEL, kv_pool_bytes=slots * 4096 * probe.bytes_per_token)
    n = len(outputs)
    w = Workload([f"r{i}" for i in range(n)], (np.cumsum([0.0] + gaps_s)[:n] * PS).astype(np.int64),
                 np.array(prompts or [500] * n, dtype=np.int64), np.array(outputs, dtype=np.int64))
    return ReplayContext(setup, w, 4096, SchedulerSettings(max_num_seqs=16))


def test_round_robin_fit_skips_an_engine_without_room_for_the_reservation():
    """Two engines of two slots: r0 (long) and r2 (long) fill engine 0, r1 (short) has left engine 1
    by r3; r4's turn is engine 0, which round-robin sends it to (it waits a long request out) and
    round-robin-ready passes over for engine 1, where a slot is free."""
    ctx = _slots_context([1500, 20, 1500, 1500, 1500], [0.1, 5.0, 1.0, 1.0], slots=2)
    rr = replayed_together(ctx, "static", {}, 2, "round-robin")
    fit = replayed_together(ctx, "static", {}, 2, "round-robin-ready")
    assert [r.metrics["requests"] for r in rr] == [3, 2] and [r.metrics["requests"] for r in fit] == [2, 3]
    assert fit[1].ttft_s.max() < 1.0 < 60.0 < rr[0].ttft_s.max()


def test_round_robin_fit_is_round_robin_where_every_engine_has_room_and_least_kv_where_none_has():
    light = _context(n=120)
    for a, b in zip(replayed_together(light, "paged", {}, 3, "round-robin"),
                    replayed_together(light, "paged", {}, 3, "round-robin-ready")):
        assert a.metrics == b.metrics and np.array_equal(a.tpot_s, b.tpot_s)
    # two one-slot engines: r2..r5 find no room anywhere and go where the least is in demand: r2's
    # 3,000-token prompt waits at engine 0, so r3, r4 and r5 (100 tokens) go to engine 1
    full = _slots_context([1500] * 6, [0.01] * 5, slots=1, prompts=[500, 500, 3000, 100, 100, 100])
    kv, fit = (replayed_together(full, "static", {}, 2, router) for router in ("least-kv", "round-robin-ready"))
    assert [r.metrics for r in kv] == [r.metrics for r in fit]
    assert [r.metrics["requests"] for r in fit] == [2, 4]
    assert [r.metrics["requests"] for r in replayed_together(full, "static", {}, 2, "round-robin")] == [3, 3]
