"""`unified`: ADR-006's unified paged pool (seeds/004). One pool of pages holds KV and LoRA adapters;
a request's KV is a few contiguous page ranges, allocated best fit (first fit as an option),
instead of one block per page; adapters are unpinned when no running request uses them and are
evicted least recently used, between the high and low watermarks."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

try:  # compiled by Cython (see setup.py): unified.pxd types the hot fields, cython.locals the hot locals
    import cython
except ImportError:  # pragma: no cover - cython is a build requirement, not a runtime one
    from odmactl.core.purecython import cython

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import (
    Allocation,
    AllocatorBase,
    InvariantError,
    RegionStats,
    refuse_past_whole_blocks,
    with_tail,
)
from odmactl.allocator.config import AllocatorConfig, Deployment, PolicySettings, number_problem, one_of, whole_numbers
from odmactl.allocator.extentlist import ExtentList
from odmactl.allocator.pageruns import PageRuns
from odmactl.allocator.paged import PagedSettings
from odmactl.core.errors import AllocationError, ConfigError

UNIFIED_FITS = ("best", "first")  # ADR-006 §5.2: best fit by default, first fit for latency-critical paths
MAX_ADAPTER_RANK = 4_096  # LoRA ranks are 8-64 in S-LoRA's and ADR-006's examples
MAX_ADAPTER_BYTES = 1 << 50


def prompt_pages(prompt_tokens: int, page_tokens: int) -> int:
    """The pages a new request's reservation takes: its prompt and its first token's."""
    return -(-(prompt_tokens + 1) // page_tokens)


@dataclass(frozen=True)
class UnifiedSettings(PolicySettings):
    """Page ranges by best or first fit, growth by a share of the pages held, eviction between the
    watermarks (fractions of the pool's pages), LoRA adapters of `lora_rank` (their bytes filled in
    from the model when not set), at most `unified_hot_adapters` resident. Pages are
    `block_size_tokens` (PagedSettings). Invariant: 0 < low watermark <= high watermark <= 1."""

    unified_fit: str = "best"
    unified_growth_fraction: float = 0.125  # a new range adds this share of the pages held (0: one page)
    unified_high_watermark: float = 0.9
    unified_low_watermark: float = 0.8
    lora_rank: int = 16
    adapter_bytes: int | None = None
    unified_hot_adapters: int = 100

    def __post_init__(self) -> None:
        whole_numbers(self, ("lora_rank", 1, MAX_ADAPTER_RANK), ("unified_hot_adapters", 1, 1 << 20))
        one_of(self, "unified_fit", UNIFIED_FITS)
        whole_numbers(self, ("adapter_bytes", 0, MAX_ADAPTER_BYTES))
        if number_problem(self.unified_growth_fraction, 0, 4):
            raise ConfigError(f"expected a share of the pages held from 0 (one page at a time) to 4, got "
                              f"{self.unified_growth_fraction!r}", key="unified_growth_fraction")
        low, high = self.unified_low_watermark, self.unified_high_watermark

        def fraction(x) -> bool:
            return not number_problem(x, 0, 1) and x > 0

        if not (fraction(low) and fraction(high) and low <= high):
            bad = "unified_high_watermark" if fraction(low) and not fraction(high) else "unified_low_watermark"
            raise ConfigError(f"expected 0 < unified_low_watermark <= unified_high_watermark <= 1, got {low!r} and "
                              f"{high!r}", key=bad)


class UnifiedAllocator(AllocatorBase):
    """`num_pages` pages of `page_tokens` tokens (the `block_size_tokens` setting: at Llama-3-8B's
    128 KiB a token in fp16, 16 tokens are ADR-006's default 2 MB page) fill the pool from offset 0;
    the bytes after the last whole page are free but never handed out.

    A request's KV is a chain of page ranges (`_runs`, the chain its Allocation's `handle` names;
    `page_ranges` lists them as [start, pages, ...]). `reserve`
    takes pages for the prompt and its first token as one range when one fits (best fit: the
    smallest free range that holds them; first fit: the lowest), else the largest free ranges until
    it has them (counted in `scattered_takes`, as is growth that does). `extend` grows a request by a step of
    `unified_growth_fraction` of the pages it holds (at least what it needs; 0: a page at a time;
    what it needs alone when the step cannot be had): the last range in place when the pages after
    it are free, else a new range taken the same way. A step in proportion keeps a request to a few
    ranges and a few growth events, at the cost of at most that share of its pages unused. A failed extend is the replay's cue to preempt
    (block_size_tokens is None for the replay: growth is asked for at the end of the pages held, as
    for a contiguous block, and the copy is never needed: `migrated_bytes` stays 0).

    Page states, ADR-006 §6: a request's pages are pinned for its lifetime; an adapter's range is
    pinned while `refcount` running requests use it and unpinned (in `_lru`, least recent first)
    otherwise; the rest are free. Unpinned adapters are evicted, least recently used first, when a
    range cannot be had without them, and after any allocation that leaves the pool at or above
    `unified_high_watermark` of its pages, until it is at or below `unified_low_watermark` (the
    hysteresis band of §7.3); at most `unified_hot_adapters` are resident (the hot tier, §9.2),
    the rest are in host memory (warm): loading one moves its bytes over the host link
    (`host_bytes`).

    Invariants (checked): every page is in exactly one place (a free extent, one request's ranges,
    one adapter's range: a chain of one), so `used_pages` (the request and adapter pages) is
    `num_pages - free_pages`; `kv_runs` is the sum of the live requests' range counts; `_runs` holds
    the live requests' and resident adapters' chains and no other; an unpinned adapter has refcount
    0 and is in `_lru`, a pinned one has refcount > 0 and is not.
    """

    name = "unified"
    settings = (PagedSettings, UnifiedSettings)

    @classmethod
    def complete_config(cls, config: AllocatorConfig, *, pool_bytes: int, bytes_per_token: int,
                        realized_kv_tokens, deployment=None) -> tuple[AllocatorConfig, dict]:
        """An adapter's bytes, when not set: `lora_rank` times the model's bytes per rank; the
        pool must hold max_model_len in whole pages, as for paged."""
        refuse_past_whole_blocks(config, pool_bytes, bytes_per_token, "pages")
        page = config.block_size_tokens
        notes = {"pages": f"{page}-token pages, {config.unified_fit} fit, growth by "
                          + (f"{config.unified_growth_fraction:g} of the pages held" if config.unified_growth_fraction
                             else "a page at a time")}
        sized_by = "adapter_bytes" if config.adapter_bytes is not None else "lora_rank"  # what a message blames
        if config.adapter_bytes is None and deployment is not None and deployment.lora_bytes_per_rank:
            config = config.replace(adapter_bytes=config.lora_rank * deployment.lora_bytes_per_rank)
        if deployment is not None and deployment.adapters and config.adapter_bytes:
            page_bytes = page * bytes_per_token
            pages = pool_bytes // page_bytes
            adapter_pages = -(-config.adapter_bytes // page_bytes)
            longest = -(-config.max_model_len_tokens // page)
            if longest + adapter_pages > pages:
                raise ConfigError(f"a request of max_model_len ({config.max_model_len_tokens:,} tokens, {longest:,} pages) "
                                  f"and its tenant's LoRA adapter ({config.adapter_bytes:,} bytes, {adapter_pages:,} "
                                  f"pages) do not fit the pool's {pages:,} pages together, so it could never run",
                                  key=sized_by if adapter_pages > pages // 2 else "max_model_len_tokens",
                                  hint="a smaller lora_rank or adapter_bytes, a smaller max_model_len, or a larger pool")
            notes["adapters"] = (f"a tenant's LoRA adapter, rank {config.lora_rank} on q, k, v and o, takes "
                                 f"{config.adapter_bytes / (1 << 20):.1f} MiB (adapter_bytes {config.adapter_bytes:,})")
        return config, notes

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None,
                 deployment: Deployment | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena, deployment)
        self.page_tokens = config.block_size_tokens
        self.page_bytes = self.page_tokens * bytes_per_token
        self.num_pages = pool_bytes // self.page_bytes
        if self.num_pages == 0:
            raise ConfigError(f"a {pool_bytes:,}-byte pool holds no {self.page_bytes:,}-byte page", key="block_size_tokens")
        self.tail_bytes = pool_bytes - self.num_pages * self.page_bytes
        self.best_fit = config.unified_fit == "best"
        self.growth_fraction = config.unified_growth_fraction
        self.max_pages = -(-self.max_tokens // self.page_tokens)
        self.high_pages = config.unified_high_watermark * self.num_pages
        self.low_pages = config.unified_low_watermark * self.num_pages
        self.adapter_bytes = config.adapter_bytes or 0
        self.adapter_pages = -(-self.adapter_bytes // self.page_bytes)
        self.hot_limit = config.unified_hot_adapters
        self._free = ExtentList()
        self._free.add(0, self.num_pages)
        self.free_pages = self.num_pages
        self._runs = PageRuns()
        self._adapters: dict[object, list[int]] = {}  # key -> [its chain's handle, refcount]
        self._lru: OrderedDict = OrderedDict()  # unpinned adapters, least recently used first
        self.kv_runs = 0
        self.host_bytes = 0
        self.runs_released = self.scattered = 0
        self.evictions = self.evicted_pages = self.adapter_loads = self.adapter_hits = 0
        self.last_acquire_hit = False

    # -- pages -----------------------------------------------------------------------------------

    def _evict_lru(self) -> None:
        """Evict the least recently used unpinned adapter (the caller checked there is one)."""
        key, _ = self._lru.popitem(last=False)
        pages = self._give(self._adapters.pop(key)[0])
        self.evictions += 1
        self.evicted_pages += pages

    def _evict_until(self, free_pages: float) -> None:
        """Evict unpinned adapters, least recently used first, until `free_pages` pages are free
        or none is left."""
        while self._lru and self.free_pages < free_pages:
            self._evict_lru()

    def _after_allocation(self) -> None:
        """The hysteresis band: at or above the high watermark, evict down to the low one."""
        if self.num_pages - self.free_pages >= self.high_pages and self._lru:
            self._evict_until(self.num_pages - self.low_pages)

    @property
    def used_pages(self) -> int:
        """Pages held by requests and adapters."""
        return self.num_pages - self.free_pages

    def _give(self, h: int) -> int:
        """Chain `h`'s pages back to the free ranges, the chain ended; returns how many."""
        pages = self._runs.give_all(h, self._free)
        self.free_pages += pages
        return pages

    def _range(self, pages: int) -> int:
        """The start of a free range of `pages` pages, now taken (best or first fit), or -1."""
        start = self._free.take(pages) if self.best_fit else self._free.take_first(pages)
        if start >= 0:
            self.free_pages -= pages
        return start

    @cython.locals(start=cython.longlong, k=cython.longlong, i=cython.longlong)
    def _take(self, pages: int, contiguous: bool, h: int) -> bool:
        """`pages` pages appended to chain `h` as ranges (one, or with `contiguous` False the
        largest free ranges when no single one holds them); unpinned adapters are evicted for them
        if need be; False, the chain unchanged, when they cannot be had. A growth step appends its
        range to the request's own chain (every growth that does not fit in place passes here)."""
        if self.free_pages < pages:
            self._evict_until(pages)
            if self.free_pages < pages:
                return False
        start = self._range(pages)
        if start < 0 and self._lru:
            self._evict_until(self.num_pages)  # every unpinned adapter out: the free ranges coalesce
            start = self._range(pages)
        if start >= 0:
            self._runs.append(h, start, pages)
            return True
        if contiguous:
            return False
        self.scattered += 1
        k = self._free.take_largest_first(pages)  # the largest free range first (the lowest on a tie)
        if k < 0:
            raise InvariantError("free pages counted but not found in the free ranges")
        for i in range(k):
            self._runs.append(h, self._free.piece_start(i), self._free.piece_size(i))
        self.free_pages -= pages
        return True

    # -- the operations --------------------------------------------------------------------------

    @cython.locals(pages=cython.longlong, h=cython.longlong)
    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        self._admit(request_id, prompt_tokens)
        pages = prompt_pages(prompt_tokens, self.page_tokens)
        h = self._runs.new()
        if not self._take(pages, False, h):
            self._runs.discard(h)
            self.failed_reserves += 1
            return None
        self.kv_runs += self._runs.runs(h)
        a = Allocation(request_id, self._runs.first_page(h) * self.page_bytes, pages * self.page_bytes,
                       pages * self.page_tokens, prompt_tokens, None, "main")
        a.handle = h
        self._admitted(a)
        self._after_allocation()
        return a

    def reservation_tokens(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> int:
        return prompt_pages(prompt_tokens, self.page_tokens) * self.page_tokens

    def room_for(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> bool:
        """As many pages free, or freed by evicting the unpinned adapters, as `reserve` takes."""
        return prompt_pages(prompt_tokens, self.page_tokens) <= self.free_pages + len(self._lru) * self.adapter_pages

    @cython.locals(held=cython.longlong, need=cython.longlong, extra=cython.longlong, a=Allocation,
                   total=cython.longlong, step=cython.longlong)
    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        self._growth(allocation, total_tokens)
        a = allocation  # compiled, a typed local: `_growth` found it this allocator's live Allocation
        self.extends += 1
        if total_tokens > self.max_tokens and total_tokens > a.capacity_tokens:
            self.failed_extends += 1
            return False
        total = total_tokens  # compiled, a C integer: at most max_model_len or the pages held
        held = a.capacity_tokens // self.page_tokens
        need = -(-total // self.page_tokens) - held
        if need > 0:
            step = int(held * self.growth_fraction)  # compiled, truncated in C: held is far below 2**53
            extra = self._grow(a.handle, need, max(need, min(step, self.max_pages - held)))
            if extra == 0:
                self.failed_extends += 1
                return False
            a.nbytes += extra * self.page_bytes
            a.capacity_tokens += extra * self.page_tokens
            self.reserved_bytes += extra * self.page_bytes
            if self.reserved_bytes > self.peak_reserved_bytes:
                self.peak_reserved_bytes = self.reserved_bytes
            self._after_allocation()
        a.used_tokens = total_tokens
        return True

    @cython.locals(end=cython.longlong, pages=cython.longlong, tries=cython.longlong, k=cython.longlong,
                   last=cython.longlong, held=cython.longlong)
    def _grow(self, h: int, need: int, step: int) -> int:
        """Add `step` pages to chain `h` (a request's), or failing that `need` (<= step): in place
        after its last range when those pages are free, else as new ranges; returns the pages
        added, 0 when not even `need` can be had."""
        last = self._runs.last(h)
        end = self._runs.end(last)
        pages = self._free.take_at(end, step, need)
        if pages:
            self._runs.widen(last, pages)
            self.free_pages -= pages
            return pages
        tries = 2 if step > need else 1  # the sizes tried: step, then need (no list: every growth passes here)
        held = self._runs.runs(h)
        for k in range(tries):
            pages = need if k == tries - 1 else step
            if self._take(pages, False, h):
                self._runs.join_next(h, last)  # eviction freed the pages right after: still in place
                self.kv_runs += self._runs.runs(h) - held
                return pages
        return 0

    @cython.locals(runs=cython.longlong, a=Allocation)
    def release(self, allocation: Allocation, final_tokens: int | None = None) -> None:
        self._own(allocation)
        a = allocation  # compiled, a typed local: `_own` found it this allocator's live Allocation
        if final_tokens is not None:  # growth past the pages held is not taken: they go back at once
            self._final_growth(a, final_tokens, self.max_tokens)
        runs = self._runs.runs(a.handle)
        self._give(a.handle)
        a.handle = -1
        self.kv_runs -= runs
        self.runs_released += runs
        self._forget(a)

    def runs_of(self, allocation: Allocation, kv_tokens: int) -> int:
        """The page ranges request `allocation` holds: its KV runs per KV head, K and V, per layer.
        Its chain is read only once `_own` found it live here (a handle indexes unchecked)."""
        self._own(allocation)
        return self._runs.runs(allocation.handle)

    def page_ranges(self, request_id: str) -> list[int]:
        """Live request `request_id`'s page ranges, as [start, pages, ...] in the order it took them."""
        return self._runs.tolist(self._live[request_id].handle)

    def mean_released_runs(self) -> float | None:
        """The mean page ranges a request held at its release."""
        return self.runs_released / self.releases if self.releases else 0.0

    # -- adapters (ADR-006 §9: AdapterManager.acquire / release): the AdapterCache ----------------

    def adapter_cache(self):
        return self if self.adapter_pages > 0 else None

    def acquire_adapter(self, key) -> bool:
        """Pin adapter `key` for a request about to run: resident, its refcount goes up (a hit);
        else it is loaded from host memory into a page range (its bytes cross the host link),
        evicting unpinned adapters for room and to stay within the hot tier. False: no room."""
        if self.adapter_pages <= 0:  # a load of no pages would look for an empty range forever
            raise AllocationError("this allocator keeps no LoRA adapters (adapter_bytes is 0): give it adapter_bytes, "
                                  "or a lora_rank with a deployment that names the bytes per rank")
        entry = self._adapters.get(key)
        self.last_acquire_hit = entry is not None
        if entry is not None:
            if entry[1] == 0:
                del self._lru[key]
            entry[1] += 1
            self.adapter_hits += 1
            return True
        if len(self._adapters) >= self.hot_limit:
            if not self._lru:
                return False
            self._evict_lru()  # the hot tier is full: the least recently used unpinned adapter makes room
        h = self._runs.new()
        if not self._take(self.adapter_pages, True, h):  # one range
            self._runs.discard(h)
            return False
        self._adapters[key] = [h, 1]  # pinned once
        self.adapter_loads += 1
        self.host_bytes += self.adapter_bytes
        self._after_allocation()
        return True

    def release_adapter(self, key, admitted: bool = True) -> None:
        """Unpin adapter `key` once: a request using it left the batch, or (`admitted` False) the
        request it was just acquired for could not be admitted after all, which takes back that
        acquire's hit (its load, if it was one, happened: the bytes crossed the link)."""
        entry = self._adapters[key]
        if entry[1] <= 0:
            raise InvariantError(f"adapter {key!r} released more times than acquired")
        if not admitted and self.last_acquire_hit:
            self.adapter_hits -= 1
        entry[1] -= 1
        if entry[1] == 0:
            self._lru[key] = None

    # -- reporting and checks --------------------------------------------------------------------

    policy_totals = ("kv_runs_released", "scattered_takes", "evictions", "evicted_bytes", "adapter_loads",
                     "adapter_hits")

    def policy_counters(self) -> dict[str, int]:
        return {"kv_runs": self.kv_runs, "kv_runs_released": self.runs_released, "scattered_takes": self.scattered,
                "evictions": self.evictions, "evicted_bytes": self.evicted_pages * self.page_bytes,
                "adapter_loads": self.adapter_loads, "adapter_hits": self.adapter_hits,
                "resident_adapters": len(self._adapters)}

    def _ranges_of(self, ranges: list[int]) -> list[tuple[int, int]]:
        return [(ranges[j] * self.page_bytes, ranges[j + 1] * self.page_bytes) for j in range(0, len(ranges), 2)]

    def _ranges(self, a: Allocation) -> list[tuple[int, int]]:
        self._own(a)
        return self._ranges_of(self._runs.tolist(a.handle))

    def _other_spans(self) -> list[tuple[int, int, str]]:
        return [(start, nbytes, f"adapter {key!r}") for key, (h, _) in self._adapters.items()
                for start, nbytes in self._ranges_of(self._runs.tolist(h))]

    def free_extents(self) -> list[tuple[int, int]]:
        return with_tail([[s * self.page_bytes, n * self.page_bytes] for s, n in self._free.tolist()],
                         self.num_pages * self.page_bytes, self.tail_bytes)

    def _region_stats(self) -> dict[str, RegionStats]:
        return {"main": RegionStats.of(self.pool_bytes, self.free_extents())}

    def _check_structures(self) -> None:
        free = sum(n for _, n in self._free.tolist())
        kv = {rid: self._runs.tolist(a.handle) for rid, a in self._live.items()}
        adapters = {key: self._runs.tolist(h) for key, (h, _) in self._adapters.items()}
        assert free == self.free_pages, f"free pages counter {self.free_pages}, extents hold {free}"
        assert free + sum(sum(r[1::2]) for r in [*kv.values(), *adapters.values()]) == self.num_pages, \
            "pages lost or doubled"
        assert self.kv_runs == sum(len(r) // 2 for r in kv.values()), "kv_runs counter drifted"
        assert all(len(r) == 2 for r in adapters.values()), "an adapter holds other than one range"
        assert self._runs.nodes_in_use() == sum(len(r) // 2 + 1 for r in [*kv.values(), *adapters.values()]), \
            "page-range chains held by no live request or adapter"
        for rid, a in self._live.items():
            r = kv[rid]
            assert a.capacity_tokens == sum(r[1::2]) * self.page_tokens, f"request '{rid}' capacity"
            assert a.offset_bytes == r[0] * self.page_bytes, f"request '{rid}' offset is not its first page"
        for key, (_, refs) in self._adapters.items():
            assert refs >= 0 and (refs == 0) == (key in self._lru), f"adapter {key!r}: refcount {refs} and LRU disagree"
        assert set(self._lru) <= set(self._adapters), "an evicted adapter is still in the LRU"
        assert len(self._adapters) <= max(self.hot_limit, 0) or not self._adapters, "more adapters than the hot tier"
