"""Issue 29, acceptance 2: `s3` as its paper. Buckets over the predicted OUTPUT length (one rule,
rules/s3.py); with `s3_overflow = "preempt"` (the default) a request that outgrows its bucket is
preempted by the replay (its KV freed, recomputed at re-admission) and re-admitted with the next
larger bucket; `s3_overflow = "migrate"` keeps odmactl's earlier copy to a larger bucket."""

from __future__ import annotations

import numpy as np
import pytest

from odmactl.allocator import AllocatorConfig, make_allocator
from odmactl.allocator.s3 import S3Allocator
from odmactl.core.errors import ConfigError
from odmactl.hw.cost import CostModel
from odmactl.hw.profiles import load_device, load_model
from odmactl.rules.s3 import s3_capacities, s3_classes
from odmactl.sim.engine import Replay
from odmactl.sim.settings import SchedulerSettings
from odmactl.sim.workload import PS, Workload

BPT = 16
MAX_LEN = 1000
CONFIG = {"max_model_len_tokens": MAX_LEN, "s3_num_buckets": 4}  # buckets of 250, 500, 750, 1000 output tokens
DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


# ------------------------------------------------------------------------------ allocator, by hand

def test_reservation_is_prompt_plus_the_predicted_outputs_bucket() -> None:
    alloc = make_allocator("s3", 1 << 20, BPT, CONFIG)
    assert alloc.capacities_tokens == s3_capacities(MAX_LEN, 4) == (250, 500, 750, 1000)
    assert alloc.config.s3_overflow == "preempt"  # the default: the S3 paper's supervisor
    for rid, prompt, predicted, capacity, bucket in (
            ("a", 100, 150, 350, 0), ("b", 100, 250, 350, 0), ("c", 100, 251, 600, 1),
            ("d", 100, 0, 350, 0), ("e", 300, 900, MAX_LEN, 3),     # capped at max_model_len
            ("f", 900, 10, MAX_LEN, 0), ("g", 100, 5000, MAX_LEN, 3),  # past the maximum: the last bucket
            ("h", 100, None, MAX_LEN, 3)):                           # no prediction: max_model_len
        a = alloc.reserve(rid, prompt, predicted)
        assert (a.capacity_tokens, a.bucket, a.used_tokens) == (capacity, bucket, prompt), rid
        if predicted is not None:  # the allocator's bucket is the predictor's class of the output length
            assert bucket == s3_classes(np.array([predicted]), alloc.capacities_tokens)[0]
    alloc.check_invariants()


def test_preempt_mode_refuses_growth_and_readmits_with_the_next_bucket() -> None:
    alloc = make_allocator("s3", 1 << 20, BPT, CONFIG)
    a = alloc.reserve("r", 100, 150)
    assert a.capacity_tokens == 350 and a.bucket == 0
    assert alloc.extend(a, 350)  # in place, to the brim
    assert not alloc.extend(a, 351)  # past the bucket: the caller preempts
    assert (a.capacity_tokens, a.used_tokens, a.live) == (350, 350, True)
    s = alloc.stats()
    assert s.failed_extends == 1 and s.migrations == 0 and s.migrated_bytes == 0
    assert s.policy_counters == {"escalations": 0, "awaiting_readmission": 1}
    alloc.release(a)
    alloc.check_invariants()  # a preempted request holds no memory while it waits

    # re-admitted as the replay does: prompt + generated tokens, the prediction left (ignored)
    b = alloc.reserve("r", 350, 1)
    assert b.capacity_tokens == 100 + 500 and b.bucket == 1 and b.used_tokens == 350
    assert alloc.stats().policy_counters == {"escalations": 1, "awaiting_readmission": 0}
    assert alloc.extend(b, 600) and not alloc.extend(b, 601)  # outgrown again: one bucket more
    alloc.release(b)
    c = alloc.reserve("r", 600, 1)
    assert c.capacity_tokens == 100 + 750 and c.bucket == 2
    assert alloc.extend(c, 850) and not alloc.extend(c, 851)
    alloc.release(c)
    d = alloc.reserve("r", 850, 1)
    assert d.capacity_tokens == MAX_LEN and d.bucket == 3  # 100 + 1000, capped at max_model_len
    assert not alloc.extend(d, MAX_LEN + 1)  # past max_model_len: fails, and nothing is recorded
    assert alloc.stats().policy_counters == {"escalations": 3, "awaiting_readmission": 0}
    alloc.release(d)
    # a fresh request of another id is unaffected by r's history
    assert alloc.reserve("other", 350, 1).capacity_tokens == 350 + 250
    alloc.check_invariants()


def test_preempt_mode_readmission_fits_its_next_token_and_waits_for_room() -> None:
    alloc = make_allocator("s3", 700 * BPT, BPT, CONFIG)
    a = alloc.reserve("r", 100, 150)
    blocker = alloc.reserve("blocker", 100, 100)  # 350 tokens: 350 + 350 = the whole pool
    assert not alloc.extend(a, 351)
    alloc.release(a)
    assert alloc.reserve("r", 350, 1) is None  # 600 tokens do not fit next to the blocker
    assert alloc.stats().policy_counters["awaiting_readmission"] == 1  # the record survives a failed reserve
    alloc.check_invariants()
    alloc.release(blocker)
    # the caller asks for more than original prompt + next bucket: the floor of prompt_tokens + 1
    b = alloc.reserve("r", 650, 1)
    assert b.capacity_tokens == 651 and b.bucket == 1
    assert alloc.stats().policy_counters == {"escalations": 1, "awaiting_readmission": 0}
    alloc.release(b)
    # preempted and never re-admitted: the record holds no memory and breaks no invariant
    c = alloc.reserve("never-back", 10, 10)
    assert not alloc.extend(c, 261)
    alloc.release(c)
    alloc.check_invariants()
    s = alloc.stats()
    assert s.reserved_bytes == 0 and s.live_allocations == 0 and s.policy_counters["awaiting_readmission"] == 1


def test_migrate_mode_moves_to_the_bucket_holding_the_output_so_far() -> None:
    alloc = make_allocator("s3", 1 << 20, BPT, {**CONFIG, "s3_overflow": "migrate"})
    a = alloc.reserve("r", 100, 150)
    assert a.capacity_tokens == 350
    assert alloc.extend(a, 351)  # 251 output tokens: bucket 1, 100 + 500
    assert (a.capacity_tokens, a.bucket, a.used_tokens) == (600, 1, 351)
    assert alloc.extend(a, 900)  # 800 output tokens: bucket 3, capped at max_model_len
    assert (a.capacity_tokens, a.bucket) == (MAX_LEN, 3)
    assert not alloc.extend(a, MAX_LEN + 1)
    s = alloc.stats()
    # each move copies the tokens written so far: 100 (the prompt; no extend told it more), then 351
    assert s.migrations == 2 and s.migrated_bytes == (100 + 351) * BPT and s.failed_extends == 1
    assert s.policy_counters == {"escalations": 0, "awaiting_readmission": 0}
    alloc.release(a)
    alloc.check_invariants()


def test_s3_overflow_is_checked() -> None:
    with pytest.raises(ConfigError, match="s3_overflow") as info:
        AllocatorConfig(s3_overflow="bogus")
    assert info.value.key == "s3_overflow" and "preempt, migrate" in str(info.value)
    with pytest.raises(ConfigError, match="s3_overflow"):
        AllocatorConfig.from_mapping({"s3_overflow": "bogus"}, "c.toml", "allocator")
    assert AllocatorConfig.from_mapping({"s3_overflow": "migrate"}).s3_overflow == "migrate"
    assert AllocatorConfig().to_mapping()["s3_overflow"] == "preempt"


# ------------------------------------------------------------------------------ replay

class RecordingS3(S3Allocator):
    """S3 that logs each successful reservation: (request id, prompt tokens, capacity, bucket)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log = []

    def reserve(self, request_id, prompt_tokens, predicted_output_tokens=None, uncertainty=None):
        a = S3Allocator.reserve(self, request_id, prompt_tokens, predicted_output_tokens, uncertainty)
        if a is not None:
            self.log.append((request_id, prompt_tokens, a.capacity_tokens, a.bucket))
        return a


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel(load_device(DEVICE), load_model(MODEL))


def _workload() -> Workload:
    """"long" is predicted 200 output tokens (bucket 0: 250) and writes 400 (bucket 1); the others
    are predicted right. "side" runs beside it past its preemption, "late" arrives while it waits."""
    ids = ["long", "short", "side", "late"]
    arrival_s = [0.0, 0.0, 0.0, 1.0]
    prompt = [100, 50, 80, 60]
    output = [400, 100, 300, 40]
    predicted = [200.0, 100.0, 300.0, 40.0]
    return Workload(ids, np.round(np.asarray(arrival_s) * PS).astype(np.int64), np.asarray(prompt, dtype=np.int64),
                    np.asarray(output, dtype=np.int64), np.asarray(predicted), np.zeros(len(ids)))


def _run(cost, fast_forward: bool, pool_tokens: int = 4000, **config):
    bpt = cost.model.kv_bytes_per_token
    alloc = RecordingS3(pool_tokens * bpt, bpt, AllocatorConfig(**{**CONFIG, **config}))
    result = Replay(_workload(), alloc, cost, MAX_LEN, SchedulerSettings(fast_forward=fast_forward)).run()
    return result, alloc


@pytest.mark.parametrize("fast_forward", [True, False])
def test_replay_preempts_recomputes_and_readmits_with_the_next_bucket(cost, fast_forward) -> None:
    result, alloc = _run(cost, fast_forward)
    m, w = result.metrics, _workload()
    assert m["preemptions"] == 1 and m["migrations"] == 0 and m["migrated_bytes"] == 0
    # preempted when its 350-token block (100 + 250) was full: 250 tokens generated, recomputed
    assert m["recomputed_tokens"] == 250
    long_log = [entry for entry in alloc.log if entry[0] == "long"]
    assert long_log == [("long", 100, 350, 0), ("long", 350, 600, 1)]  # re-admitted with 100 + 500
    assert alloc.stats().policy_counters == {"escalations": 1, "awaiting_readmission": 0}
    # the others got prompt + their predicted bucket, once each
    assert sorted(e for e in alloc.log if e[0] != "long") == [
        ("late", 60, 310, 0), ("short", 50, 300, 0), ("side", 80, 580, 1)]
    # conservation: every request completes with all its output; nothing is live at the end
    assert m["completed"] == m["requests"] == 4 and m["rejections"] == 0 and m["truncated"] == 0
    assert m["generated_tokens"] == int(w.output_tokens.sum())
    s = alloc.stats()
    assert s.live_allocations == 0 and s.reserved_bytes == 0 and s.free_bytes == s.pool_bytes
    assert s.reserves == s.releases == 5 and s.failed_extends == 1
    alloc.check_invariants()
    # utilization from the blocks held at the end: "long" finished in its 600-token block
    kv = (w.prompt_tokens + w.output_tokens).sum()
    assert m["kv_utilization"] == pytest.approx(kv / (600 + 300 + 580 + 310))
    assert m["overflow_rate"] == 1 / 4


def test_replay_fast_forward_equals_stepping_with_preemption(cost) -> None:
    fast, fast_alloc = _run(cost, True)
    slow, slow_alloc = _run(cost, False)
    assert fast.metrics == slow.metrics
    # per request (the series samples at every step when stepping, so it is not compared)
    assert np.array_equal(fast.ttft_s, slow.ttft_s) and np.array_equal(fast.tpot_s, slow.tpot_s)
    assert fast_alloc.log == slow_alloc.log
    assert fast.allocator["peak_reserved_bytes"] == slow.allocator["peak_reserved_bytes"]
    assert fast.allocator["policy_counters"] == slow.allocator["policy_counters"]


def test_replay_migrate_mode_copies_instead(cost) -> None:
    fast, alloc = _run(cost, True, s3_overflow="migrate")
    slow, _ = _run(cost, False, s3_overflow="migrate")
    assert fast.metrics == slow.metrics
    m = fast.metrics
    assert m["migrations"] == 1 and m["preemptions"] == 0 and m["recomputed_tokens"] == 0
    assert m["migrated_bytes"] == 350 * cost.model.kv_bytes_per_token  # the KV written when it outgrew 350
    assert [e for e in alloc.log if e[0] == "long"] == [("long", 100, 350, 0)]
    assert m["completed"] == 4 and alloc.stats().live_allocations == 0
    w = _workload()
    assert m["kv_utilization"] == pytest.approx((w.prompt_tokens + w.output_tokens).sum() / (600 + 300 + 580 + 310))


def test_replay_preempted_request_too_big_to_come_back_is_rejected(cost) -> None:
    """In a 500-token pool "long" fits its first block (350) but not the next (600): alone in the
    system it is rejected (counted), the others complete, and its record holds no memory."""
    for fast_forward in (True, False):
        result, alloc = _run(cost, fast_forward, pool_tokens=500)
        m = result.metrics
        assert m["preemptions"] == 1 and m["rejections"] >= 1
        assert m["completed"] + m["rejections"] == m["requests"]
        s = alloc.stats()
        assert s.live_allocations == 0 and s.reserved_bytes == 0
        assert s.policy_counters == {"escalations": 0, "awaiting_readmission": 1}
        alloc.check_invariants()
