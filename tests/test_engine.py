"""The engine's closed form against token-by-token stepping for every registered policy, in the
regimes where the replay spends its time: an overloaded queue, a binding token budget, tensor
parallelism over 4 devices; conservation and the allocator's invariants in each; the scheduler
chosen by name."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from odmactl.allocator import ALLOCATORS, make_allocator
from odmactl.core.errors import ConfigError
from odmactl.hw.cost import CostModel
from odmactl.hw.profiles import load_device, load_model
from odmactl.run.config import scheduler_settings
from odmactl.run.replay import deployment_of
from odmactl.sim.engine import Replay
from odmactl.sim.schedulers import SCHEDULERS, register_scheduler, unregister_scheduler
from odmactl.sim.schedulers.fcfs import FcfsScheduler
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.workload import PS, Workload

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"
# settings that make each policy work: small pools preempt (paged, ellm, unified), halved
# predictions outgrow their blocks (s3 preempts, odma migrates), eLLM borrows and offloads
POLICY_SETTINGS = {
    "static": {}, "paged": {}, "s3": {"s3_num_buckets": 64},
    "odma": {"boundaries_tokens": [512, 1024, 2048, 4096], "refit_every": 40, "refit_window": 120},
    "ellm": {"ellm_borrow_bytes": 1_500 * 57_344, "ellm_host_buffer_bytes": 4_000 * 57_344},
    "unified": {},
}


@pytest.fixture(scope="module")
def frame(conv_sample_head) -> pl.DataFrame:
    return pl.read_parquet(conv_sample_head(400)).head(160)


def _workload(frame: pl.DataFrame, rate_scale: float) -> Workload:
    """The requests at `rate_scale` times their arrival rate, with halved length predictions."""
    out = frame["output_tokens"].to_numpy().astype(np.int64)
    arrival = np.round(frame["arrival_s"].to_numpy() / rate_scale * PS).astype(np.int64)
    return Workload(frame["request_id"].to_list(), arrival, frame["prompt_tokens"].to_numpy().astype(np.int64), out,
                    np.maximum(out // 2, 1).astype(np.float64), np.random.default_rng(3).uniform(0, 1, out.size))


def _run(policy: str, w: Workload, cost: CostModel, pool_tokens: int, settings: SchedulerSettings):
    bpt = cost.model.kv_bytes_per_token * cost.tp
    config = {"max_model_len_tokens": 8192, **POLICY_SETTINGS[policy]}
    if policy == "odma":  # two max_model_len blocks for what outgrows its bucket
        config["large_pool_bytes"] = 2 * 8192 * bpt
    alloc = make_allocator(policy, pool_tokens * bpt, bpt, config, deployment=deployment_of(cost))
    return Replay(w, alloc, cost, 8192, settings).run()


@pytest.mark.parametrize("policy", sorted(ALLOCATORS))
@pytest.mark.parametrize("regime", ["overloaded", "budget", "tp4"])
def test_fast_forward_equals_stepping_for_every_policy(frame, policy, regime):
    """Overloaded: the trace at 40x its rate on one MLU370-X4 (the queue grows through the run);
    budget: 3,000 prefill tokens an iteration, below many prompts' batches; tp 4: the model over
    four devices (the all-reduces' per-request terms). The metrics, the allocator's counters and
    its eager peak agree exactly between the closed form and stepping."""
    tp = 4 if regime == "tp4" else 1
    model = load_model(MODEL).shard(tp)
    cost = CostModel(load_device(DEVICE), model, tp=tp)
    w = _workload(frame, 40.0 if regime == "overloaded" else 4.0)
    budget = 3_000 if regime == "budget" else None
    pool_tokens = 30_000 if policy in ("static", "s3", "odma") else 12_000
    if policy == "static":
        pool_tokens = 60_000  # holds a few max_model_len slots
    runs = [_run(policy, w, cost, pool_tokens,
                 SchedulerSettings(fast_forward=ff, max_num_seqs=64, max_num_batched_tokens=budget))
            for ff in (True, False)]
    fast, slow = runs
    assert fast.metrics == slow.metrics
    assert fast.allocator["peak_reserved_bytes"] == slow.allocator["peak_reserved_bytes"]
    assert fast.allocator["policy_counters"] == slow.allocator["policy_counters"]
    m = fast.metrics
    assert m["completed"] + m["rejections"] == len(w.request_ids) and m["rejections"] == 0
    assert m["generated_tokens"] == int(np.minimum(w.output_tokens, 8192 - w.prompt_tokens).sum())
    assert fast.allocator["live_allocations"] == 0 and fast.allocator["reserved_bytes"] == 0
    if regime == "overloaded":
        assert m["overloaded"]
    if regime == "budget":  # no prefill iteration ran more than the budget allows (but a lone prompt)
        assert m["prefill_iterations"] >= -(-int((w.prompt_tokens + 0).sum()) // 3_000)
    if policy in ("paged", "ellm", "unified", "s3"):  # blocks ran out; s3's supervisor preempted
        assert m["preemptions"] > 0
    if policy == "odma":
        assert m["migrations"] > 0
    if policy == "ellm":  # offloaded and fetched back over the host link
        assert m["host_link_bytes"] > 0


@pytest.mark.parametrize("scheduler", ["task_pool", "fcfs"])
def test_fast_forward_equals_stepping_for_odma_spilling_to_the_main_pool(frame, scheduler):
    """odma with one large block and `large_spill` (docs/policies.md), overloaded: large blocks
    spill to the main pool, and the closed form and stepping agree exactly."""
    cost = CostModel(load_device(DEVICE), load_model(MODEL))
    bpt = cost.model.kv_bytes_per_token
    w = _workload(frame, 40.0)
    config = {"max_model_len_tokens": 8192, "boundaries_tokens": [256, 512, 1024, 2048], "refit": False, "tau": 0.5,
              "large_pool_bytes": 8192 * bpt, "large_spill": True}
    runs = [Replay(w, make_allocator("odma", 30_000 * bpt, bpt, config, deployment=deployment_of(cost)), cost, 8192,
                   SchedulerSettings(fast_forward=ff, max_num_seqs=64, policy=scheduler)).run() for ff in (True, False)]
    fast, slow = runs
    assert fast.metrics == slow.metrics
    assert fast.allocator["policy_counters"] == slow.allocator["policy_counters"]
    assert fast.allocator["policy_counters"]["large_spills"] > 0 and fast.metrics["completed"] == len(w.request_ids)


def test_the_scheduler_is_chosen_by_name_and_an_unknown_one_is_refused(frame):
    assert "fcfs" in SCHEDULERS
    with pytest.raises(ConfigError, match="policy"):
        scheduler_settings({"policy": "sjf"}, None)
    assert scheduler_settings({"policy": "fcfs"}, None).policy == "fcfs"


class OldestVictimScheduler(FcfsScheduler):
    """A scheduler of the test's own, in Python: FCFS admission, but growth that runs out of blocks
    preempts the oldest running request instead of the newest."""

    name = "oldest-victim"

    def victim(self):
        return next(iter(self.batch.running))


def test_a_scheduler_of_ones_own_replays_by_its_name(frame):
    register_scheduler(OldestVictimScheduler)
    try:
        cost = CostModel(load_device(DEVICE), load_model(MODEL))
        w = _workload(frame, 40.0)
        results = {}
        for name in ("fcfs", "oldest-victim"):
            runs = [_run("paged", w, cost, 12_000, SchedulerSettings(policy=name, fast_forward=ff, max_num_seqs=64))
                    for ff in (True, False)]
            assert runs[0].metrics == runs[1].metrics
            results[name] = runs[0].metrics
        assert results["fcfs"]["completed"] == results["oldest-victim"]["completed"] == len(w.request_ids)
        assert results["fcfs"] != results["oldest-victim"]  # its rule took effect
    finally:
        unregister_scheduler("oldest-victim")


def test_a_scheduler_registration_is_checked():
    class Nameless(FcfsScheduler):
        name = ""

    for bad, words in ((Nameless, "name"), (dict, "subclass"), (OldestVictimScheduler, None)):
        if words is None:  # a second class under a name another holds
            register_scheduler(OldestVictimScheduler)
            try:
                class Again(FcfsScheduler):
                    name = "oldest-victim"

                with pytest.raises(ConfigError, match="registered already"):
                    register_scheduler(Again)
            finally:
                unregister_scheduler("oldest-victim")
            continue
        with pytest.raises(ConfigError, match=words):
            register_scheduler(bad)
    with pytest.raises(ConfigError, match="no scheduler"):
        unregister_scheduler("nope")


def test_the_occupancy_sum_is_exact_past_64_bits():
    """Tally.occupy sums bytes x ps exactly: compiled, as a 128-bit number in two 64-bit words
    whose carries it counts (a term's 32-bit halves multiplied apart). Terms at and past 2**63,
    a low word that wraps many times, and zero terms give Python's exact sum."""
    import random
    from types import SimpleNamespace

    from odmactl.sim.tally import Tally

    rng = random.Random(7)
    top = (1 << 63) - 1
    terms = [(top, top), (top, 1), (1, top), (1 << 32, 1 << 32), ((1 << 32) - 1, (1 << 32) - 1), (7, 0), (0, top),
             (3, 4), ((1 << 61) + 5, 2)]
    terms += [(rng.randrange(1 << 40), rng.randrange(1 << 45)) for _ in range(2_000)]  # a pool's bytes x a step's ps
    terms += [(rng.randrange(top), rng.randrange(top)) for _ in range(200)]
    tally = Tally(2, False)
    for reserved, dt in terms:
        tally.occupy(reserved, dt)
    link = SimpleNamespace(moved_bytes=0, link_ps=0, bottleneck_ps=0)
    assert tally.counters(0, 0, link, 0)["occupancy_byte_ps"] == sum(r * d for r, d in terms)
    tally.occupy(5, 6)  # after counters, the sum goes on from the total
    assert tally.counters(0, 0, link, 0)["occupancy_byte_ps"] == sum(r * d for r, d in terms) + 30
    for reserved, dt in ((-1, 3), (3, -1)):  # compiled, a negative would wrap to a huge unsigned term
        with pytest.raises(ValueError, match="negative"):
            tally.occupy(reserved, dt)
