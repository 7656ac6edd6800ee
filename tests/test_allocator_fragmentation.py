"""Acceptance 3 of issue 3: external fragmentation in `odma` (enough free bytes, no extent large
enough, reserve answers None) and coalescing resolving it after releases."""

from __future__ import annotations

from odmactl.allocator import make_allocator

BPT = 8
SMALL, LARGE = 64, 128  # bucket boundaries in tokens
BLOCK = SMALL * BPT


def test_fragmentation_then_coalescing() -> None:
    # the main region is exactly 8 small blocks; no large pool, so nothing hides in it
    alloc = make_allocator("odma", 8 * BLOCK, BPT, {"max_model_len_tokens": LARGE, "boundaries_tokens": [SMALL, LARGE],
                                                     "large_pool_bytes": 0, "refit": False})
    small = [alloc.reserve(f"s{i}", 20, predicted_output_tokens=10, uncertainty=0.0) for i in range(8)]
    assert [a.offset_bytes for a in small] == [i * BLOCK for i in range(8)]
    assert alloc.reserve("one-more", 20, predicted_output_tokens=10) is None  # full

    for a in small[0::2]:  # free every other block: 4 holes of one small block each
        alloc.release(a)
    s = alloc.stats()
    assert s.free_bytes == 4 * BLOCK >= LARGE * BPT            # enough bytes in total...
    assert s.largest_free_extent_bytes == BLOCK < LARGE * BPT  # ...but in pieces
    assert s.fragmentation_ratio == 0.25 and s.regions["main"].free_extents == 4

    failed = s.failed_reserves
    assert alloc.reserve("big", 100, predicted_output_tokens=20, uncertainty=0.0) is None  # needs 128 tokens
    assert alloc.stats().failed_reserves == failed + 1
    alloc.check_invariants()

    alloc.release(small[1])  # its neighbours 0 and 2 are free: three blocks coalesce into one extent
    s = alloc.stats()
    assert s.regions["main"].free_extents == 3 and s.largest_free_extent_bytes == 3 * BLOCK
    big = alloc.reserve("big", 100, predicted_output_tokens=20, uncertainty=0.0)
    assert big is not None and big.offset_bytes == 0 and big.nbytes == LARGE * BPT and big.bucket == 1
    alloc.check_invariants()

    for a in [big, *small[3::2]]:
        alloc.release(a)
    assert alloc.free_extents() == [(0, 8 * BLOCK)]
    assert alloc.stats().fragmentation_ratio == 1.0
