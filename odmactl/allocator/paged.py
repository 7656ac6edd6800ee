"""`paged`: vLLM-style fixed-size KV blocks from a free-block queue, grown on demand."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation, AllocatorBase, RegionStats, refuse_past_whole_blocks, with_tail
from odmactl.allocator.config import AllocatorConfig, Deployment, PolicySettings, whole_numbers
from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_TOKENS


def prompt_blocks(prompt_tokens: int, block_size_tokens: int) -> int:
    """The blocks a new request's reservation takes: its prompt's."""
    return -(-prompt_tokens // block_size_tokens)


@dataclass(frozen=True)
class PagedSettings(PolicySettings):
    """The block in tokens (vLLM's --block-size); eLLM's chunks and unified's pages read it too."""

    block_size_tokens: int = 16

    def __post_init__(self) -> None:
        whole_numbers(self, ("block_size_tokens", 1, MAX_TOKENS))


class PagedAllocator(AllocatorBase):
    """`num_blocks` blocks of `block_size_tokens` tokens fill the pool from offset 0; the bytes
    after the last whole block (`tail_bytes`, less than a block) are free but never handed out.

    Invariants: every block id is in exactly one place, the free queue or one live allocation's
    `block_ids`; an allocation holds ceil(used_tokens / block_size) blocks or more. Blocks are taken
    from the queue's front and returned to its back, as in vLLM's free-block queue, so the order
    is deterministic. Block ids are int64 arrays (array('q')), the queue and each allocation's
    `block_ids`: taking, growing and returning n blocks copies 8n bytes, where lists of ints
    would touch n reference counts (and free n of them at the end). The queue is `_free[_head:]`,
    with a moving front, so taking n blocks is one slice; the consumed prefix is dropped once it
    is three quarters of the array (each dropped block then costs at most a third of an id moved,
    and the array stays within four times the pool's blocks). `reserve` takes the prompt's
    blocks; `extend` adds blocks all-or-nothing and answers False when the queue runs dry (the
    caller preempts: vLLM recomputes the newest request).
    With a prefix cache (`prefix`, allocator/prefix.py; None without), a block may also sit in a
    cached unit: held while a request references it, else free but cached (`cached_free_blocks`
    of them, counted in `free_blocks`), evicted when the queue runs dry.
    """

    name = "paged"
    shares_prefixes = True  # vLLM's automatic prefix caching (allocator/prefix.py)
    settings = (PagedSettings,)

    @classmethod
    def describe(cls, config: dict) -> str | None:
        return f"paged in {config['block_size_tokens']}-token blocks"

    @classmethod
    def complete_config(cls, config: AllocatorConfig, *, pool_bytes: int, bytes_per_token: int,
                        realized_kv_tokens, deployment=None) -> tuple[AllocatorConfig, dict]:
        """Nothing to fill in; a max_model_len past what the pool holds in whole blocks is refused,
        as vLLM refuses it at start-up (a request of that length could never be scheduled)."""
        refuse_past_whole_blocks(config, pool_bytes, bytes_per_token, "blocks")
        return config, {}

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None,
                 deployment: Deployment | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena, deployment)
        self.block_size_tokens = self.read_block_tokens = config.block_size_tokens
        self.block_bytes = self.block_size_tokens * bytes_per_token
        self.num_blocks = pool_bytes // self.block_bytes
        if self.num_blocks == 0:
            raise ConfigError(f"a {pool_bytes:,}-byte pool holds no {self.block_bytes:,}-byte block", key="block_size_tokens")
        self.tail_bytes = pool_bytes - self.num_blocks * self.block_bytes
        self._free = array("q", range(self.num_blocks))
        self._head = 0
        self.prefix = None
        self.cached_free_blocks = 0

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        self._admit(request_id, prompt_tokens)
        n = prompt_blocks(prompt_tokens, self.block_size_tokens)
        if n > len(self._free) - self._head + self.cached_free_blocks:
            self.failed_reserves += 1
            return None
        blocks = self._take(n)
        a = Allocation(request_id, blocks[0] * self.block_bytes, n * self.block_bytes, n * self.block_size_tokens,
                       prompt_tokens, None, "main", blocks)
        return self._admitted(a)

    def reservation_tokens(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> int:
        return prompt_blocks(prompt_tokens, self.block_size_tokens) * self.block_size_tokens

    def room_for(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> bool:
        """As many free blocks (cached ones counted: they are evicted for it) as `reserve` takes."""
        return prompt_blocks(prompt_tokens, self.block_size_tokens) <= self.free_blocks

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        self._growth(allocation, total_tokens)
        a = allocation  # compiled, a typed local (paged.pxd): `_growth` found it this allocator's live Allocation
        self.extends += 1
        extra = -(-total_tokens // self.block_size_tokens) - len(a.block_ids)
        if extra > 0:
            if extra > len(self._free) - self._head + self.cached_free_blocks or total_tokens > self.max_tokens:
                self.failed_extends += 1
                return False
            a.block_ids += self._take(extra)
            a.nbytes += extra * self.block_bytes
            a.capacity_tokens += extra * self.block_size_tokens
            self.reserved_bytes += extra * self.block_bytes
            if self.reserved_bytes > self.peak_reserved_bytes:
                self.peak_reserved_bytes = self.reserved_bytes
        a.used_tokens = total_tokens
        return True

    def release(self, allocation: Allocation, final_tokens: int | None = None) -> None:
        """Return the blocks to the queue's back. With `final_tokens` past the blocks held, the
        blocks that growth would take from the front and this would return are not taken."""
        self._own(allocation)
        a = allocation  # compiled, a typed local (paged.pxd): `_own` found it this allocator's live Allocation
        if final_tokens is not None:
            self._final_growth(a, final_tokens, self.max_tokens)
        self._free.extend(a.block_ids)
        self._forget(a)

    def _take(self, n: int) -> array:
        """The first n free blocks (the caller checked there are n, cached ones counted: those are
        evicted when the queue holds fewer)."""
        if self.cached_free_blocks and n > len(self._free) - self._head:
            self.prefix.evict(n)
        head = self._head
        blocks = self._free[head:head + n]
        head += n
        if head > 4096 and 4 * head > 3 * len(self._free):
            del self._free[:head]
            head = 0
        self._head = head
        return blocks

    @property
    def free_blocks(self) -> int:
        """Free blocks, cached ones (evictable) counted, as vLLM's block pool counts them."""
        return len(self._free) - self._head + self.cached_free_blocks

    @property
    def free_blocks_uncached(self) -> int:
        return len(self._free) - self._head

    def return_blocks(self, blocks: array) -> None:
        """Blocks of an evicted cached unit go to the queue's back."""
        self._free.extend(blocks)

    def _other_spans(self) -> list[tuple[int, int, str]]:
        if self.prefix is None:
            return []
        return [(b * self.block_bytes, self.block_bytes, f"cached prefix block {b}")
                for u in self.prefix.units.values() if u.owner is None and u.refs for b in u.blocks]

    def _other_reserved_bytes(self) -> int:
        return 0 if self.prefix is None else self.prefix.shared_blocks * self.block_bytes

    def _ranges(self, a: Allocation) -> list[tuple[int, int]]:
        return [(b * self.block_bytes, self.block_bytes) for b in a.block_ids]

    def free_extents(self) -> list[tuple[int, int]]:
        """Runs of consecutive free blocks as (offset, nbytes), the tail merged into the last run;
        free blocks that still hold a cached prefix count as free (vLLM's block pool counts them)."""
        out: list[list[int]] = []
        free = list(self._free[self._head:])
        if self.prefix is not None:
            free += [b for key in self.prefix.free for b in self.prefix.units[key].blocks]
        for b in sorted(free):
            if out and out[-1][0] + out[-1][1] == b * self.block_bytes:
                out[-1][1] += self.block_bytes
            else:
                out.append([b * self.block_bytes, self.block_bytes])
        return with_tail(out, self.num_blocks * self.block_bytes, self.tail_bytes)

    def _region_stats(self) -> dict[str, RegionStats]:
        return {"main": RegionStats.of(self.pool_bytes, self.free_extents())}

    def _check_structures(self) -> None:
        owned = sum(len(a.block_ids) for a in self._live.values())
        free = self._free[self._head:]
        assert len(set(free)) == len(free), "a block is in the free queue twice"
        if self.prefix is not None:
            self.prefix.check()
            return
        assert owned + len(free) == self.num_blocks, f"{owned} owned + {len(free)} free != {self.num_blocks} blocks"
        for a in self._live.values():
            assert a.offset_bytes == a.block_ids[0] * self.block_bytes, f"request '{a.request_id}' offset is not its first block"
            assert a.capacity_tokens == len(a.block_ids) * self.block_size_tokens, f"request '{a.request_id}' capacity"
