"""`odma`: one contiguous block per request sized from the predicted length (the ODMA papers)."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation
from odmactl.allocator.config import AllocatorConfig, Deployment, PolicySettings, one_of, whole_numbers
from odmactl.allocator.contiguous import ContiguousAllocator
from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_BUCKETS, MAX_GAMMA, MAX_TOKENS, MAX_WINDOW_REQUESTS, whole_number_problem
from odmactl.rules.buckets import LEVEL_SHAPES, SlidingWindowRefit, bucket_levels, quantile_boundaries, shaped_levels
from odmactl.rules.odma import equal_width_boundaries
from odmactl.rules.odma import large_slot_tokens
from odmactl.rules.odma import need_tokens as need_rule

LARGE = "large"
LARGE_TAGS = {"main": ("main", LARGE), LARGE: (LARGE, LARGE)}  # tag_of's large tags, by the region of the block
REFIT_MODES = ("inline", "deferred")
NEVER = "never"  # tau = "never": no uncertainty sends a request to the large pool (tau infinite)
TAU_EXPECTED = f'a number >= 0 or "{NEVER}"'


def tau_setting(tau: float) -> float | str:
    """tau as a config and the JSON write it: "never" for infinity (TOML and JSON have none)."""
    return tau if math.isfinite(tau) else NEVER


@dataclass(frozen=True)
class OdmaSettings(PolicySettings):
    """ODMA's buckets, hedge, large pool and refit.

    Token counts are KV tokens (prompt + generated). `boundaries_tokens` are bucket upper bounds,
    strictly increasing; empty means B equal-width buckets over max_model_len until the first
    refit (a replay fills them in: OdmaAllocator.complete_config). `quantile_levels` empty:
    top_quantile * i / num_buckets (equal occupancy of the regular buckets below the top
    quantile; the tail past it goes to the large pool); a shape's name ("equal", "tail":
    rules/buckets.py) stands for its levels at num_buckets below top_quantile and is replaced by
    them; levels given as numbers are used as they are. The large pool is `large_pool_bytes`, or
    `large_pool_fraction` of the pool when that is None; each large-pool block holds what its
    request can still need (rules/odma.large_slot_tokens: prompt + the output cap, or
    max_model_len without one), so it never overflows. With `large_spill`, a large block that finds
    no room in the large pool at admission is carved from the main pool instead, when it has room
    (the papers are silent on a full large pool at admission: docs/policies.md). A hedge table (rules/hedge.py) in place of gamma: need = prompt +
    hedge_output_tokens[g], g the group of L_hat among hedge_edges; empty: the gamma rule.
    `refit_mode` "inline" refreshes the boundaries inside the release that completes a batch of
    `refit_every`; "deferred" only raises `refit_due` there and leaves `flush_refit()` to the
    caller, off the reserve/release path (the papers run it on a background thread).
    Invariant: tau is a number >= 0 (infinity for "never"), quantile_levels a tuple of levels."""

    SEQUENCES = ("boundaries_tokens", "quantile_levels", "hedge_edges", "hedge_output_tokens")

    num_buckets: int = 4
    top_quantile: float = 0.99
    quantile_levels: tuple[float, ...] | str = ()
    boundaries_tokens: tuple[int, ...] = ()
    gamma: float = 0.2
    tau: float | str = 0.8  # "never" (NEVER) is infinity, and is replaced by it
    hedge_edges: tuple[float, ...] = ()
    hedge_output_tokens: tuple[int, ...] = ()
    large_pool_bytes: int | None = None
    large_pool_fraction: float = 0.1
    large_spill: bool = False
    granularity_tokens: int = 16
    refit: bool = True
    refit_mode: str = "inline"
    refit_window: int = 10_000
    refit_every: int = 1_000

    def __post_init__(self) -> None:
        self._named_settings()
        whole_numbers(self, ("num_buckets", 1, MAX_BUCKETS), ("granularity_tokens", 1, MAX_TOKENS),
                      ("refit_window", 1, MAX_WINDOW_REQUESTS), ("refit_every", 1, MAX_WINDOW_REQUESTS))
        one_of(self, "refit_mode", REFIT_MODES)
        if not (0 <= self.gamma <= MAX_GAMMA):
            raise ConfigError(f"expected a number from 0 to {MAX_GAMMA:g}, got {self.gamma!r}", key="gamma")
        if not (self.tau >= 0):
            raise ConfigError(f"expected {TAU_EXPECTED}, got {self.tau!r}", key="tau")
        if isinstance(self.top_quantile, bool) or not isinstance(self.top_quantile, (int, float)) \
                or not 0 < self.top_quantile <= 1:
            raise ConfigError(f"expected a quantile level in (0, 1], got {self.top_quantile!r}", key="top_quantile")
        if not (0 <= self.large_pool_fraction < 1):
            raise ConfigError(f"expected a fraction in [0, 1), got {self.large_pool_fraction!r}", key="large_pool_fraction")
        if self.large_pool_bytes is not None and not (isinstance(self.large_pool_bytes, int) and self.large_pool_bytes >= 0):
            raise ConfigError(f"expected a byte count >= 0, got {self.large_pool_bytes!r}", key="large_pool_bytes")
        q = self.quantile_levels
        if q and (len(q) != self.num_buckets or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in q)
                  or list(q) != sorted(set(q)) or not 0 < q[0] or q[-1] > 1):
            raise ConfigError(f"expected num_buckets ({self.num_buckets}) strictly increasing levels in (0, 1], "
                              f"got {list(q)}", key="quantile_levels")
        self._check_hedge()
        b = self.boundaries_tokens
        if any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in b) or list(b) != sorted(set(b)):
            raise ConfigError(f"expected strictly increasing token counts >= 1, got {list(b)}", key="boundaries_tokens")

    def _check_hedge(self) -> None:
        if not (self.hedge_edges or self.hedge_output_tokens):
            return
        edges, tokens = self.hedge_edges, self.hedge_output_tokens
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in edges) or list(edges) != sorted(set(edges)):
            raise ConfigError(f"expected strictly increasing predicted lengths, got {list(edges)}", key="hedge_edges")
        if any(not isinstance(x, int) or isinstance(x, bool) or not 1 <= x <= MAX_TOKENS for x in tokens):
            raise ConfigError(f"expected token counts from 1 to {MAX_TOKENS:,} (every request generates a token), "
                              f"got {list(tokens)}", key="hedge_output_tokens")
        if len(tokens) != len(edges) + 1:
            raise ConfigError(f"expected one more count than hedge_edges ({len(edges) + 1}), got {len(tokens)}",
                              key="hedge_output_tokens")

    def check(self, max_model_len_tokens: int) -> None:
        b = self.boundaries_tokens
        if b and b[-1] > max_model_len_tokens:
            raise ConfigError(f"the last boundary ({b[-1]}) exceeds max_model_len_tokens ({max_model_len_tokens})",
                              key="boundaries_tokens")

    def _named_settings(self) -> None:
        """Replace the named settings by their values: tau "never" by infinity, a level shape's
        name by its levels at num_buckets."""
        if isinstance(self.tau, str):
            if self.tau != NEVER:
                raise ConfigError(f"expected {TAU_EXPECTED}, got {self.tau!r}", key="tau")
            object.__setattr__(self, "tau", math.inf)
        elif isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)):
            raise ConfigError(f"expected {TAU_EXPECTED}, got {self.tau!r}", key="tau")
        for name in self.SEQUENCES:
            value = getattr(self, name)
            named = name == "quantile_levels" and isinstance(value, str) and value in LEVEL_SHAPES
            if not isinstance(value, (tuple, list)) and not named:
                known = f" or one of {', '.join(LEVEL_SHAPES)}" if name == "quantile_levels" else ""
                raise ConfigError(f"expected a list{known}, got {value!r}", key=name)
        top_ok = not isinstance(self.top_quantile, bool) and isinstance(self.top_quantile, (int, float)) \
            and 0 < self.top_quantile <= 1
        if isinstance(self.quantile_levels, str) and whole_number_problem(self.num_buckets, 1, MAX_BUCKETS) is None \
                and top_ok:  # a bad num_buckets or top_quantile: the checks below say so
            object.__setattr__(self, "quantile_levels",
                               shaped_levels(self.num_buckets, self.quantile_levels, self.top_quantile))

    def levels(self) -> tuple[float, ...]:
        """The quantile levels the boundaries are fitted at (the class docstring)."""
        return bucket_levels(self.num_buckets, self.quantile_levels, self.top_quantile)

    def settable(self) -> dict[str, object]:
        return {**super().settable(), "tau": tau_setting(self.tau)}

    def to_mapping(self) -> dict[str, object]:
        out = super().to_mapping()
        out["tau"] = tau_setting(self.tau)
        if not (self.hedge_edges or self.hedge_output_tokens):  # written only when a table is set
            del out["hedge_edges"], out["hedge_output_tokens"]
        return out


def levels_of(config: AllocatorConfig) -> tuple[float, ...]:
    """The quantile levels odma fits its boundaries at (OdmaSettings' docstring)."""
    return bucket_levels(config.num_buckets, config.quantile_levels, config.top_quantile)


def large_pool_bytes(pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, max_new_tokens: int) -> int:
    """The large pool's size in whole tokens. Without an output cap every large block holds
    max_model_len tokens, so the pool is whole such blocks (rounded down), and one that holds none
    is refused; with a cap, blocks are sized per request and placed best-fit, like the main pool's."""
    wanted = config.large_pool_bytes if config.large_pool_bytes is not None else int(pool_bytes * config.large_pool_fraction)
    if wanted > pool_bytes:
        raise ConfigError(f"large pool of {wanted:,} bytes exceeds the {pool_bytes:,}-byte pool", key="large_pool_bytes")
    block_bytes = config.max_model_len_tokens * bytes_per_token
    if max_new_tokens:
        return wanted // bytes_per_token * bytes_per_token
    if 0 < wanted < block_bytes:
        raise ConfigError(
            f"large pool of {wanted:,} bytes holds no block of max_model_len_tokens = {config.max_model_len_tokens} "
            f"({block_bytes:,} bytes), and outputs are not capped (--max-new-tokens), so every large block is one; "
            "make it larger or 0", key="large_pool_bytes")
    return wanted // block_bytes * block_bytes


class OdmaAllocator(ContiguousAllocator):
    """Regions "main" (bucket blocks) then "large" (the reserved large pool). A request needs
    prompt + ceil(L_hat * (1 + gamma * u)) KV tokens (or, with a hedge table, prompt + the
    table's output count for L_hat's group) and gets the smallest bucket boundary >= that in
    "main" (at most its large block: no block holds more than the request can reach); it goes to
    "large" when u > tau, when it has no prediction (a preempted request whose prediction is
    spent), when the need exceeds the last boundary, or when its bucket's block is more than the
    main pool could ever hold (and a large block the large pool is too small to ever hold is placed
    in "main"). A large block holds what the request can
    still need (rules/odma.large_slot_tokens: prompt + the output cap, else max_model_len; kept
    in `Allocation.limit_tokens`). Growing past the block migrates into "large" (allocate,
    contiguous copy, release, seeds/001 §3.4) or, the large pool full, fails; the replay then
    stalls the request in place until a release (`overflow_waits`), as the papers migrate every
    overflow and never preempt. Boundaries change only through
    `set_boundaries` (or the sliding-window refit on release) and apply to new reservations only:
    a live allocation keeps its block and its bucket index of the boundaries it was given.
    """

    name = "odma"
    scheduler = "task_pool"  # the papers' Task Pool (seeds/001 §3.1; sim/schedulers/task_pool.py)
    settings = (OdmaSettings,)
    uses_predictions = True  # sizes reservations from predicted lengths: a replay without a predictor must say so

    @classmethod
    def describe(cls, config: dict) -> str | None:
        """Said only where it differs from the papers' reading (large_spill off)."""
        return "odma: a large block the full large pool cannot take spills to the main pool (large_spill)" \
            if config.get("large_spill") else None

    @classmethod
    def complete_config(cls, config: AllocatorConfig, *, pool_bytes: int, bytes_per_token: int,
                        realized_kv_tokens: np.ndarray, deployment=None) -> tuple[AllocatorConfig, dict]:
        """What a replay leaves open, filled in (AllocatorBase.complete_config): without
        boundaries, quantile boundaries of the realized KV lengths of the first `refit_window`
        requests (a warm start, as if that window had been observed before), refitted online from
        then on; without a large-pool size, `large_pool_fraction` of the pool, raised to the
        largest large block when smaller (a request past the last boundary needs one: max_model_len,
        or with an output cap the window's longest KV + the cap, at most max_model_len)."""
        notes: dict = {}
        max_len = config.max_model_len_tokens
        if not config.boundaries_tokens:
            window = np.asarray(realized_kv_tokens)[: config.refit_window]
            bounds = quantile_boundaries(window, config.num_buckets, granularity_tokens=config.granularity_tokens,
                                         max_tokens=max_len, levels=levels_of(config))
            config = config.replace(boundaries_tokens=bounds)
            notes["initial_boundaries"] = f"quantiles of the first {window.size:,} requests' KV lengths"
        cap = deployment.max_new_tokens if deployment is not None else 0
        realized = np.asarray(realized_kv_tokens)[: config.refit_window]
        largest = large_slot_tokens(int(realized.max()) if realized.size else max_len, cap, max_len)
        block = largest * bytes_per_token
        if config.large_pool_bytes is None and pool_bytes * config.large_pool_fraction < block:
            if block > pool_bytes:
                raise ConfigError(f"one large block ({largest:,} tokens) does not fit the KV pool "
                                  f"({pool_bytes // bytes_per_token:,} tokens): odma's large pool needs one",
                                  hint=f"a max_model_len up to {pool_bytes // bytes_per_token:,}")
            config = config.replace(large_pool_bytes=block)
            notes["large_pool"] = f"raised to one large block ({largest:,} tokens)"
        return config, notes

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None,
                 deployment: Deployment | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena, deployment)
        self.max_new_tokens = self.deployment.max_new_tokens  # the output cap (0: none): large blocks' size
        self.large_block_bytes = self.max_tokens * bytes_per_token  # the largest a large block may be
        large = large_pool_bytes(pool_bytes, bytes_per_token, config, self.max_new_tokens)
        self._init_regions({"main": pool_bytes - large, LARGE: large})
        self._large = self.regions[LARGE]
        self.gamma = config.gamma
        self.tau = config.tau
        # the hedge table (odmactl/rules/hedge.py), when the config has one: group edges over L_hat and
        # each group's output reservation; None: the gamma rule
        self.hedge_edges = tuple(float(x) for x in config.hedge_edges)
        self.hedge_output_tokens = tuple(config.hedge_output_tokens) or None
        self.set_boundaries(config.boundaries_tokens or
                            equal_width_boundaries(self.max_tokens, config.num_buckets, config.granularity_tokens))
        self.refitter = SlidingWindowRefit(
            window=config.refit_window, refresh_every=config.refit_every, num_buckets=config.num_buckets,
            granularity_tokens=config.granularity_tokens, max_tokens=self.max_tokens,
            levels=levels_of(config)) if config.refit else None
        # realized KV lengths since the last refresh; array('q') appends as cheaply as a list and
        # hands numpy its buffer without a copy
        self._realized = array("q") if config.refit else None
        self._realized_batch = config.refit_every
        self._deferred = config.refit_mode == "deferred"
        self.refit_due = False  # deferred mode: a batch is complete and flush_refit() should run
        self.routed_large = 0
        self.large_spill = config.large_spill
        self.large_spills = 0  # large blocks carved from the main pool because the large pool was full
        self.peak_large_bytes = 0  # the most bytes large blocks held at once (plan sizes the large pool by it)

    def set_boundaries(self, boundaries_tokens: tuple[int, ...] | list[int]) -> None:
        """Replace the bucket upper bounds (KV tokens) for reservations from now on."""
        b = tuple(int(x) for x in boundaries_tokens)
        if not b or list(b) != sorted(set(b)) or b[0] < 1 or b[-1] > self.max_tokens:
            raise ConfigError(f"bucket boundaries must be strictly increasing token counts in 1..{self.max_tokens}, "
                              f"got {list(b)}", key="boundaries_tokens")
        self.boundaries_tokens = b
        self._bucket_tags = tuple([("main", k) for k in range(len(b))])  # tag_of's, made once per boundaries
        self._bounds = array("q", b)  # the boundaries as int64s, which _route searches in C
        # the largest boundary whose block the main pool can hold (0: none): a need up to it has a bucket
        self._main_top = max([x for x in b if x * self.bytes_per_token <= self._main.size_bytes], default=0)

    def need_tokens(self, prompt_tokens: int, predicted_output_tokens: int, uncertainty: float | None) -> int:
        """KV tokens to reserve by this allocator's settings (rules/odma.py)."""
        return need_rule(prompt_tokens, predicted_output_tokens, uncertainty, self.gamma, self.hedge_edges,
                         self.hedge_output_tokens)

    def _route(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> int:
        """Where a request's block goes (the class docstring): its bucket index, or -1 for the
        large pool (also for a bucket whose block the main pool is too small to ever hold)."""
        if predicted_output_tokens is not None and (uncertainty is None or uncertainty <= self.tau):
            need = need_rule(prompt_tokens, predicted_output_tokens, uncertainty, self.gamma, self.hedge_edges,
                             self.hedge_output_tokens)
            if need <= self._main_top:  # the buckets whose block the main pool holds are the first ones
                lo, hi = 0, len(self._bounds) - 1  # the first boundary >= need (bisect_left): one is
                while lo < hi:
                    mid = (lo + hi) // 2
                    if self._bounds[mid] < need:
                        lo = mid + 1
                    else:
                        hi = mid
                return lo
        return -1

    def _block_tokens(self, bucket: int, slot_tokens: int) -> int:
        """The block of a request routed to `bucket` (-1: the large pool) whose large block would
        be `slot_tokens`: no bucket's block holds more than that (the module docstring)."""
        if bucket < 0:
            return slot_tokens
        capacity = self._bounds[bucket]
        return capacity if capacity < slot_tokens else slot_tokens

    def reservation_tokens(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> int:
        """A new request's block, in whichever pool `reserve` takes it from."""
        return self._block_tokens(self._route(prompt_tokens, predicted_output_tokens, uncertainty),
                                  large_slot_tokens(prompt_tokens, self.max_new_tokens, self.max_tokens))

    def tag_of(self, prompt_tokens: int, predicted_output_tokens, uncertainty):
        """The papers' bucket tag, with the pool its block comes from: ("main", bucket index), or
        ("large", "large") (("main", "large") where the large pool could never hold the block)."""
        bucket = self._route(prompt_tokens, predicted_output_tokens, uncertainty)
        if bucket >= 0:
            return self._bucket_tags[bucket]
        return LARGE_TAGS[self._large_home(large_slot_tokens(prompt_tokens, self.max_new_tokens, self.max_tokens))]

    def _large_home(self, slot_tokens: int) -> str:
        """The region a large block of `slot_tokens` goes to: the large pool, or "main" where the
        large pool is too small to ever hold it."""
        return "main" if slot_tokens * self.bytes_per_token > self._large.size_bytes else LARGE

    def room_for(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> bool:
        """Whether `reserve` would place the request's block now: the regions it tries, in its
        order (tests/test_allocator_api.py holds the two to agreeing), taking nothing."""
        slot = large_slot_tokens(prompt_tokens, self.max_new_tokens, self.max_tokens)
        bucket = self._route(prompt_tokens, predicted_output_tokens, uncertainty)
        if bucket >= 0:
            return self._main.can_take(self._block_tokens(bucket, slot) * self.bytes_per_token)
        region = self._large_home(slot)
        nbytes = slot * self.bytes_per_token
        return self.regions[region].can_take(nbytes) or (region == LARGE and self.large_spill
                                                         and self._main.can_take(nbytes))

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        """The block `_route` picks, in the region it belongs to (a large block in the main pool
        where the large pool could never hold it, or, with `large_spill`, where the large pool is
        full); `room_for` asks the same without placing."""
        if request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens:
            self._admit(request_id, prompt_tokens)
        slot = large_slot_tokens(prompt_tokens, self.max_new_tokens, self.max_tokens)
        bucket = self._route(prompt_tokens, predicted_output_tokens, uncertainty)
        if bucket >= 0:
            a = self._reserve_in(self._main, "main", request_id, self._block_tokens(bucket, slot), prompt_tokens, bucket)
        else:
            region = self._large_home(slot)
            a = self._reserve_in(self.regions[region], region, request_id, slot, prompt_tokens, LARGE)
            if a is None and region == LARGE and self.large_spill:
                region = "main"
                a = self._reserve_in(self._main, region, request_id, slot, prompt_tokens, LARGE)
                if a is not None:
                    self.large_spills += 1
            if a is not None and region == LARGE:
                self._large_peak()
            if a is not None:
                self.routed_large += 1  # given a large block (in the large pool, or in main where that pool
                # can never hold it); an attempt that found no room is not counted
        if a is not None:
            a.limit_tokens = slot
        return a

    def _large_peak(self) -> None:
        held = self._large.size_bytes - self._large.free_bytes
        if held > self.peak_large_bytes:
            self.peak_large_bytes = held

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        if self._grow_in_place(allocation, total_tokens):
            return True
        if allocation.bucket == LARGE or total_tokens > allocation.limit_tokens:
            self.failed_extends += 1
            return False
        if self._migrate(allocation, LARGE, allocation.limit_tokens, LARGE, total_tokens):
            self._large_peak()
            return True
        return False

    def room_version(self, tag) -> tuple:
        """Blocks given back to the tag's pool (with `large_spill`, a large tag's blocks may also
        come from the main pool), with the boundary updates (a bucket's block may shrink): a
        reservation that failed cannot succeed before this changes."""
        if tag[0] == LARGE and self.large_spill:
            return (self._large.gives, self._main.gives, self.boundary_updates)
        return (self.regions[tag[0]].gives, self.boundary_updates)

    def overflow_waits(self, allocation: Allocation, total_tokens: int) -> bool:
        """A main-pool block refused growth waits for a large block (stalls in place) when the large
        pool could ever hold it: the papers migrate every overflow into the large bucket and never
        preempt."""
        return (allocation.bucket != LARGE and total_tokens <= allocation.limit_tokens
                and self._large_home(allocation.limit_tokens) == LARGE)

    def _consume_realized(self) -> None:
        if self._deferred:
            self.refit_due = True
        else:
            self.flush_refit()

    def flush_refit(self) -> None:
        """Hand the realized lengths gathered since the last call to the sliding window; new
        boundaries, if a refresh fell due among them, apply to reservations from now on. Inline
        mode calls this from the release that completes each batch of `refit_every`; in deferred
        mode the caller runs it when `refit_due` (the result is the same as inline as long as it
        runs before the next reservation)."""
        self.refit_due = False
        if self.refitter is None or not self._realized:
            return
        fresh = self.refitter.observe_many(np.frombuffer(self._realized, dtype=np.int64))
        del self._realized[:]
        if fresh is not None and fresh != self.boundaries_tokens:
            self.set_boundaries(fresh)
            self.boundary_updates += 1

    policy_totals = ("routed_large", "large_spills", "boundary_updates", "refits")

    def policy_counters(self) -> dict[str, int]:
        return {"routed_large": self.routed_large, "large_spills": self.large_spills,
                "boundary_updates": self.boundary_updates, "refits": self.refitter.refits if self.refitter else 0,
                "peak_large_bytes": self.peak_large_bytes}
