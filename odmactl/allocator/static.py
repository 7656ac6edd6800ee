"""`static`: worst-case contiguous reservation, the baseline ODMA is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation
from odmactl.allocator.config import AllocatorConfig, Deployment, PolicySettings, one_of, whole_numbers
from odmactl.allocator.contiguous import ContiguousAllocator
from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_TOKENS

STATIC_SLOTS = ("max_model_len", "prompt_plus_max_new")


@dataclass(frozen=True)
class StaticSettings(PolicySettings):
    """static's slot: `max_model_len` (worst-case provisioning) or prompt + `max_new_tokens`
    ("prompt_plus_max_new", Cambricon-vLLM's pre-allocation, the ODMA papers' baseline).
    Invariant: `max_new_tokens` is set exactly when the slot is "prompt_plus_max_new"."""

    static_slot: str = "max_model_len"
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        one_of(self, "static_slot", STATIC_SLOTS)
        whole_numbers(self, ("max_new_tokens", 1, MAX_TOKENS))
        if self.static_slot == "prompt_plus_max_new" and not (isinstance(self.max_new_tokens, int)
                                                              and self.max_new_tokens >= 1):
            raise ConfigError("static_slot = 'prompt_plus_max_new' needs max_new_tokens >= 1", key="max_new_tokens")
        if self.max_new_tokens is not None and self.static_slot != "prompt_plus_max_new":
            raise ConfigError("max_new_tokens sizes static's slot under static_slot = 'prompt_plus_max_new' and nothing "
                              "else (the output cap is [scheduler] max_new_tokens)", key="max_new_tokens")


class StaticAllocator(ContiguousAllocator):
    """One contiguous slot per request: `max_model_len_tokens` (static_slot = "max_model_len"), or
    prompt + `max_new_tokens` capped at max_model_len ("prompt_plus_max_new"). With fixed slots every
    block has one size, so best-fit placement reproduces fixed slot positions. A slot never grows."""

    name = "static"
    settings = (StaticSettings,)

    @classmethod
    def describe(cls, config: dict) -> str | None:
        if config.get("static_slot") == "prompt_plus_max_new":
            return f"static reserves prompt + {config['max_new_tokens']:,} tokens, the ODMA papers' baseline"
        return None

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None,
                 deployment: Deployment | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena, deployment)
        self._init_regions({"main": pool_bytes})
        self._fixed = config.static_slot == "max_model_len"
        self._max_new = config.max_new_tokens

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        if request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens:
            self._admit(request_id, prompt_tokens)
        return self._reserve_in(self._main, "main", request_id, self.reservation_tokens(prompt_tokens, None, None),
                                prompt_tokens, None)

    def reservation_tokens(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> int:
        """The slot (the class docstring)."""
        return self.max_tokens if self._fixed else min(prompt_tokens + self._max_new, self.max_tokens)

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        if self._grow_in_place(allocation, total_tokens):
            return True
        self.failed_extends += 1
        return False
