"""`s3`: S3-style static equal-width buckets over the maximum length, chosen from the prediction."""

from __future__ import annotations

from bisect import bisect_left

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation
from odmactl.allocator.config import AllocatorConfig
from odmactl.allocator.contiguous import ContiguousAllocator
from odmactl.rules.s3 import s3_capacities


class S3Allocator(ContiguousAllocator):
    """`s3_num_buckets` equal-width buckets over KV tokens up to max_model_len (rules/s3.py): bucket
    i holds `capacities_tokens[i]` tokens. A request gets the smallest bucket
    holding prompt + predicted output (max_model_len without a prediction); growing past it moves
    the request to the smallest larger bucket that holds the new length (allocate, copy, release)."""

    name = "s3"
    uses_predictions = True  # sizes reservations from predicted lengths: a replay without a predictor must say so

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena)
        self._init_regions({"main": pool_bytes})
        self.capacities_tokens = s3_capacities(self.max_tokens, config.s3_num_buckets)

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        if request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens:
            self._admit(request_id, prompt_tokens)
        if predicted_output_tokens is None:
            need = self.max_tokens
        else:
            need = min(prompt_tokens + max(int(predicted_output_tokens), 0), self.max_tokens)
        bucket = bisect_left(self.capacities_tokens, need)
        return self._reserve_in(self._main, "main", request_id, self.capacities_tokens[bucket], prompt_tokens, bucket)

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        if self._grow_in_place(allocation, total_tokens):
            return True
        if total_tokens > self.max_tokens:
            self.failed_extends += 1
            return False
        bucket = bisect_left(self.capacities_tokens, total_tokens)
        return self._migrate(allocation, "main", self.capacities_tokens[bucket], bucket, total_tokens)
