"""A Triton kernel that reads runs of a torch buffer at the rate the memory gives them: the KV read
of an on-device decode step (ondevice.py). Imported only where torch has CUDA and Triton; the
package works without it (the probe then reads with embedding_bag).

Input: `tile_start[i]`, `tile_len[i]` (in 4-byte words; ondevice.split_runs cuts each run into
tiles of at most TILE words). Program i sums tile i into `sums[i]`: every word of every tile is
loaded once and 4 bytes per tile are written, so the kernel's traffic is the runs' bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_WORDS = 2048  # words loaded per loop iteration of a program (8 KiB)


@triton.jit
def _sum_tiles(words, tile_start, tile_len, sums, ALIGN: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = tl.multiple_of(tl.load(tile_start + pid), ALIGN)
    n = tl.load(tile_len + pid)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, n, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        acc += tl.load(words + start + idx, mask=idx < n, other=0.0)
    tl.store(sums + pid, tl.sum(acc, axis=0))


def read_tiles(words, tile_start, tile_len, sums, align_words: int) -> None:
    """Launch one program per tile; `align_words` divides every tile start (a load-width hint)."""
    _sum_tiles[(tile_start.numel(),)](words, tile_start, tile_len, sums, ALIGN=align_words, BLOCK=BLOCK_WORDS)
