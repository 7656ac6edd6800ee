"""The allocator API contract: registry, config, misuse errors, policy-specific placement, stats."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from odmactl.allocator import ALLOCATORS, AllocatorConfig, make_allocator
from odmactl.allocator.contiguous import ContiguousAllocator
from odmactl.allocator.base import InvariantError
from odmactl.core.errors import AllocationError, ConfigError

BPT = 16
POOL = 1 << 20


def test_registry_names_are_the_contract() -> None:
    assert set(ALLOCATORS) == {"static", "paged", "s3", "odma", "ellm", "unified"}
    for name in ALLOCATORS:
        assert make_allocator(name, POOL, BPT).name == name


@pytest.mark.parametrize("policy", sorted(ALLOCATORS))
def test_misuse_raises_clear_errors(policy: str) -> None:
    alloc = make_allocator(policy, POOL, BPT, {"max_model_len_tokens": 1024})
    a = alloc.reserve("r1", 100, 50, 0.1)
    with pytest.raises(AllocationError, match="already holds a live allocation"):
        alloc.reserve("r1", 10, 5, 0.1)
    with pytest.raises(AllocationError, match="can never fit"):
        alloc.reserve("r2", 1025, 5, 0.1)
    with pytest.raises(AllocationError, match="cannot shrink"):
        alloc.extend(a, 99)
    with pytest.raises(AllocationError, match="whole number of KV tokens, got 150.5"):
        alloc.extend(a, 150.5)
    assert alloc.extend(a, 2**70) is False  # past a C integer: refused like any length past max_model_len
    for copied in (copy.copy, copy.deepcopy, pickle.dumps):  # a second handle would pass as the live one
        with pytest.raises(TypeError, match="by identity"):
            copied(a)
    alloc.release(a)
    with pytest.raises(AllocationError, match="already released"):
        alloc.release(a)
    with pytest.raises(AllocationError, match="already released"):
        alloc.extend(a, 200)
    other = make_allocator(policy, POOL, BPT, {"max_model_len_tokens": 1024})
    foreign = other.reserve("r9", 10, 5, 0.1)
    with pytest.raises(AllocationError, match="not made by this allocator"):
        alloc.release(foreign)
    with pytest.raises(AllocationError, match="not made by this allocator"):
        alloc.extend(foreign, 20)
    alloc.check_invariants()


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="key 'gama': unknown key") as info:
        AllocatorConfig.from_mapping({"gama": 0.3}, "c.toml")
    assert "c.toml" in str(info.value) and "gamma" in str(info.value)  # the known keys are listed
    assert "unknown key; did you mean 'gamma'?" in str(info.value)  # a new user's wish (issue 40)
    with pytest.raises(ConfigError, match="key 'allocator.gamma': expected a number, got str 'high'"):
        AllocatorConfig.from_mapping({"gamma": "high"}, "c.toml", prefix="allocator")
    with pytest.raises(ConfigError, match="key 'gamma': expected a finite number"):
        AllocatorConfig.from_mapping({"gamma": float("inf")})
    with pytest.raises(ConfigError, match="key 'block_size_tokens'"):
        AllocatorConfig.from_mapping({"block_size_tokens": 0})
    with pytest.raises(ConfigError, match="strictly increasing"):
        AllocatorConfig.from_mapping({"boundaries_tokens": [64, 32]})
    with pytest.raises(ConfigError, match="unknown allocator policy 'buddy'"):
        make_allocator("buddy", POOL, BPT)
    with pytest.raises(ConfigError, match="holds no block"):
        make_allocator("odma", POOL, BPT, {"max_model_len_tokens": 4096, "large_pool_bytes": 1000})
    with pytest.raises(ConfigError, match="torch sees no 'mlu' device"):
        make_allocator("odma", POOL, BPT, arena="torch", device="mlu")


def test_static_slots() -> None:
    alloc = make_allocator("static", 10 * 512 * BPT + 100, BPT, {"max_model_len_tokens": 512})
    slots = [alloc.reserve(f"r{i}", 10) for i in range(11)]
    assert slots[-1] is None and [a.offset_bytes for a in slots[:10]] == [i * 512 * BPT for i in range(10)]
    assert alloc.extend(slots[0], 512) and not alloc.extend(slots[0], 513)
    alloc = make_allocator("static", POOL, BPT, {"max_model_len_tokens": 512, "static_slot": "prompt_plus_max_new",
                                                 "max_new_tokens": 100})
    assert alloc.reserve("a", 30).capacity_tokens == 130
    assert alloc.reserve("b", 480).capacity_tokens == 512


def test_paged_grows_block_by_block_and_reports_block_ids() -> None:
    alloc = make_allocator("paged", 10 * 16 * BPT, BPT, {"max_model_len_tokens": 1024})
    a = alloc.reserve("a", 17)
    assert a.block_ids.tolist() == [0, 1] and a.capacity_tokens == 32
    assert alloc.extend(a, 32) and a.block_ids.tolist() == [0, 1]
    assert alloc.extend(a, 33) and a.block_ids.tolist() == [0, 1, 2]
    b = alloc.reserve("b", 16 * 7)
    assert b.block_ids.tolist() == [3, 4, 5, 6, 7, 8, 9] and alloc.free_blocks == 0
    assert not alloc.extend(a, 49) and a.block_ids.tolist() == [0, 1, 2]  # the caller preempts
    alloc.release(b)
    assert alloc.extend(a, 49) and a.block_ids.tolist() == [0, 1, 2, 3]
    alloc.check_invariants()


def test_s3_equal_width_buckets() -> None:
    """Buckets over the predicted output length (issue 29): prompt + the bucket's capacity."""
    alloc = make_allocator("s3", POOL, BPT, {"max_model_len_tokens": 1000, "s3_num_buckets": 4})
    assert alloc.capacities_tokens == (250, 500, 750, 1000)
    assert alloc.reserve("a", 100, 150).capacity_tokens == 100 + 250
    assert alloc.reserve("b", 100, 251).capacity_tokens == 100 + 500
    assert alloc.reserve("c", 100, None).capacity_tokens == 1000  # no prediction: max_model_len
    assert alloc.reserve("e", 400, 700).capacity_tokens == 1000  # 400 + 750, capped at max_model_len
    a = alloc.reserve("d", 10, 10)
    assert not alloc.extend(a, 600) and a.capacity_tokens == 260  # s3_overflow = "preempt": the caller preempts
    moving = make_allocator("s3", POOL, BPT, {"max_model_len_tokens": 1000, "s3_num_buckets": 4, "s3_overflow": "migrate"})
    a = moving.reserve("d", 10, 10)
    assert moving.extend(a, 600) and a.capacity_tokens == 10 + 750 and a.bucket == 2  # the bucket holding 590 output tokens


def test_odma_routing_and_inflation() -> None:
    cfg = {"max_model_len_tokens": 2048, "boundaries_tokens": [256, 512, 1024, 2048], "gamma": 0.5, "tau": 0.8,
           "refit": False}
    alloc = make_allocator("odma", POOL * 4, BPT, cfg)
    assert alloc.need_tokens(100, 200, 0.5) == 100 + 250
    assert alloc.reserve("a", 100, 100, 0.0).capacity_tokens == 256
    assert alloc.reserve("b", 100, 200, 0.5).capacity_tokens == 512    # 350 after inflation
    c = alloc.reserve("c", 100, 10, 0.81)                              # u > tau: large pool
    assert c.region == "large" and c.bucket == "large" and c.capacity_tokens == 2048
    assert alloc.reserve("d", 100, 10, None).bucket == 0               # no u: no inflation
    assert alloc.reserve("e", 100, None, 0.0).region == "large"        # no prediction: large pool
    assert alloc.reserve("f", 300, -50, 0.0).capacity_tokens == 512    # a negative prediction: the prompt
    assert alloc.stats().policy_counters["routed_large"] == 2


@pytest.mark.parametrize("policy, settings", [
    ("static", {}), ("static", {"static_slot": "prompt_plus_max_new", "max_new_tokens": 100}),
    ("s3", {"s3_num_buckets": 4}), ("paged", {}), ("ellm", {}), ("unified", {}),
    ("odma", {"boundaries_tokens": [256, 512, 1024, 2048], "gamma": 0.5, "tau": 0.8, "refit": False})])
def test_reservation_tokens_is_what_reserve_takes(policy: str, settings: dict) -> None:
    """What a reservation would take (the router's room check, sim/cluster.py, round-robin-ready,
    asks `room_for`, which reads it) is what `reserve` takes."""
    alloc = make_allocator(policy, POOL * 4, BPT, {"max_model_len_tokens": 2048, **settings})
    for k, (prompt, predicted, u) in enumerate([(100, 100, 0.0), (100, 200, 0.5), (100, 10, 0.81), (300, None, 0.0),
                                                (1990, 600, 0.1), (17, 1, None)]):
        want = alloc.reservation_tokens(prompt, predicted, u)
        assert alloc.reserve(f"r{k}", prompt, predicted, u).capacity_tokens == want, (prompt, predicted, u)
    assert make_allocator("static", POOL, BPT, {"max_model_len_tokens": 2048}).reservation_tokens(5, None, None) == 2048


def test_odma_boundaries_apply_to_new_reservations_only() -> None:
    alloc = make_allocator("odma", POOL * 4, BPT, {"max_model_len_tokens": 2048, "boundaries_tokens": [256, 2048],
                                                   "refit": False})
    old = alloc.reserve("old", 100, 100, 0.0)
    alloc.set_boundaries([128, 1024, 2048])
    new = alloc.reserve("new", 100, 100, 0.0)
    assert (old.capacity_tokens, old.bucket) == (256, 0) and (new.capacity_tokens, new.bucket) == (1024, 1)
    assert alloc.extend(old, 256) and old.capacity_tokens == 256
    with pytest.raises(ConfigError, match="strictly increasing"):
        alloc.set_boundaries([512, 256])
    alloc.check_invariants()


def test_odma_refits_boundaries_from_realized_lengths() -> None:
    cfg = {"max_model_len_tokens": 4096, "refit_window": 100, "refit_every": 50, "num_buckets": 4,
           "granularity_tokens": 16}
    alloc = make_allocator("odma", 64 << 20, BPT, cfg)
    assert alloc.boundaries_tokens == (1024, 2048, 3072, 4096)
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 400, 100)
    for i, n in enumerate(lengths):
        a = alloc.reserve(f"r{i}", 10, int(n), 0.0)
        assert alloc.extend(a, int(n))
        alloc.release(a)
    # the default levels: 0.99 * i/4, the tail past the top quantile left to the large pool
    expected = np.quantile(lengths, [0.2475, 0.495, 0.7425, 0.99], method="higher")
    assert alloc.boundaries_tokens == tuple(int(-(-q // 16) * 16) for q in expected)
    counters = alloc.stats().policy_counters
    assert counters["boundary_updates"] == 2 and counters["refits"] == 2
    # after the first refit, a need (10 prompt + predicted n) above its last boundary goes to the large pool
    last = -(-int(np.quantile(lengths[:50], 0.99, method="higher")) // 16) * 16
    assert counters["routed_large"] == sum(10 + int(n) > last for n in lengths[50:]) > 0


def test_release_with_final_tokens_equals_extend_then_release() -> None:
    """release(a, final_tokens) is extend(a, final_tokens) + release(a) in one call: ODMA refits
    from the same realized lengths; paged returns the same block count without taking the growth."""
    cfg = {"max_model_len_tokens": 4096, "refit_window": 100, "refit_every": 50, "granularity_tokens": 16}
    lengths = [int(n) for n in np.random.default_rng(1).integers(50, 400, 100)]
    two, one = make_allocator("odma", 64 << 20, BPT, cfg), make_allocator("odma", 64 << 20, BPT, cfg)
    for i, n in enumerate(lengths):
        a, b = two.reserve(f"r{i}", 10, n, 0.0), one.reserve(f"r{i}", 10, n, 0.0)
        assert two.extend(a, n)
        two.release(a)
        one.release(b, n)
        assert b.used_tokens == n and not b.live
    assert one.boundaries_tokens == two.boundaries_tokens != (1024, 2048, 3072, 4096)
    one.check_invariants()
    paged = make_allocator("paged", POOL, BPT, {"max_model_len_tokens": 1024})
    a = paged.reserve("p", 20)
    paged.release(a, 700)  # 44 blocks' worth, never taken: the queue still holds every block
    assert a.used_tokens == 700 and paged.free_blocks == paged.num_blocks and paged.stats().extends == 0
    paged.check_invariants()


@pytest.mark.parametrize("policy", sorted(ALLOCATORS))
def test_release_with_final_tokens_rejects_shrinking_and_overgrowth(policy: str) -> None:
    alloc = make_allocator(policy, POOL, BPT, {"max_model_len_tokens": 1024})
    a = alloc.reserve("r", 100, 50, 0.1)
    with pytest.raises(AllocationError, match="released at 99 KV tokens"):
        alloc.release(a, 99)
    with pytest.raises(AllocationError, match="released at 1025 KV tokens"):
        alloc.release(a, 1025)  # past max_model_len (and past any contiguous block)
    if isinstance(alloc, ContiguousAllocator):  # one block: it must be extended first
        with pytest.raises(AllocationError, match=f"released at {a.capacity_tokens + 1} KV tokens"):
            alloc.release(a, a.capacity_tokens + 1)  # a contiguous block must be extended first
    assert a.live and a.used_tokens == 100
    alloc.release(a, 100)
    alloc.check_invariants()


def test_check_invariants_detects_corruption() -> None:
    alloc = make_allocator("odma", POOL, BPT, {"max_model_len_tokens": 1024, "refit": False})
    a = alloc.reserve("a", 100, 10, 0.0)
    b = alloc.reserve("b", 100, 10, 0.0)
    b.offset_bytes = a.offset_bytes + 16  # simulate a bookkeeping bug: b now overlaps a
    with pytest.raises(InvariantError, match="overlaps"):
        alloc.check_invariants()


def test_stats_track_usage() -> None:
    alloc = make_allocator("odma", POOL, BPT, {"max_model_len_tokens": 1024, "boundaries_tokens": [256, 1024],
                                               "refit": False})
    a = alloc.reserve("a", 100, 50, 0.0)
    alloc.extend(a, 120)
    s = alloc.stats()
    assert s.reserved_bytes == 256 * BPT and s.used_bytes == 120 * BPT and s.live_allocations == 1
    assert s.reserved_bytes + s.free_bytes == POOL and s.peak_reserved_bytes == 256 * BPT
    assert s.to_dict()["regions"]["large"]["pool_bytes"] == alloc.regions["large"].size_bytes


def test_deferred_refit_waits_for_the_caller_and_matches_inline() -> None:
    base = {"max_model_len_tokens": 4096, "refit_window": 100, "refit_every": 50, "granularity_tokens": 16}
    inline = make_allocator("odma", 64 << 20, BPT, base)
    deferred = make_allocator("odma", 64 << 20, BPT, {**base, "refit_mode": "deferred"})
    lengths = np.random.default_rng(4).integers(50, 900, 120)
    for i, n in enumerate(lengths):
        for alloc in (inline, deferred):
            a = alloc.reserve(f"r{i}", 10, int(n), 0.0)
            assert a is not None and alloc.extend(a, int(n))
            alloc.release(a)
        if i == 49:  # the batch is complete: inline has refit inside release, deferred only says so
            assert deferred.refit_due and deferred.boundaries_tokens == (1024, 2048, 3072, 4096)
            assert inline.boundaries_tokens != deferred.boundaries_tokens
        if deferred.refit_due:
            deferred.flush_refit()
        assert not deferred.refit_due and deferred.boundaries_tokens == inline.boundaries_tokens
    assert deferred.stats().policy_counters == inline.stats().policy_counters
    with pytest.raises(ConfigError, match="key 'refit_mode'"):
        AllocatorConfig.from_mapping({"refit_mode": "sometimes"})
