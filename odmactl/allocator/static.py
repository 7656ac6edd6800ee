"""`static`: worst-case contiguous reservation, the baseline ODMA is measured against."""

from __future__ import annotations

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation
from odmactl.allocator.config import AllocatorConfig
from odmactl.allocator.contiguous import ContiguousAllocator


class StaticAllocator(ContiguousAllocator):
    """One contiguous slot per request: `max_model_len_tokens` (static_slot = "max_model_len"), or
    prompt + `max_new_tokens` capped at max_model_len ("prompt_plus_max_new"). With fixed slots every
    block has one size, so best-fit placement reproduces fixed slot positions. A slot never grows."""

    name = "static"

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena)
        self._init_regions({"main": pool_bytes})
        self._fixed = config.static_slot == "max_model_len"

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        if request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens:
            self._admit(request_id, prompt_tokens)
        if self._fixed:
            capacity = self.max_tokens
        else:
            capacity = min(prompt_tokens + self.config.max_new_tokens, self.max_tokens)
        return self._reserve_in(self._main, "main", request_id, capacity, prompt_tokens, None)

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        if self._grow_in_place(allocation, total_tokens):
            return True
        self.failed_extends += 1
        return False
