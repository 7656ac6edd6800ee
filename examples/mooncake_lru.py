"""Prefix hits of an LRU cache of a given size over Mooncake's hash_ids alone, without odmactl: the
check behind docs/capacity.md's "Prefix caching on Mooncake" (the hits a pool of that many tokens can give).

    python examples/mooncake_lru.py [TRACE.jsonl.gz] [POOL_TOKENS ...]

Each prompt hits its leading 512-token blocks that the cache holds, up to its last token less one
(vLLM recomputes it); then its full blocks become the most recently used, and the least recently
used are dropped past the pool's blocks. Live requests' blocks are not subtracted from the pool.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import OrderedDict
from pathlib import Path

BLOCK = 512
DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl.gz"
# the KV pools of DeepSeek-R1-Distill-Qwen-7B in docs/capacity.md's table: A100 tp 1, 2, 4; 4 x MLU370-X4
POOLS = (932_858, 2_131_322, 4_528_248, 1_012_623)


def lru_hits(rows: list[dict], pool_tokens: float) -> tuple[int, int]:
    """(prompt tokens hit, prompt tokens) of an LRU of `pool_tokens` (math.inf: unbounded)."""
    cache: OrderedDict[int, None] = OrderedDict()
    capacity = pool_tokens / BLOCK
    hit = total = 0
    for r in rows:
        n, ids = r["input_length"], r["hash_ids"]
        full = min(len(ids), n // BLOCK)
        m = 0
        while m < min(full, (n - 1) // BLOCK) and ids[m] in cache:
            m += 1
        hit += m * BLOCK
        total += n
        for x in ids[:full]:
            cache[x] = None
            cache.move_to_end(x)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hit, total


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    pools = [int(a) for a in sys.argv[2:]] or list(POOLS)
    with gzip.open(path, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    for pool in pools:
        hit, total = lru_hits(rows, pool)
        print(f"pool {pool:>12,} tokens: {hit / total:.1%} of prompt tokens hit")


if __name__ == "__main__":
    main()
