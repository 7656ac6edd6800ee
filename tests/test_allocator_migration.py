"""Acceptance 2 of issue 3: on the torch arena (cpu), bytes written into an ODMA and an S3 block
survive migration unchanged, and the old block is reusable afterwards."""

from __future__ import annotations

import pytest
import torch

from odmactl.allocator import TorchArena, make_allocator

BPT = 64
POOL = 256 * 1024


def pattern(nbytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("policy", ["odma", "s3"])
def test_bytes_survive_migration_and_old_block_is_reused(policy: str) -> None:
    arena = TorchArena(POOL, "cpu")
    # s3 moves by a copy with s3_overflow = "migrate"; its buckets (32 tokens wide) are over the
    # output, so a 32-token prompt predicted 10 or 20 output tokens gets 32 + 32 = 64, as odma's 40 + 10
    config = {"max_model_len_tokens": 512, "boundaries_tokens": [64, 128, 256, 512], "refit": False,
              "large_pool_bytes": 2 * 512 * BPT, "s3_num_buckets": 16, "s3_overflow": "migrate"}
    alloc = make_allocator(policy, POOL, BPT, config, arena=arena)
    prompt_a, prompt_b = (40, 30) if policy == "odma" else (32, 32)
    a = alloc.reserve("req-a", prompt_a, predicted_output_tokens=10, uncertainty=0.0)
    assert a is not None and a.capacity_tokens == 64
    old_offset, old_nbytes = a.offset_bytes, a.nbytes
    assert alloc.extend(a, 64)  # fill the block to the brim, in place
    assert a.offset_bytes == old_offset
    data = pattern(64 * BPT, seed=1)
    arena.view(a.offset_bytes, 64 * BPT).copy_(data)

    assert alloc.extend(a, 65)  # one token past the block: migrate
    assert a.offset_bytes != old_offset and alloc.stats().migrations == 1
    assert a.capacity_tokens >= 65 and a.used_tokens == 65
    if policy == "odma":
        assert a.region == "large" and a.bucket == "large"
    else:
        assert a.bucket == 1 and a.capacity_tokens == 32 + 64  # 33 output tokens: the second bucket
    assert torch.equal(arena.view(a.offset_bytes, 64 * BPT), data)
    assert arena.copied_bytes == 64 * BPT
    alloc.check_invariants()

    b = alloc.reserve("req-b", prompt_b, predicted_output_tokens=20, uncertainty=0.0)
    assert b is not None and (b.offset_bytes, b.nbytes) == (old_offset, old_nbytes)
    arena.view(b.offset_bytes, b.nbytes).copy_(pattern(b.nbytes, seed=2))
    assert torch.equal(arena.view(a.offset_bytes, 64 * BPT), data)  # reuse did not touch the moved KV
    alloc.release(a)
    alloc.release(b)
    alloc.check_invariants()


def test_odma_migration_fails_cleanly_when_the_large_pool_is_full() -> None:
    alloc = make_allocator("odma", POOL, BPT, {"max_model_len_tokens": 512, "boundaries_tokens": [64, 512],
                                               "refit": False, "large_pool_bytes": 512 * BPT})
    big = alloc.reserve("uncertain", 100, predicted_output_tokens=100, uncertainty=0.95)
    assert big is not None and big.region == "large"
    a = alloc.reserve("small", 40, predicted_output_tokens=10, uncertainty=0.0)
    before = (a.offset_bytes, a.capacity_tokens, a.used_tokens)
    assert alloc.extend(a, 65) is False
    assert (a.offset_bytes, a.capacity_tokens, a.used_tokens) == before
    s = alloc.stats()
    assert s.failed_extends == 1 and s.migrations == 0
    alloc.check_invariants()
