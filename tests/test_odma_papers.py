"""ODMA as its papers describe it (seeds/000, seeds/001), checked by hand on small cases: the tail
past the top quantile goes to the large bucket, a large block holds prompt + the output cap, a
full large pool stalls an overflow in place instead of preempting it, a preempted request comes
back at its large block, the papers' u is the normalised entropy of the classification head, and
the Task Pool admits past a head that cannot fit (no head-of-line blocking) within its aging bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from odmactl.allocator import AllocatorConfig, make_allocator
from odmactl.allocator.odma import LARGE, OdmaAllocator
from odmactl.core.errors import ConfigError
from odmactl.hw.cost import CostModel
from odmactl.hw.profiles import load_device, load_model
from odmactl.predict.predictor import normalised_entropy
from odmactl.run.replay import deployment_of
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.workload import PS, Workload

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"
MAX_LEN = 8192


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel(load_device(DEVICE), load_model(MODEL))


def _bpt(cost: CostModel) -> int:
    return cost.model.kv_bytes_per_token * cost.tp


def _odma(cost, pool_tokens: int, config: dict, max_new_tokens: int = 0):
    bpt = _bpt(cost)
    return make_allocator("odma", pool_tokens * bpt, bpt, {"max_model_len_tokens": MAX_LEN, **config},
                          deployment=deployment_of(cost, max_new_tokens=max_new_tokens))


def _workload(prompt, output, pred, unc, arrival_s):
    n = len(prompt)
    return Workload([f"r{i}" for i in range(n)], np.round(np.asarray(arrival_s, dtype=np.float64) * PS).astype(np.int64),
                    np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64),
                    np.asarray(pred, dtype=np.float64), np.asarray(unc, dtype=np.float64))


def _replay(w, alloc, cost, **settings):
    replay = Replay(w, alloc, cost, MAX_LEN, SchedulerSettings(**settings))
    return replay, replay.run()


# -- the tail past the top quantile, and the large block ----------------------------------------------


def test_a_top_quantile_below_1_routes_the_tail_to_the_large_bucket(cost):
    """Boundaries at 0.9 * i/4 of KV lengths 1..1000 (granule 16): the last is Q_0.9 = 900 -> 912;
    a request needing more goes to the large pool, in a block of prompt + the cap."""
    realized = np.arange(1, 1001)
    config, _ = OdmaAllocator.complete_config(
        AllocatorConfig(max_model_len_tokens=MAX_LEN, top_quantile=0.9),
        pool_bytes=1 << 30, bytes_per_token=_bpt(cost), realized_kv_tokens=realized,
        deployment=deployment_of(cost, max_new_tokens=442))
    levels = [0.225, 0.45, 0.675, 0.9]
    expected = [int(-(-q // 16) * 16) for q in np.quantile(realized, levels, method="higher")]
    assert list(config.boundaries_tokens) == expected and expected[-1] == 912
    alloc = _odma(cost, 60_000, {"boundaries_tokens": expected, "large_pool_bytes": 5_000 * _bpt(cost)}, 442)
    tail = alloc.reserve("tail", 100, 850, 0.0)  # needs 950 > 912
    assert (tail.region, tail.bucket, tail.capacity_tokens) == (LARGE, LARGE, 100 + 442)
    body = alloc.reserve("body", 100, 300, 0.0)  # needs 400: the smallest boundary above it
    assert body.region == "main" and body.capacity_tokens == min(b for b in expected if b >= 400)
    # a block never holds more than the request can reach: a 5-token prompt capped at 442 needs at most 447
    small = alloc.reserve("small", 5, 440, 0.0)
    assert small.capacity_tokens == 447 and small.limit_tokens == 447
    with pytest.raises(ConfigError, match="top_quantile"):
        _odma(cost, 60_000, {"top_quantile": 1.5})
    alloc.check_invariants()


# -- stall in place, not preempt -----------------------------------------------------------------------


def _underpredicted(n: int = 12):
    """n requests at once whose outputs are 4x their predictions: every one outgrows its bucket."""
    prompt = [100] * n
    output = [400] * n
    return _workload(prompt, output, [100] * n, [0.0] * n, [0.0] * n)


@pytest.mark.parametrize("scheduler", ["fcfs", "task_pool"])
def test_a_full_large_pool_stalls_an_overflow_without_preempting(cost, scheduler):
    """A large pool of two slots (prompt + cap = 600 tokens each) and 12 requests that outgrow their
    200-token buckets: at most two run in the large pool at once, the others stall in place and move
    when a slot frees. Nothing is preempted or recomputed, every request completes, and the closed
    form agrees with stepping."""
    runs = []
    for ff in (True, False):
        alloc = _odma(cost, 5_000, {"boundaries_tokens": [208], "refit": False, "large_pool_bytes": 1_200 * _bpt(cost)},
                      max_new_tokens=500)
        replay, result = _replay(_underpredicted(), alloc, cost, policy=scheduler, fast_forward=ff, max_new_tokens=500)
        m = result.metrics
        assert m["stalls"] > 0 and m["preemptions"] == 0 and m["recomputed_tokens"] == 0
        assert m["completed"] == 12 and m["migrations"] == 12
        assert (replay.batch.timeline().reserved_tokens == 600).all()  # each ended in its large block
        alloc.check_invariants()
        runs.append(m)
    assert runs[0] == runs[1]


def test_a_preempted_request_is_readmitted_at_its_large_block(cost):
    """No large pool at all (0 bytes): an overflow cannot wait for one, so it is preempted; it comes
    back in a block of prompt + the cap (in the main pool, the large one holding nothing), not at
    max(L_hat - generated, 1), and never overflows again."""
    w = _workload([100], [400], [100], [0.0], [0.0])
    alloc = _odma(cost, 5_000, {"boundaries_tokens": [208], "refit": False, "large_pool_bytes": 0}, max_new_tokens=500)
    replay, result = _replay(w, alloc, cost, max_new_tokens=500)
    m = result.metrics
    assert m["preemptions"] == 1 and m["stalls"] == 0 and m["completed"] == 1
    assert m["recomputed_tokens"] == 208 - 100  # the tokens it had generated when its bucket ran out
    assert replay.batch.timeline().reserved_tokens[0] == 100 + 108 + 500  # its KV at re-admission + the cap
    assert alloc.stats().failed_extends == 1  # one overflow, not a storm


# -- the papers' u -------------------------------------------------------------------------------------


def test_u_is_the_normalised_entropy_of_the_class_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0], [50.0, 0.0, 0.0]])
    got = normalised_entropy(logits)
    p = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    hand = -(p * np.log(p)).sum() / math.log(3)
    assert got[0] == pytest.approx(hand, rel=1e-12) and 0 < got[0] < 1
    assert got[1] == pytest.approx(1.0) and got[2] == pytest.approx(0.0, abs=1e-12)
    assert ((got >= 0) & (got <= 1)).all()


# -- the Task Pool: no head-of-line blocking, aging ----------------------------------------------------


def _hol_case():
    """r0 holds the only large block for a long time; r1 (u = 0.9 > tau) waits for it; r2..r9 (100
    prompt + 100 output tokens) arrive just after with room in the main pool."""
    n = 10
    prompt = [100] * n
    output = [3000, 200] + [100] * 8
    unc = [0.9, 0.9] + [0.0] * 8
    arrival = [0.0, 0.01] + [0.02 + 0.001 * k for k in range(8)]
    return _workload(prompt, output, output, unc, arrival)


def _hol_alloc(cost):
    bpt = _bpt(cost)
    return _odma(cost, 60_000, {"boundaries_tokens": [256, 1024], "refit": False, "large_pool_bytes": MAX_LEN * bpt})


def test_the_task_pool_admits_past_a_head_that_cannot_fit(cost):
    """FCFS: r2..r9 wait behind r1 until r0 ends (head-of-line). The task pool: they start within
    one iteration of their arrival, and r1 starts as soon as r0 frees the large block."""
    w = _hol_case()
    starts = {}
    for scheduler in ("fcfs", "task_pool"):
        replay, result = _replay(w, _hol_alloc(cost), cost, policy=scheduler)
        assert result.metrics["completed"] == 10
        tl = replay.batch.timeline()
        starts[scheduler] = (tl.start_ps - tl.arrival_ps) / PS, tl.done_ps / PS
    fcfs_wait, fcfs_done = starts["fcfs"]
    pool_wait, pool_done = starts["task_pool"]
    iteration_s = 0.5  # far more than one decode or prefill iteration of this batch on an MLU370-X4
    assert (fcfs_wait[2:] > fcfs_done[0] - 0.1).all()  # blocked until r0 completed
    assert (pool_wait[2:] < iteration_s).all()
    r1_start = (starts["task_pool"][0][1] * PS + w.arrival_ps[1]) / PS
    assert fcfs_done[0] <= r1_start <= pool_done[0] + iteration_s


def test_aging_bounds_how_long_a_request_that_cannot_fit_waits(cost):
    """A stream of small requests keeps the main pool busy; r_big (a 3,000-token bucket) never fits
    while they keep coming. Without aging (a bound of a year) it waits for the stream to end; with
    a bound of 1 s, no request arriving later than 1 s after it starts before it does."""
    n_small = 400
    prompt = [100] + [100] * n_small
    output = [2500] + [300] * n_small
    arrival = [0.5] + [0.01 * k for k in range(n_small)]
    order = np.argsort(arrival, kind="stable")
    w = _workload(np.asarray(prompt)[order], np.asarray(output)[order], np.asarray(output)[order],
                  np.zeros(n_small + 1), np.asarray(arrival)[order])
    big = int(np.flatnonzero(order == 0)[0])
    waits = {}
    for aging in (86_400.0, 1.0):
        alloc = _odma(cost, 6_000, {"boundaries_tokens": [512, 3072], "refit": False, "large_pool_bytes": 0})
        replay, result = _replay(w, alloc, cost, policy="task_pool", aging_s=aging)
        assert result.metrics["completed"] == n_small + 1
        tl = replay.batch.timeline()
        start, arrive = tl.start_ps, tl.arrival_ps
        waits[aging] = (start[big] - arrive[big]) / PS
        if aging == 1.0:
            later = arrive > arrive[big] + 1.0 * PS
            assert (start[later] >= start[big]).all()
    assert waits[1.0] < waits[86_400.0]


@pytest.mark.parametrize("refit", [False, True])
@pytest.mark.parametrize("scheduler", ["task_pool", "fcfs"])
def test_the_queue_length_sampled_is_the_requests_arrived_and_not_started(cost, scheduler, refit):
    """The task pool counts its waiting requests (no request -> tag map): at every sample of the
    replay's series, the queue length equals, from the timeline, the requests that arrived by then
    and had not yet started (no preemption or rejection here), and nothing waits at the end; with
    refits, waiting heads tagged under older boundaries move between the tags' queues."""
    n_small = 400
    order = np.argsort([0.5] + [0.01 * k for k in range(n_small)], kind="stable")
    output = np.asarray([2500] + [300] * n_small)[order]
    w = _workload(np.full(n_small + 1, 100), output, output, np.zeros(n_small + 1),
                  np.sort([0.5] + [0.01 * k for k in range(n_small)], kind="stable"))
    # refitted to the small requests' lengths, the boundaries move the waiting small requests from
    # the 3,072-token bucket to the first (380 moves between the tags' queues) and leave the long
    # one to the large pool
    refits = {"boundaries_tokens": [256, 3072], "refit_every": 20, "refit_window": 60,
              "large_pool_bytes": 3_000 * _bpt(cost)} if refit else \
        {"boundaries_tokens": [512, 3072], "refit": False, "large_pool_bytes": 0}
    alloc = _odma(cost, 6_000, refits, 2_600)  # large blocks: prompt + 2,600
    replay, result = _replay(w, alloc, cost, policy=scheduler, aging_s=1.0, series_points=1 << 16)
    assert result.metrics["completed"] == n_small + 1 and result.metrics["preemptions"] == 0
    assert (alloc.boundary_updates > 0) == refit
    tl = replay.batch.timeline()
    rows = replay.tally.series.rows
    assert max(r[3] for r in rows) > 10  # requests did queue
    for t_ps, _, _, queue in rows:
        assert queue == int((tl.arrival_ps <= t_ps).sum() - (tl.start_ps <= t_ps).sum())
    assert len(replay.sched.waiting) == 0 and not replay.sched.waiting


def test_the_cluster_manager_prefers_memory_for_the_tag_then_load():
    from odmactl.sim.router import cluster_manager

    assert cluster_manager([100, 300, 300], [0, 5, 2]) == 2  # most free memory, then the lighter load
    assert cluster_manager([100, 100], [3, 1]) == 1
    assert cluster_manager([7], [9]) == 0
    with pytest.raises(ValueError):
        cluster_manager([1, 2], [0])


def test_a_bucket_the_main_pool_can_never_hold_goes_to_the_large_pool(cost):
    """A main pool of 1,000 tokens and a bucket of 1,024: a request of that bucket would wait
    forever in main; it takes a large block instead (prompt + the cap)."""
    bpt = _bpt(cost)
    alloc = _odma(cost, 3_000, {"boundaries_tokens": [256, 1024], "refit": False, "large_pool_bytes": 2_000 * bpt}, 900)
    a = alloc.reserve("r", 100, 600, 0.0)
    assert (a.region, a.capacity_tokens) == (LARGE, 100 + 900)
    assert alloc.tag_of(100, 600, 0.0) == (LARGE, LARGE) and alloc.tag_of(100, 100, 0.0) == ("main", 0)


# -- large_spill: a large block the full large pool cannot take, from the main pool -------------------


@pytest.mark.parametrize("scheduler", ["task_pool", "fcfs"])
def test_a_spill_takes_a_large_block_from_the_main_pool_when_the_large_pool_is_full(cost, scheduler):
    """The head-of-line case: r0 holds the only large block and r1 (u > tau) needs another. By
    default r1 waits for r0; with `large_spill` its block (max_model_len, no cap) comes from the
    main pool, which has room, and it starts within an iteration of its arrival."""
    w = _hol_case()
    bpt = _bpt(cost)
    waits = {}
    for spill in (False, True):
        alloc = _odma(cost, 60_000, {"boundaries_tokens": [256, 1024], "refit": False,
                                     "large_pool_bytes": MAX_LEN * bpt, "large_spill": spill})
        replay, result = _replay(w, alloc, cost, policy=scheduler)
        assert result.metrics["completed"] == 10
        counters = result.allocator["policy_counters"]
        assert counters["large_spills"] == (1 if spill else 0) and counters["routed_large"] == 2
        tl = replay.batch.timeline()
        waits[spill] = (tl.start_ps[1] - tl.arrival_ps[1]) / PS, tl.done_ps[0] / PS
    (wait_off, r0_done), (wait_on, _) = waits[False], waits[True]
    assert wait_off > r0_done - 0.5 and wait_on < 0.5


def test_a_spilling_head_is_tried_again_when_the_main_pool_frees_room(cost):
    """r0 holds the large block for 6,000 tokens; r_s holds 4,096 of the main pool's 11,808 for
    3,500; r1 needs 8,192 and fits neither until r_s ends. A release in the main pool is what
    makes room for it: r1 starts after r_s ends, long before r0 does (the failed-reservation memo
    counts main's releases for a large tag that spills)."""
    bpt = _bpt(cost)
    w = _workload([100, 100, 100], [6000, 3400, 200], [6000, 3400, 200], [0.9, 0.0, 0.9], [0.0, 0.01, 0.02])
    config = {"boundaries_tokens": [256, 4096], "refit": False, "large_pool_bytes": MAX_LEN * bpt, "large_spill": True}
    for fast in (True, False):
        replay, result = _replay(w, _odma(cost, 20_000, config), cost, policy="task_pool", fast_forward=fast)
        tl = replay.batch.timeline()
        assert result.metrics["completed"] == 3 and result.allocator["policy_counters"]["large_spills"] == 1
        assert tl.done_ps[1] <= tl.start_ps[2] < tl.done_ps[0]
    stepped = result.metrics
    fast = _replay(w, _odma(cost, 20_000, config), cost, policy="task_pool")[1].metrics
    assert fast == stepped  # fast-forward = stepping


def test_large_spill_is_a_setting_checked_as_a_bool(cost):
    with pytest.raises(ConfigError, match="large_spill"):
        AllocatorConfig.from_mapping({"max_model_len_tokens": MAX_LEN, "large_spill": "yes"})


def test_the_console_says_when_odma_spills():
    """replay's settings line (Allocator.describe) says so where large_spill is on, and nothing
    for the papers' reading."""
    assert "spills to the main pool" in OdmaAllocator.describe({"large_spill": True})
    assert OdmaAllocator.describe({"large_spill": False}) is None
