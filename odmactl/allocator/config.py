"""AllocatorConfig: every policy knob in one frozen dataclass, read from a mapping (a TOML table)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_BUCKETS, MAX_GAMMA, MAX_TOKENS, MAX_WINDOW_REQUESTS, whole_number_problem
from odmactl.core.tomltable import TomlTable
from odmactl.rules.buckets import LEVEL_SHAPES, shaped_levels

STATIC_SLOTS = ("max_model_len", "prompt_plus_max_new")
S3_OVERFLOWS = ("preempt", "migrate")  # s3 on an outgrown bucket: the S3 paper's preemption, or a copy
REFIT_MODES = ("inline", "deferred")
UNIFIED_FITS = ("best", "first")  # ADR-006 §5.2: best fit by default, first fit for latency-critical paths
MAX_HOST_BUFFER_BYTES = 1 << 50  # eLLM's host buffer: a petabyte of host memory is a typo
MAX_ADAPTER_RANK = 4_096  # LoRA ranks are 8-64 in S-LoRA's and ADR-006's examples
MAX_SLO_S = 86_400.0  # a latency target of more than a day is a typo
SEQUENCES = ("boundaries_tokens", "quantile_levels", "hedge_edges", "hedge_output_tokens")  # lists in TOML
NEVER = "never"  # tau = "never": no uncertainty sends a request to the large pool (tau infinite)
TAU_EXPECTED = f'a number >= 0 or "{NEVER}"'


def tau_setting(tau: float) -> float | str:
    """tau as a config and the JSON write it: "never" for infinity (TOML and JSON have none)."""
    return tau if math.isfinite(tau) else NEVER


@dataclass(frozen=True)
class Deployment:
    """What a policy may need to know of the deployment it is replayed on, besides the pool, for
    `complete_config` to fill in its settings (the run layer measures these from the profiles):
    `activation_peak_bytes`, the activation memory a static engine reserves at its batch limits
    (modelled, hw/cost.CostModel.activation_bytes, and at most the profile's activation reserve),
    `activation_reserve_bytes`, the memory the profile keeps aside for activations (what exists to
    borrow), and `lora_bytes_per_rank`, the bytes of a rank-1 LoRA adapter on the attention
    projections, all over the tensor-parallel group. Zero: unknown."""

    activation_peak_bytes: int = 0
    activation_reserve_bytes: int = 0  # the profile's activation reserve over the group: the most to borrow
    lora_bytes_per_rank: int = 0
    adapters: bool = False  # the workload names tenants, each with its LoRA adapter


@dataclass(frozen=True)
class AllocatorConfig:
    """Policy settings; a policy reads the fields it needs and ignores the rest.

    Token counts are KV tokens (prompt + generated). `boundaries_tokens` are bucket upper bounds,
    strictly increasing; empty means B equal-width buckets over `max_model_len_tokens` until the
    first refit. The large pool is `large_pool_bytes`, or `large_pool_fraction` of the pool when
    that is None; each large-pool block holds `max_model_len_tokens` so it never overflows.
    `refit_mode` "inline" refreshes ODMA's boundaries inside the release that completes a batch of
    `refit_every`; "deferred" only raises `refit_due` there and leaves `flush_refit()` to the caller,
    off the reserve/release path (the papers run it on a background thread).
    """

    max_model_len_tokens: int = 4096
    # static
    static_slot: str = "max_model_len"
    max_new_tokens: int | None = None
    # paged
    block_size_tokens: int = 16
    # s3
    s3_num_buckets: int = 10
    s3_overflow: str = "preempt"  # one of S3_OVERFLOWS (allocator/s3.py)
    # odma
    num_buckets: int = 4
    # empty: i / num_buckets (equal occupancy); a shape's name ("equal", "tail": rules/buckets.py)
    # stands for its levels at num_buckets and is replaced by them
    quantile_levels: tuple[float, ...] | str = ()
    boundaries_tokens: tuple[int, ...] = ()
    gamma: float = 0.2
    tau: float | str = 0.8  # "never" (NEVER) is infinity, and is replaced by it
    # a hedge table (odmactl/rules/hedge.py) in place of gamma: need = prompt + hedge_output_tokens[g],
    # g the group of L_hat among hedge_edges; empty: the gamma rule
    hedge_edges: tuple[float, ...] = ()
    hedge_output_tokens: tuple[int, ...] = ()
    large_pool_bytes: int | None = None
    large_pool_fraction: float = 0.1
    granularity_tokens: int = 16
    refit: bool = True
    refit_mode: str = "inline"
    refit_window: int = 10_000
    refit_every: int = 1_000
    # ellm (allocator/ellm.py): the activation memory the KV pool may borrow (None: filled in, the
    # modelled activation peak at the scheduler's limits), the host buffer for offloaded KV (0: no
    # offload) and the SLO-aware scaling of its logical size (no SLO: the whole buffer)
    ellm_borrow_bytes: int | None = None
    ellm_host_buffer_bytes: int = 0
    ellm_ttft_slo_s: float | None = None
    ellm_tpot_slo_s: float | None = None
    ellm_buffer_alpha: float = 2.0
    # unified (allocator/unified.py): page ranges by best or first fit, eviction between the
    # watermarks (fractions of the pool's pages), LoRA adapters of `lora_rank` (their bytes filled
    # in from the model), at most `unified_hot_adapters` resident
    unified_fit: str = "best"
    unified_growth_fraction: float = 0.125  # a new range adds this share of the pages held (0: one page)
    unified_high_watermark: float = 0.9
    unified_low_watermark: float = 0.8
    lora_rank: int = 16
    adapter_bytes: int | None = None
    unified_hot_adapters: int = 100

    def __post_init__(self) -> None:
        self._named_settings()
        for name, low, high in (("max_model_len_tokens", 1, MAX_TOKENS), ("block_size_tokens", 1, MAX_TOKENS),
                                ("s3_num_buckets", 1, MAX_BUCKETS), ("num_buckets", 1, MAX_BUCKETS),
                                ("granularity_tokens", 1, MAX_TOKENS), ("refit_window", 1, MAX_WINDOW_REQUESTS),
                                ("refit_every", 1, MAX_WINDOW_REQUESTS), ("lora_rank", 1, MAX_ADAPTER_RANK),
                                ("unified_hot_adapters", 1, 1 << 20), ("ellm_host_buffer_bytes", 0, MAX_HOST_BUFFER_BYTES)):
            problem = whole_number_problem(getattr(self, name), low, high)
            if problem is not None:
                raise ConfigError(problem, key=name)
        if self.static_slot not in STATIC_SLOTS:
            raise ConfigError(f"expected one of {', '.join(STATIC_SLOTS)}, got {self.static_slot!r}", key="static_slot")
        if self.s3_overflow not in S3_OVERFLOWS:
            raise ConfigError(f"expected one of {', '.join(S3_OVERFLOWS)}, got {self.s3_overflow!r}", key="s3_overflow")
        problem = None if self.max_new_tokens is None else whole_number_problem(self.max_new_tokens, 1, MAX_TOKENS)
        if problem is not None:
            raise ConfigError(problem, key="max_new_tokens")
        if self.static_slot == "prompt_plus_max_new" and not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ConfigError("static_slot = 'prompt_plus_max_new' needs max_new_tokens >= 1", key="max_new_tokens")
        if self.max_new_tokens is not None and self.static_slot != "prompt_plus_max_new":
            raise ConfigError("max_new_tokens sizes static's slot under static_slot = 'prompt_plus_max_new' and nothing "
                              "else (the output cap is [scheduler] max_new_tokens)", key="max_new_tokens")
        if self.unified_fit not in UNIFIED_FITS:
            raise ConfigError(f"expected one of {', '.join(UNIFIED_FITS)}, got {self.unified_fit!r}", key="unified_fit")
        for name in ("ellm_borrow_bytes", "adapter_bytes"):
            value = getattr(self, name)
            problem = None if value is None else whole_number_problem(value, 0, MAX_HOST_BUFFER_BYTES)
            if problem is not None:
                raise ConfigError(problem, key=name)
        for name in ("ellm_ttft_slo_s", "ellm_tpot_slo_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value <= MAX_SLO_S):
                raise ConfigError(f"expected seconds above 0 and at most {MAX_SLO_S:g}, got {value!r}", key=name)
        a = self.ellm_buffer_alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 1 < a <= 1024:
            raise ConfigError(f"expected a factor above 1 and at most 1024 (eLLM's default is 2), got {a!r}",
                              key="ellm_buffer_alpha")
        g = self.unified_growth_fraction
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g <= 4:
            raise ConfigError(f"expected a share of the pages held from 0 (one page at a time) to 4, got {g!r}",
                              key="unified_growth_fraction")
        low, high = self.unified_low_watermark, self.unified_high_watermark
        def fraction(x) -> bool:
            return not isinstance(x, bool) and isinstance(x, (int, float)) and 0 < x <= 1

        if not (fraction(low) and fraction(high) and low <= high):
            bad = "unified_high_watermark" if fraction(low) and not fraction(high) else "unified_low_watermark"
            raise ConfigError(f"expected 0 < unified_low_watermark <= unified_high_watermark <= 1, got {low!r} and "
                              f"{high!r}", key=bad)
        if (self.ellm_ttft_slo_s is not None or self.ellm_tpot_slo_s is not None) and not self.ellm_host_buffer_bytes:
            raise ConfigError("the SLO-aware rule scales ellm's host buffer, and ellm_host_buffer_bytes is 0",
                              key="ellm_ttft_slo_s" if self.ellm_ttft_slo_s is not None else "ellm_tpot_slo_s",
                              hint="set ellm_host_buffer_bytes too, or leave the SLOs out")
        if self.refit_mode not in REFIT_MODES:
            raise ConfigError(f"expected one of {', '.join(REFIT_MODES)}, got {self.refit_mode!r}", key="refit_mode")
        if not (0 <= self.gamma <= MAX_GAMMA):
            raise ConfigError(f"expected a number from 0 to {MAX_GAMMA:g}, got {self.gamma!r}", key="gamma")
        if not (self.tau >= 0):
            raise ConfigError(f"expected {TAU_EXPECTED}, got {self.tau!r}", key="tau")
        if not (0 <= self.large_pool_fraction < 1):
            raise ConfigError(f"expected a fraction in [0, 1), got {self.large_pool_fraction!r}", key="large_pool_fraction")
        if self.large_pool_bytes is not None and not (isinstance(self.large_pool_bytes, int) and self.large_pool_bytes >= 0):
            raise ConfigError(f"expected a byte count >= 0, got {self.large_pool_bytes!r}", key="large_pool_bytes")
        q = self.quantile_levels
        if q and (len(q) != self.num_buckets or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in q)
                  or list(q) != sorted(set(q)) or not 0 < q[0] or q[-1] != 1):
            raise ConfigError(f"expected num_buckets ({self.num_buckets}) strictly increasing levels in (0, 1] "
                              f"ending at 1, got {list(q)}", key="quantile_levels")
        if self.hedge_edges or self.hedge_output_tokens:
            edges, tokens = self.hedge_edges, self.hedge_output_tokens
            if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in edges) or list(edges) != sorted(set(edges)):
                raise ConfigError(f"expected strictly increasing predicted lengths, got {list(edges)}", key="hedge_edges")
            if any(not isinstance(x, int) or isinstance(x, bool) or not 1 <= x <= MAX_TOKENS for x in tokens):
                raise ConfigError(f"expected token counts from 1 to {MAX_TOKENS:,} (every request generates a token), "
                                  f"got {list(tokens)}", key="hedge_output_tokens")
            if len(tokens) != len(edges) + 1:
                raise ConfigError(f"expected one more count than hedge_edges ({len(edges) + 1}), got {len(tokens)}",
                                  key="hedge_output_tokens")
        b = self.boundaries_tokens
        if any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in b) or list(b) != sorted(set(b)):
            raise ConfigError(f"expected strictly increasing token counts >= 1, got {list(b)}", key="boundaries_tokens")
        if b and b[-1] > self.max_model_len_tokens:
            raise ConfigError(f"the last boundary ({b[-1]}) exceeds max_model_len_tokens ({self.max_model_len_tokens})",
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
        for name in SEQUENCES:
            value = getattr(self, name)
            named = name == "quantile_levels" and isinstance(value, str) and value in LEVEL_SHAPES
            if not isinstance(value, (tuple, list)) and not named:
                known = f" or one of {', '.join(LEVEL_SHAPES)}" if name == "quantile_levels" else ""
                raise ConfigError(f"expected a list{known}, got {value!r}", key=name)
        if isinstance(self.quantile_levels, str) and whole_number_problem(self.num_buckets, 1, MAX_BUCKETS) is None:
            # a bad num_buckets: the check below says so
            object.__setattr__(self, "quantile_levels", shaped_levels(self.num_buckets, self.quantile_levels))

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], source: str | Path | None = None,
                     prefix: str = "") -> AllocatorConfig:
        """Build from a TOML table (`prefix` its name in the file, e.g. "allocator"); an unknown key or
        a bad value names the file and the key."""
        def sequence(value):  # a list as a tuple; anything else as it is, for the checks to name
            return tuple(value) if isinstance(value, list) else value

        return TomlTable(dict(data), source, prefix).to_dataclass(cls, convert={name: sequence for name in SEQUENCES})

    def to_mapping(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        out["boundaries_tokens"] = list(self.boundaries_tokens)
        out["quantile_levels"] = list(self.quantile_levels)
        out["tau"] = tau_setting(self.tau)
        for key in ("hedge_edges", "hedge_output_tokens"):  # written only when a table is set
            out[key] = list(getattr(self, key)) if self.hedge_edges or self.hedge_output_tokens else None
        return {k: v for k, v in out.items() if v is not None}
