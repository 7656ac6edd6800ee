"""What the engine hands an on-device probe (device/ondevice.StepProbe) at each iteration: the
decoding requests' allocations and KV tokens, the shared prefix blocks that lead their KV, and the
prompt chunks beside them as (tokens computed before, new tokens) pairs (a vLLM 0.6 prefill's,
which read the batch's C fields, the engine builds itself). The engine calls these only when its
replay has a probe, so none of it costs a virtual replay anything."""

from __future__ import annotations


def decode_step(probe, b, prefix, kv_now: list, dt: int, chunks: list | None) -> None:
    """A decode iteration of batch `b` taking `dt` ps, its running requests holding `kv_now`;
    `prefix` the replay's prefix cache (allocator/prefix.PrefixCache) or None; `chunks`
    (sim/chunked.Chunker.plan's [request, new tokens, ...]) beside it, or None."""
    probe.step([b.allocs[i] for i in b.running], kv_now, dt, chunk_pairs(b, chunks) if chunks else (),
               None if prefix is None else [prefix.hit_blocks(i) for i in b.running])


def chunk_pairs(b, chunks: list) -> list:
    """Chunker.plan's chunks, before they are computed, as (tokens computed before, new tokens)."""
    return [(b.prefilling[chunks[j]], chunks[j + 1]) for j in range(0, len(chunks), 2)]

