"""`ellm`: eLLM's elastic pool (seeds/003). KV and activations share one physical pool: the KV grows
into the activation memory the running iteration leaves idle (inflation) and gives it back when a
prefill needs it (deflation, lazily: only when the next iteration's demand asks for it); KV of
requests that do not fit may be written to a host buffer during their prefill and fetched back to
decode; an SLO-aware rule scales the part of that buffer in use."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation, InvariantError
from odmactl.allocator.config import AllocatorConfig, Deployment, PolicySettings, number_problem, whole_numbers
from odmactl.allocator.paged import PagedAllocator, PagedSettings
from odmactl.core.errors import AllocationError, ConfigError
from odmactl.core.limits import MAX_POOL_TOKENS

MAX_HOST_BUFFER_BYTES = 1 << 50  # a petabyte of host memory (or of borrowed memory) is a typo
MAX_SLO_S = 86_400.0  # a latency target of more than a day is a typo


@dataclass(frozen=True)
class EllmSettings(PolicySettings):
    """The activation memory the KV pool may borrow (None: filled in, the modelled activation peak
    at the scheduler's limits), the host buffer for offloaded KV (0: no offload) and the
    SLO-aware scaling of its logical size (no SLO: the whole buffer). Chunks are
    `block_size_tokens` (PagedSettings). Invariant: an SLO is set only with a host buffer."""

    ellm_borrow_bytes: int | None = None
    ellm_host_buffer_bytes: int = 0
    ellm_ttft_slo_s: float | None = None
    ellm_tpot_slo_s: float | None = None
    ellm_buffer_alpha: float = 2.0

    def __post_init__(self) -> None:
        whole_numbers(self, ("ellm_host_buffer_bytes", 0, MAX_HOST_BUFFER_BYTES),
                      ("ellm_borrow_bytes", 0, MAX_HOST_BUFFER_BYTES))
        for name in ("ellm_ttft_slo_s", "ellm_tpot_slo_s"):
            value = getattr(self, name)
            if value is not None and (number_problem(value, 0, MAX_SLO_S) or value == 0):
                raise ConfigError(f"expected seconds above 0 and at most {MAX_SLO_S:g}, got {value!r}", key=name)
        a = self.ellm_buffer_alpha
        if number_problem(a, 1, 1024) or a == 1:
            raise ConfigError(f"expected a factor above 1 and at most 1024 (eLLM's default is 2), got {a!r}",
                              key="ellm_buffer_alpha")
        if (self.ellm_ttft_slo_s is not None or self.ellm_tpot_slo_s is not None) and not self.ellm_host_buffer_bytes:
            raise ConfigError("the SLO-aware rule scales ellm's host buffer, and ellm_host_buffer_bytes is 0",
                              key="ellm_ttft_slo_s" if self.ellm_ttft_slo_s is not None else "ellm_tpot_slo_s",
                              hint="set ellm_host_buffer_bytes too, or leave the SLOs out")


class EllmAllocator(PagedAllocator):
    """Chunks of `block_size_tokens` tokens (eLLM maps 2 MB physical chunks; at Llama-3-8B's
    128 KiB a token in fp16 a chunk is 16 tokens) from a pool of the KV pool plus `borrow_bytes`,
    the activation memory a static engine would keep aside (filled in from the deployment:
    config.Deployment.activation_peak_bytes). Growth, release and preemption are paged's. A
    request's chunks are mapped into one virtual range (eLLM's KV eTensor), so its KV is read as
    one run (`read_block_tokens` None) however many chunks back it.

    What the pool may hold during an iteration is `block_limit(tokens, sequences)`, which the
    replay applies: `pool_bytes` less that iteration's activation demand (the deployment's
    activation model, hw/cost CostModel.activation_bytes), of which at most `borrow_bytes` comes
    out of the borrowed memory (a demand past it was the static engine's to reserve too, and takes
    nothing from the KV pool). So decode iterations borrow almost all of it, and a prefill admits
    only what leaves its activations room (Algorithm 1 of the paper: a request joins a prefill if
    KV and activations fit); the borrowed KV is not taken back (deflation is lazy).

    Host buffer (`host_buffer_bytes` > 0, `host_tier()` the allocator itself): a request whose KV
    does not fit may still be prefilled when its activations do (Algorithm 1, line 8): its KV goes
    to the host buffer (`reserve_offloaded`) as the prefill writes it, and comes back (`fetch`)
    when its chunks fit and it is scheduled to decode. Both transfers count in `host_bytes`. The buffer's usable part,
    `logical_buffer_bytes`, is the whole buffer without SLOs; with a TTFT or TPOT SLO it starts at
    one chunk and `latency_feedback` scales it by `ellm_buffer_alpha` (Algorithm 2): down on a TPOT
    violation, up on a TTFT violation, within [one chunk, the buffer].

    Invariants (checked, besides paged's): offloaded requests are not live on the device and their
    bytes add up to `host_used_bytes` <= `host_buffer_bytes`; `logical_buffer_bytes` stays within
    its bounds.
    """

    name = "ellm"
    shares_prefixes = False  # not modelled: eLLM's elastic pool and host buffer move blocks a cache would share
    settings = (PagedSettings, EllmSettings)

    @classmethod
    def describe(cls, config: dict) -> str | None:
        return None  # its notes say its chunks, borrowing and buffer

    @classmethod
    def complete_config(cls, config: AllocatorConfig, *, pool_bytes: int, bytes_per_token: int,
                        realized_kv_tokens, deployment=None) -> tuple[AllocatorConfig, dict]:
        """The activation memory to borrow, when not set: the deployment's modelled peak."""
        if config.ellm_borrow_bytes is None:
            borrow = deployment.activation_peak_bytes if deployment is not None else 0
            config = config.replace(ellm_borrow_bytes=borrow)
            why = "the modelled activation peak at the batch limits"
        else:
            borrow, why = config.ellm_borrow_bytes, "as set"
            reserve = deployment.activation_reserve_bytes if deployment is not None else 0
            if reserve and borrow > reserve:
                raise ConfigError(f"{borrow:,} bytes is more activation memory than the device profile keeps aside "
                                  f"({reserve:,} bytes, its activation_reserve): there is nothing more to borrow",
                                  key="ellm_borrow_bytes", hint=f"at most {reserve:,}, or leave it out")
        chunk = config.block_size_tokens * bytes_per_token
        if 0 < config.ellm_host_buffer_bytes < chunk:
            raise ConfigError(f"{config.ellm_host_buffer_bytes:,} bytes holds no {chunk:,}-byte chunk of KV",
                              key="ellm_host_buffer_bytes", hint="0 (no offload) or at least a chunk")
        notes = {"borrows": f"up to {borrow / (1 << 30):.2f} GiB of activation memory (ellm_borrow_bytes {borrow:,}: "
                            f"{why}); chunks of {config.block_size_tokens} tokens"}
        if config.ellm_host_buffer_bytes:
            slo = [f"{name} {value:g} s" for name, value in (("TTFT", config.ellm_ttft_slo_s),
                                                             ("TPOT", config.ellm_tpot_slo_s)) if value is not None]
            notes["host_buffer"] = (f"{config.ellm_host_buffer_bytes / (1 << 30):.2f} GiB for offloaded KV, "
                                    + (f"scaled by the SLO-aware rule at {' and '.join(slo)} (alpha "
                                       f"{config.ellm_buffer_alpha:g})" if slo else "all of it usable"))
        config, more = super().complete_config(config, pool_bytes=pool_bytes, bytes_per_token=bytes_per_token,
                                               realized_kv_tokens=realized_kv_tokens)
        return config, {**notes, **more}

    @classmethod
    def arena_bytes(cls, pool_bytes: int, config: AllocatorConfig) -> int:
        return pool_bytes + (config.ellm_borrow_bytes or 0)

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None,
                 deployment: Deployment | None = None) -> None:
        borrow = config.ellm_borrow_bytes or 0
        if (pool_bytes + borrow) // bytes_per_token > MAX_POOL_TOKENS:
            raise ConfigError(f"the KV pool and {borrow:,} borrowed bytes hold more than {MAX_POOL_TOKENS:,} tokens",
                              key="ellm_borrow_bytes")
        super().__init__(pool_bytes + borrow, bytes_per_token, config, arena, deployment)
        self.kv_pool_bytes = pool_bytes
        self.borrow_bytes = borrow
        self._activation_per_token = self.deployment.activation_bytes_per_token
        self._activation_per_sequence = self.deployment.activation_bytes_per_sequence
        self.read_block_tokens = None
        self.host_bytes = 0
        self.host_buffer_bytes = config.ellm_host_buffer_bytes
        self.ttft_slo_s, self.tpot_slo_s = config.ellm_ttft_slo_s, config.ellm_tpot_slo_s
        self.slo_aware = self.host_buffer_bytes > 0 and (self.ttft_slo_s is not None or self.tpot_slo_s is not None)
        self.min_buffer_bytes = min(self.block_bytes, self.host_buffer_bytes)
        self.logical_buffer_bytes = self.min_buffer_bytes if self.slo_aware else self.host_buffer_bytes
        self.alpha = config.ellm_buffer_alpha
        self.host_used_bytes = 0
        self._offloaded: dict[str, Allocation] = {}
        self.offloads = self.fetches = self.offloaded_bytes = self.fetched_bytes = 0
        self.buffer_scalings = 0
        self._ttft_window = self._tpot_window = 0  # the last five observations, a bit each (1: over the SLO)

    def block_limit(self, tokens: int, sequences: int) -> int:
        """The pool less the iteration's activation demand (config.Deployment.activation_bytes,
        written out: the replay asks at every event), of which at most the borrowed memory."""
        demand = tokens * self._activation_per_token + sequences * self._activation_per_sequence
        return (self.pool_bytes - min(demand, self.borrow_bytes)) // self.block_bytes

    # -- the host buffer (HostTier) --------------------------------------------------------------

    def host_tier(self):
        return self if self.host_buffer_bytes else None

    def reserve_offloaded(self, request_id: str, kv_tokens: int) -> Allocation | None:
        """Request `request_id`'s `kv_tokens` of KV written to the host buffer by its prefill
        (None: the usable part of the buffer has no room). The allocation is not live on the
        device until `fetch`."""
        self._admit(request_id, kv_tokens)
        if request_id in self._offloaded:
            raise AllocationError(f"request '{request_id}' is already offloaded")
        nbytes = kv_tokens * self.bytes_per_token
        if self.host_used_bytes + nbytes > self.logical_buffer_bytes:
            return None
        self.host_used_bytes += nbytes
        self.host_bytes += nbytes
        self.offloads += 1
        self.offloaded_bytes += nbytes
        a = Allocation(request_id, 0, nbytes, kv_tokens, kv_tokens, None, "host", array("q"))
        self._offloaded[request_id] = a
        return a

    def fetch(self, allocation: Allocation) -> bool:
        """Bring an offloaded request's KV back into chunks of the pool (False: too few free). It
        is then a live allocation like any other, holding the chunks for its tokens."""
        if self._offloaded.get(allocation.request_id) is not allocation:
            raise AllocationError(f"request '{allocation.request_id}' is not offloaded here")
        tokens = allocation.used_tokens
        n = -(-tokens // self.block_size_tokens)
        if n > self.free_blocks:
            return False
        del self._offloaded[allocation.request_id]
        self.host_used_bytes -= allocation.nbytes
        self.host_bytes += allocation.nbytes
        self.fetches += 1
        self.fetched_bytes += allocation.nbytes
        blocks = self._take(n)
        allocation.region = "main"
        allocation.block_ids = blocks
        allocation.offset_bytes = blocks[0] * self.block_bytes
        allocation.capacity_tokens = n * self.block_size_tokens
        allocation.nbytes = n * self.block_bytes
        self._admitted(allocation)
        return True

    def release(self, allocation: Allocation, final_tokens: int | None = None) -> None:
        """Paged's release, or for a request still in the host buffer, its bytes there freed."""
        if allocation.region != "host":
            PagedAllocator.release(self, allocation, final_tokens)
            return
        if self._offloaded.get(allocation.request_id) is not allocation:
            raise AllocationError(f"allocation of request '{allocation.request_id}' is not offloaded here")
        del self._offloaded[allocation.request_id]
        self.host_used_bytes -= allocation.nbytes
        allocation.live = False
        self.releases += 1

    def latency_feedback(self, ttft_s: float | None, tpot_s: float | None) -> None:
        """Algorithm 2, from the latencies the replay observes: a prefill's longest TTFT, a decode
        iteration's time (TPOT). A violation event is three of the last five observations of one
        kind over its SLO (the paper's window); a TPOT event shrinks the usable buffer by alpha
        (fewer prefills offloaded, so decodes are not crowded out), else a TTFT event grows it.
        Without SLOs, nothing."""
        if not self.slo_aware:
            return
        ttft_slo, tpot_slo = self.ttft_slo_s, self.tpot_slo_s
        if ttft_s is not None and ttft_slo is not None:
            self._ttft_window = (self._ttft_window << 1 | (ttft_s > ttft_slo)) & 0b11111
        if tpot_s is not None and tpot_slo is not None:
            self._tpot_window = (self._tpot_window << 1 | (tpot_s > tpot_slo)) & 0b11111
        tpot_violated = self._tpot_window.bit_count() >= 3
        ttft_violated = self._ttft_window.bit_count() >= 3
        if tpot_violated:
            self._tpot_window = 0
        elif ttft_violated:
            self._ttft_window = 0
        before = self.logical_buffer_bytes
        if tpot_violated:
            self.logical_buffer_bytes = max(int(before / self.alpha), self.min_buffer_bytes)
        elif ttft_violated:
            self.logical_buffer_bytes = min(int(before * self.alpha), self.host_buffer_bytes)
        if self.logical_buffer_bytes != before:
            self.buffer_scalings += 1

    # -- reporting and checks --------------------------------------------------------------------

    policy_totals = ("offloads", "offloaded_bytes", "fetches", "fetched_bytes", "buffer_scalings")

    def policy_counters(self) -> dict[str, int]:
        return {"borrow_bytes": self.borrow_bytes, "offloads": self.offloads, "offloaded_bytes": self.offloaded_bytes, "fetches": self.fetches,
                "fetched_bytes": self.fetched_bytes, "host_buffer_used_bytes": self.host_used_bytes,
                "logical_buffer_bytes": self.logical_buffer_bytes, "buffer_scalings": self.buffer_scalings}

    def _check_structures(self) -> None:
        super()._check_structures()
        held = sum(a.nbytes for a in self._offloaded.values())
        if held != self.host_used_bytes or held > self.host_buffer_bytes:
            raise InvariantError(f"host buffer: {self.host_used_bytes:,} bytes counted, offloaded requests hold {held:,} "
                                 f"of {self.host_buffer_bytes:,}")
        if set(self._offloaded) & set(self._live):
            raise InvariantError("a request is both offloaded and live on the device")
        if not self.min_buffer_bytes <= self.logical_buffer_bytes <= self.host_buffer_bytes:
            raise InvariantError(f"logical buffer {self.logical_buffer_bytes:,} outside [{self.min_buffer_bytes:,}, "
                                 f"{self.host_buffer_bytes:,}]")
