"""Automatic prefix caching over the `paged` pool, as vLLM's block pool keeps it
(vllm/v1/core/block_pool.py `BlockPool`, vllm/v1/core/kv_cache_utils.py `FreeKVCacheBlockQueue`).

A prompt's full blocks are cached under the hash of their content and everything before it, so a
later prompt that starts with the same tokens takes the cached blocks instead of computing them.
odmactl knows a prompt's content only as the trace's prefix hashes (Mooncake's `hash_ids`: one per
512-token block, chained, so a hash names its block and all before it), so the cache is kept in
*units*: one trace hash block, `unit_blocks` pool blocks (a unit is the least common multiple of the
hash block and the pool's block; several hashes make a unit when the pool's block is the longer,
the unit named by its last hash).

What vLLM does, and odmactl with it:
- a request admitted looks up its prompt's units in order and takes the longest cached run, at
  most up to the prompt's last token less one (`KVCacheManager.get_computed_blocks`: "the last token
  must be recomputed"); the units it hits gain a reference each, and its prefill computes the rest;
- a request's own full prompt units are cached from its admission (v1 caches a block once the
  step that computes it is scheduled, `KVCacheManager.cache_blocks`): odmactl caches the whole
  prompt's at admission, so a request that joins while a long shared prompt is still being chunked
  hits it a few steps early. A unit already cached stays as it is (the request's copy is an
  ordinary block);
- a finished or preempted request drops its references; a unit no one references is free but keeps
  its content until its blocks are needed: the free queue hands out never-cached blocks first and
  evicts free units least recently freed first, a request's units tail first (vLLM frees a
  request's blocks in reverse order so that its tail is evicted first). vLLM's one queue holds
  both, in order of freeing; odmactl takes the pool's uncached free blocks before any cached one,
  which differs only in which of a few partial blocks is taken first;
- the generated tokens are not hashed (the trace has no hashes for them), so a preempted request
  recomputes its generated tokens and hits only its prompt's units.

State. `units` maps a key to its unit: `owner` the live request whose allocation holds the unit's
blocks (they are its own blocks (position - its hit units) * unit_blocks onwards), or None, when
`blocks` holds them; `refs` how many live requests other than the owner hit it. `free` orders the
units with no owner and no reference, least recently freed first (evictable; their blocks are in
no allocation and not in the pool's free queue). `shared_blocks` is the blocks of ownerless units
that a live request references (held, in no allocation), `credit_blocks` the blocks every live
request hit (held by someone else). Invariant: every pool block is in exactly one place: the pool's
free queue, one live allocation, or one ownerless unit's `blocks`; `pool.cached_free_blocks ==
len(free) * unit_blocks`.

The replay (sim/) sees the blocks its batch counts per request (a request counts the blocks of its
whole KV): the blocks really held are that count plus `shared_blocks - credit_blocks`, written to
the batch's `shared` after every change. Fast-forwarding, the pool hears of growth lazily, so the
replay calls `sync(free)` with the blocks eager growth would leave free before each lookup and each
release: free units are evicted as eager growth would have evicted them, and stepping and
fast-forward agree on every hit.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict

from odmactl.trace.prefix import cacheable_blocks, hit_limit_blocks


def prefix_cache(alloc, batch, keys, enabled: bool, prompt_tokens) -> PrefixCache | None:
    """The prefix cache of a replay of `alloc` (its batch), when the engine caches prefixes
    (`enabled`), the trace has hashes (`keys`: trace/prefix.PrefixKeys, else None) and the policy
    keeps them in its blocks (`shares_prefixes`); else None: the policy shares nothing."""
    if not enabled or keys is None or not alloc.shares_prefixes:
        return None
    unit_keys, unit_tokens = keys.units(alloc.block_size_tokens)
    return PrefixCache(alloc, batch, unit_keys, unit_tokens, prompt_tokens.tolist())


class _Unit:
    __slots__ = ("owner", "refs", "blocks", "position")

    def __init__(self, owner, position: int) -> None:
        self.owner = owner  # the live request holding its blocks, or None
        self.refs = 0
        self.blocks = None  # array('q') of its pool blocks once ownerless
        self.position = position  # its index among the owner's units


class PrefixCache:
    """The prefix cache of one replay over a `paged` pool (the module docstring). `keys[i]` are
    request i's unit keys, `prompt_tokens[i]` its prompt; `unit_tokens` a unit's tokens; `full[i]`
    the full units of request i's prompt that have a key (those it can cache)."""

    def __init__(self, pool, batch, keys: list[list[int]], unit_tokens: int, prompt_tokens: list[int]) -> None:
        self.pool = pool
        self.batch = batch
        self.keys = keys
        self.unit_tokens = unit_tokens
        self.full = [cacheable_blocks(len(row), p, unit_tokens) for row, p in zip(keys, prompt_tokens)]
        self.unit_blocks = unit_tokens // pool.block_size_tokens
        self.unit_bytes = self.unit_blocks * pool.block_bytes
        self.units: dict[int, _Unit] = {}
        self.free: OrderedDict[int, None] = OrderedDict()
        self.held: dict[int, tuple[int, list[int]]] = {}  # live request -> (units hit, keys it owns)
        self.shared_blocks = 0
        self.credit_blocks = 0
        self.evictions = 0
        self.hit_tokens = 0
        self.looked_up_tokens = 0
        self._match = (-1, 0, 0, 0)  # the last lookup: (request, units, evictable blocks among them, KV tokens)
        pool.prefix = self

    def lookup(self, i: int, kv_tokens: int) -> int:
        """The tokens of request i's KV (`kv_tokens`: its prompt and what it generated) that the
        cache holds now: its leading cached units, at most up to its last token less one. The
        answer is kept until the cache changes (an admission, a release, an eviction), so the
        scheduler's budget check and its reservation look up once."""
        if self._match[0] == i and self._match[3] == kv_tokens:
            return self._match[1] * self.unit_tokens
        row = self.keys[i]
        cap = min(self.full[i], hit_limit_blocks(kv_tokens, self.unit_tokens))
        m = evictable = 0
        units = self.units
        while m < cap:
            u = units.get(row[m])
            if u is None:
                break
            if u.owner is None and u.refs == 0:
                evictable += self.unit_blocks
            m += 1
        self._match = (i, m, evictable, kv_tokens)
        return m * self.unit_tokens

    def hit_blocks(self, i: int) -> array:
        """The pool blocks of live request i's hit units, in token order: they lead its KV, and its
        own allocation holds the rest (the on-device probe reads them all)."""
        out = array("q")
        for key in self.keys[i][:self.held[i][0]]:
            u = self.units[key]
            out.extend(u.blocks if u.owner is None else self._unit_of(self.batch.allocs[u.owner].block_ids, u.position))
        return out

    def _unit_of(self, blocks: array, position: int) -> array:
        """The pool blocks of the unit at `position` of an owner's own blocks (unit p holds blocks
        p * unit_blocks onwards, the module docstring)."""
        k = self.unit_blocks
        return blocks[position * k:position * k + k]

    def evictable_hit_blocks(self, i: int) -> int:
        """Of request i's last lookup, the blocks of free units it would take (they stop being free)."""
        assert self._match[0] == i
        return self._match[2]

    def admit(self, i: int, kv_tokens: int) -> None:
        """Request i, looked up last, is admitted holding `kv_tokens`: it references the units it hit
        and its own full prompt units are cached, owned by it."""
        j, m, _, _ = self._match
        assert j == i, "admit follows the request's own lookup"
        self._match = (-1, 0, 0, 0)
        row = self.keys[i]
        units = self.units
        for key in row[:m]:
            u = units[key]
            if u.owner is None and u.refs == 0:  # a free unit: held again
                del self.free[key]
                self.pool.cached_free_blocks -= self.unit_blocks
                self.shared_blocks += self.unit_blocks
                self.pool.reserved_bytes += self.unit_bytes
                self.pool.record_peak(self.pool.reserved_bytes)
            u.refs += 1
        owned = []
        for position in range(m, self.full[i]):
            key = row[position]
            if key not in units:
                units[key] = _Unit(i, position - m)
                owned.append(key)
        self.held[i] = (m, owned)
        self.credit_blocks += m * self.unit_blocks
        self.hit_tokens += m * self.unit_tokens
        self.looked_up_tokens += kv_tokens
        self.batch.shared = self.shared_blocks - self.credit_blocks

    def release(self, i: int, allocation) -> None:
        """Request i (completed or preempted) gives its memory back: its units keep their blocks,
        cached; its references go; the rest of its blocks return to the pool."""
        m, owned = self.held.pop(i)
        self._match = (-1, 0, 0, 0)
        pool = self.pool
        k = self.unit_blocks
        freed = []  # units that become free, the request's tail first (evicted first)
        if owned:
            blocks = allocation.block_ids
            units = self.units
            for key in reversed(owned):
                u = units[key]
                u.blocks = self._unit_of(blocks, u.position)
                u.owner = None
                if u.refs:
                    self.shared_blocks += k
                else:
                    freed.append(key)
            if units[owned[-1]].position == len(owned) - 1:  # its units lead its own blocks (none was cached already)
                keep = blocks[len(owned) * k:]
            else:
                taken = {units[key].position for key in owned}
                keep = array("q")
                for position in range(-(-len(blocks) // k)):
                    if position not in taken:
                        keep.extend(self._unit_of(blocks, position))
            moved = len(blocks) - len(keep)
            allocation.block_ids = keep
            allocation.nbytes -= moved * pool.block_bytes
            allocation.capacity_tokens -= moved * pool.block_size_tokens
            allocation.used_tokens = min(allocation.used_tokens, allocation.capacity_tokens)
            pool.reserved_bytes -= moved * pool.block_bytes  # _forget takes the rest
            pool.reserved_bytes += (len(owned) - len(freed)) * self.unit_bytes  # still referenced: held
        row = self.keys[i]
        for key in reversed(row[:m]):
            u = self.units[key]
            u.refs -= 1
            if u.owner is None and u.refs == 0:
                self.shared_blocks -= k
                pool.reserved_bytes -= self.unit_bytes
                freed.append(key)
        self.credit_blocks -= m * k
        for key in freed:
            self.free[key] = None
        pool.cached_free_blocks += len(freed) * k
        pool.release(allocation)  # lazily grown blocks (fast-forward) were never taken: none to catch up
        self.batch.shared = self.shared_blocks - self.credit_blocks

    def evict(self, blocks_needed: int) -> None:
        """Evict free units, least recently freed first, until the pool's free queue holds
        `blocks_needed` blocks (or no free unit is left)."""
        short = blocks_needed - self.pool.free_blocks_uncached
        if short > 0:
            self._evict(-(-short // self.unit_blocks))

    def sync(self, free_eager: int) -> None:
        """Fast-forwarding: evict the free units eager growth would have evicted by now, `free_eager`
        being the blocks it would leave free (uncached and cached)."""
        excess = self.pool.cached_free_blocks - max(free_eager, 0)
        if excess > 0:
            self._evict(-(-excess // self.unit_blocks))

    def _evict(self, n: int) -> None:
        """The n least recently freed units (or all free ones) give their blocks to the queue's back."""
        n = min(n, len(self.free))
        self._match = (-1, 0, 0, 0)
        free, units = self.free, self.units
        blocks = array("q")
        for _ in range(n):
            key, _ = free.popitem(last=False)
            blocks.extend(units.pop(key).blocks)
        self.pool.cached_free_blocks -= n * self.unit_blocks
        self.pool.return_blocks(blocks)
        self.evictions += n

    def check(self) -> None:
        """The invariants of the module docstring (raise AssertionError)."""
        pool = self.pool
        in_units = sum(len(u.blocks) for u in self.units.values() if u.owner is None)
        in_allocs = sum(len(a.block_ids) for a in pool.live_allocations())
        assert in_units + in_allocs + pool.free_blocks_uncached == pool.num_blocks, "a block is lost or doubled"
        assert pool.cached_free_blocks == len(self.free) * self.unit_blocks
        shared = sum(self.unit_blocks for u in self.units.values() if u.owner is None and u.refs)
        assert shared == self.shared_blocks

    def counters(self) -> dict:
        return {"prefix_hit_tokens": self.hit_tokens, "prefix_looked_up_tokens": self.looked_up_tokens,
                "prefix_evictions": self.evictions}
