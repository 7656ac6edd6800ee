"""A trace's prefix hashes as a replay reads them, and the reuse they show with an unbounded cache.

A canonical trace may carry each prompt's prefix block hashes (trace/schema.py, PREFIX_SCHEMA:
Mooncake's `hash_ids`, chained, one per block of `prefix_block_tokens` tokens); the replay's prefix
cache (allocator/prefix.py) caches blocks under them.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from odmactl.core.errors import TraceError


class PrefixKeys:
    """Per request, the keys of its prompt's hash blocks, in order: `keys[offsets[i]:offsets[i+1]]`
    (int64), each block `block_tokens` tokens; a request without hashes has none."""

    __slots__ = ("keys", "offsets", "block_tokens", "_units")

    def __init__(self, keys: np.ndarray, offsets: np.ndarray, block_tokens: int) -> None:
        self.keys = keys
        self.offsets = offsets
        self.block_tokens = block_tokens
        self._units: dict[int, tuple[list[list[int]], int]] = {}  # units() by pool block, made once

    def __getstate__(self):  # picklable (plan sends workloads to worker processes), without the memo
        return (self.keys, self.offsets, self.block_tokens)

    def __setstate__(self, state) -> None:
        self.keys, self.offsets, self.block_tokens = state
        self._units = {}

    def select(self, rows) -> PrefixKeys:
        """The keys of requests `rows` (a slice or an index array), in that order."""
        rows = np.arange(len(self.offsets) - 1)[rows]
        lengths = self.offsets[rows + 1] - self.offsets[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if not rows.size or not offsets[-1]:
            return PrefixKeys(np.zeros(0, np.int64), offsets, self.block_tokens)
        index = np.repeat(self.offsets[rows] - offsets[:-1], lengths) + np.arange(offsets[-1])
        return PrefixKeys(self.keys[index], offsets, self.block_tokens)

    def total_blocks(self) -> int:
        return int(self.offsets[-1])

    def units(self, pool_block_tokens: int) -> tuple[list[list[int]], int]:
        """Each request's unit keys for a pool of `pool_block_tokens`-token blocks, and the unit's
        tokens: lcm(hash block, pool block); a unit of g hash blocks is named by its last hash
        (chained hashes name everything before them). Made once per pool block (the lists are read,
        never changed)."""
        if pool_block_tokens in self._units:
            return self._units[pool_block_tokens]
        unit = math.lcm(self.block_tokens, pool_block_tokens)
        g = unit // self.block_tokens
        out = []
        keys = self.keys.tolist()
        offsets = self.offsets.tolist()
        for i in range(len(offsets) - 1):
            row = keys[offsets[i]:offsets[i + 1]]
            out.append(row[g - 1::g] if g > 1 else row)
        self._units[pool_block_tokens] = (out, unit)
        return out, unit


def cacheable_blocks(hashes: int, prompt_tokens: int, block_tokens: int) -> int:
    """The blocks of a prompt that can be cached: its full blocks that have a hash."""
    return min(hashes, prompt_tokens // block_tokens)


def hit_limit_blocks(kv_tokens: int, block_tokens: int) -> int:
    """The most leading blocks a lookup of `kv_tokens` may hit: up to its last token less one,
    which vLLM always computes for its logits (kv_cache_manager.py `get_computed_blocks`)."""
    return (kv_tokens - 1) // block_tokens


def reuse(keys: PrefixKeys, prompt_tokens: np.ndarray) -> dict:
    """The trace's prefix reuse with an unbounded cache, counted from the hashes alone: each
    prompt's leading blocks that an earlier prompt's full blocks already hold, at most up to its
    last token less one (vLLM recomputes it), in tokens."""
    seen: set[int] = set()
    unit = keys.block_tokens
    hit = total = with_hashes = 0
    flat = keys.keys.tolist()
    offsets = keys.offsets.tolist()
    for i, prompt in enumerate(prompt_tokens.tolist()):
        row = flat[offsets[i]:offsets[i + 1]]
        if row:
            with_hashes += 1
        full = cacheable_blocks(len(row), prompt, unit)
        cap = min(full, hit_limit_blocks(prompt, unit))
        m = 0
        while m < cap and row[m] in seen:
            m += 1
        hit += m * unit
        total += prompt
        seen.update(row[:full])
    return {"requests_with_hashes": with_hashes, "hash_block_tokens": unit, "distinct_blocks": len(seen),
            "prompt_tokens": total, "reused_tokens": hit, "reuse_rate": hit / total if total else 0.0}


def prefix_keys(frame: pl.DataFrame) -> PrefixKeys | None:
    """Each prompt's prefix hashes (the trace's optional prefix_hashes column), None without."""
    if "prefix_hashes" not in frame.columns or frame["prefix_hashes"].null_count() == frame.height:
        return None
    sizes = frame.filter(pl.col("prefix_hashes").list.len() > 0)["prefix_block_tokens"].unique().to_list()
    if len(sizes) > 1:
        raise TraceError(f"the trace's prefix hashes come in blocks of {' and '.join(map(str, sorted(sizes)))} tokens; "
                          "a replay caches one block size", column="prefix_block_tokens",
                          hint="ingest the sources into separate traces")
    if not sizes:
        return None
    hashes = frame["prefix_hashes"].fill_null([])
    lengths = hashes.list.len().to_numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    keys = hashes.explode().drop_nulls().to_numpy().astype(np.int64) if offsets[-1] else np.zeros(0, np.int64)
    return PrefixKeys(keys, offsets, int(sizes[0]))
