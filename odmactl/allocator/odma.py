"""`odma`: one contiguous block per request sized from the predicted length (the ODMA papers)."""

from __future__ import annotations

import dataclasses
from array import array
from bisect import bisect_left

import numpy as np

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation
from odmactl.allocator.config import AllocatorConfig
from odmactl.allocator.contiguous import ContiguousAllocator
from odmactl.core.errors import ConfigError
from odmactl.rules.buckets import SlidingWindowRefit, quantile_boundaries
from odmactl.rules.odma import equal_width_boundaries
from odmactl.rules.odma import need_tokens as need_rule

LARGE = "large"


def large_pool_bytes(pool_bytes: int, block_bytes: int, config: AllocatorConfig) -> int:
    """The large pool's size: whole blocks of max_model_len tokens, rounded down."""
    wanted = config.large_pool_bytes if config.large_pool_bytes is not None else int(pool_bytes * config.large_pool_fraction)
    if wanted > pool_bytes:
        raise ConfigError(f"large pool of {wanted:,} bytes exceeds the {pool_bytes:,}-byte pool", key="large_pool_bytes")
    if 0 < wanted < block_bytes:
        raise ConfigError(
            f"large pool of {wanted:,} bytes holds no block of max_model_len_tokens = {config.max_model_len_tokens} "
            f"({block_bytes:,} bytes); make it larger or 0", key="large_pool_bytes")
    return wanted // block_bytes * block_bytes


class OdmaAllocator(ContiguousAllocator):
    """Regions "main" (bucket blocks) then "large" (the reserved large pool, blocks of
    max_model_len tokens). A request needs prompt + ceil(L_hat * (1 + gamma * u)) KV tokens (or,
    with a hedge table, prompt + the table's output count for L_hat's group) and gets
    the smallest bucket boundary >= that in "main"; it goes to "large" when u > tau, when it has no
    prediction, or when the need exceeds the last boundary. Growing past the block migrates into
    "large" (allocate, contiguous copy, release) or fails. Boundaries change only through
    `set_boundaries` (or the sliding-window refit on release) and apply to new reservations only:
    a live allocation keeps its block and its bucket index of the boundaries it was given.
    """

    name = "odma"
    uses_predictions = True  # sizes reservations from predicted lengths: a replay without a predictor must say so

    @classmethod
    def complete_config(cls, config: AllocatorConfig, *, pool_bytes: int, bytes_per_token: int,
                        realized_kv_tokens: np.ndarray, deployment=None) -> tuple[AllocatorConfig, dict]:
        """What a replay leaves open, filled in (AllocatorBase.complete_config): without
        boundaries, quantile boundaries of the realized KV lengths of the first `refit_window`
        requests (a warm start, as if that window had been observed before), refitted online from
        then on; without a large-pool size, `large_pool_fraction` of the pool, raised to one
        max_model_len block when smaller (a request past the last boundary needs one)."""
        notes: dict = {}
        max_len = config.max_model_len_tokens
        if not config.boundaries_tokens:
            window = np.asarray(realized_kv_tokens)[: config.refit_window]
            bounds = quantile_boundaries(window, config.num_buckets, granularity_tokens=config.granularity_tokens,
                                         max_tokens=max_len, levels=config.quantile_levels)
            config = dataclasses.replace(config, boundaries_tokens=bounds)
            notes["initial_boundaries"] = f"quantiles of the first {window.size:,} requests' KV lengths"
        block = max_len * bytes_per_token
        if config.large_pool_bytes is None and pool_bytes * config.large_pool_fraction < block:
            if block > pool_bytes:
                raise ConfigError(f"one max_model_len block ({max_len:,} tokens) does not fit the KV pool "
                                  f"({pool_bytes // bytes_per_token:,} tokens): odma's large pool needs one",
                                  hint=f"a max_model_len up to {pool_bytes // bytes_per_token:,}")
            config = dataclasses.replace(config, large_pool_bytes=block)
            notes["large_pool"] = "raised to one max_model_len block"
        return config, notes

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena)
        self.large_block_bytes = self.max_tokens * bytes_per_token
        large = large_pool_bytes(pool_bytes, self.large_block_bytes, config)
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
            levels=config.quantile_levels) if config.refit else None
        # realized KV lengths since the last refresh; array('q') appends as cheaply as a list and
        # hands numpy its buffer without a copy
        self._realized = array("q") if config.refit else None
        self._realized_batch = config.refit_every
        self._deferred = config.refit_mode == "deferred"
        self.refit_due = False  # deferred mode: a batch is complete and flush_refit() should run
        self.routed_large = 0

    def set_boundaries(self, boundaries_tokens: tuple[int, ...] | list[int]) -> None:
        """Replace the bucket upper bounds (KV tokens) for reservations from now on."""
        b = tuple(int(x) for x in boundaries_tokens)
        if not b or list(b) != sorted(set(b)) or b[0] < 1 or b[-1] > self.max_tokens:
            raise ConfigError(f"bucket boundaries must be strictly increasing token counts in 1..{self.max_tokens}, "
                              f"got {list(b)}", key="boundaries_tokens")
        self.boundaries_tokens = b

    def need_tokens(self, prompt_tokens: int, predicted_output_tokens: int, uncertainty: float | None) -> int:
        """KV tokens to reserve by this allocator's settings (rules/odma.py)."""
        return need_rule(prompt_tokens, predicted_output_tokens, uncertainty, self.gamma, self.hedge_edges,
                         self.hedge_output_tokens)

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        if request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens:
            self._admit(request_id, prompt_tokens)
        if predicted_output_tokens is not None and (uncertainty is None or uncertainty <= self.tau):
            need = need_rule(prompt_tokens, predicted_output_tokens, uncertainty, self.gamma, self.hedge_edges,
                             self.hedge_output_tokens)
            boundaries = self.boundaries_tokens
            if need <= boundaries[-1]:
                bucket = bisect_left(boundaries, need)
                return self._reserve_in(self._main, "main", request_id, boundaries[bucket], prompt_tokens, bucket)
        self.routed_large += 1
        return self._reserve_in(self._large, LARGE, request_id, self.max_tokens, prompt_tokens, LARGE)

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        if self._grow_in_place(allocation, total_tokens):
            return True
        if allocation.region == LARGE or total_tokens > self.max_tokens:
            self.failed_extends += 1
            return False
        return self._migrate(allocation, LARGE, self.max_tokens, LARGE, total_tokens)

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

    policy_totals = ("routed_large", "boundary_updates", "refits")

    def policy_counters(self) -> dict[str, int]:
        return {"routed_large": self.routed_large, "boundary_updates": self.boundary_updates,
                "refits": self.refitter.refits if self.refitter else 0}
