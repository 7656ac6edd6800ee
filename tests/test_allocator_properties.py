"""Acceptance 1 of issue 3: random interleavings of reserve, extend and release on every policy and
both arenas; after every operation no two live allocations overlap and reserved + free == pool
(check_invariants tiles the pool), and releasing everything restores one coalesced free extent
per region. Each policy sees at least 10,000 operations per arena."""

from __future__ import annotations

import pytest
from allocator_driver import CONFIG, POOL_BYTES, Driver, expected_free_extents, torch_arena
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odmactl.allocator import ALLOCATORS, make_allocator

OPS_PER_EXAMPLE = 200
EXAMPLES = 55
MIN_OPS = 10_000

operation = st.tuples(
    st.integers(0, 9),                      # 0-3 reserve (3: no prediction), 4-6 extend, 7-9 release
    st.integers(0, 10_000),                 # prompt length / which live allocation
    st.integers(0, 400),                    # predicted output / growth
    st.floats(0.0, 1.5, allow_nan=False),   # uncertainty u (tau = 0.8)
)


VARIANTS = {
    "static (prompt + max_new_tokens slots)": ("static", {"static_slot": "prompt_plus_max_new", "max_new_tokens": 120}),
    "odma (deferred refit)": ("odma", {"refit_mode": "deferred"}),
}


@pytest.mark.parametrize("arena", ["virtual", "torch"])
@pytest.mark.parametrize("policy", sorted(ALLOCATORS) + sorted(VARIANTS))
def test_random_interleavings_keep_invariants(policy: str, arena: str) -> None:
    policy, overrides = VARIANTS.get(policy, (policy, {}))
    total_ops = 0

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(operation, min_size=OPS_PER_EXAMPLE, max_size=OPS_PER_EXAMPLE))
    def run(ops) -> None:
        nonlocal total_ops
        backing = torch_arena(POOL_BYTES) if arena == "torch" else "virtual"
        alloc = make_allocator(policy, POOL_BYTES, 8, {**CONFIG, **overrides}, arena=backing)
        driver = Driver(alloc)
        for op in ops:
            driver.step(*op)
        driver.release_all()
        assert alloc.free_extents() == expected_free_extents(alloc)
        stats = alloc.stats()
        assert stats.reserved_bytes == 0 and stats.used_bytes == 0 and stats.live_allocations == 0
        assert stats.free_bytes == POOL_BYTES
        total_ops += driver.ops

    run()
    assert total_ops >= MIN_OPS


def test_workload_exercises_failures_and_migrations() -> None:
    """The operation mix above is not a walk in the park: on the same generator, pools fill up,
    reserves and extends fail, and ODMA and S3 migrate."""
    import random

    rng = random.Random(7)
    for policy in ("odma", "s3", "paged", "static"):
        alloc = make_allocator(policy, POOL_BYTES, 8, CONFIG)
        driver = Driver(alloc)
        for _ in range(3000):
            driver.step(rng.randrange(10), rng.randrange(10_001), rng.randrange(401), rng.uniform(0, 1.5))
        s = alloc.stats()
        assert s.failed_reserves > 0, policy
        if policy in ("odma", "s3"):
            assert s.migrations > 0, policy
        if policy == "odma":
            assert s.policy_counters["routed_large"] > 0 and s.policy_counters["boundary_updates"] > 0
