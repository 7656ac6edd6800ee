"""What every allocator policy shares: the Allocation record, the stats, the protocol, and the
bookkeeping and invariant checks that do not depend on how a policy places blocks."""

from __future__ import annotations

from array import array
import numbers
from dataclasses import asdict, dataclass, field
from typing import Protocol

from odmactl.allocator.arena import Arena, VirtualArena
from odmactl.allocator.config import AllocatorConfig, Deployment
from odmactl.core.errors import AllocationError, ConfigError


class InvariantError(AssertionError):
    """An allocator invariant does not hold: a bug in odmactl, never a user error."""


class Allocation:
    """One request's KV memory, handed out by `reserve` and owned by the allocator until `release`.

    Invariants while live: `nbytes == capacity_tokens * bytes_per_token`; `used_tokens <=
    capacity_tokens` (the KV tokens written so far: prompt, then prompt + generated);
    contiguous policies own exactly [offset_bytes, offset_bytes + nbytes) in `region`; `paged`
    owns `block_ids` (an array('q') of block numbers, each `block_size` tokens) and
    `offset_bytes` is its first block's; `handle` is the policy's index of its own record of the
    allocation where it keeps one in C (unified: its chain of page ranges, allocator/pageruns.py),
    else -1.
    `owner` is the allocator that holds it live (`live` True), None once released.
    `bucket` is the bucket index at reservation (or after a move), "large" in ODMA's large pool,
    None for policies without buckets. `limit_tokens` is the most KV tokens the request can reach
    where the policy knows it (ODMA: its large-pool block, prompt + the output cap), else None.
    Identity, not value, names an allocation (no __eq__), so it cannot be copied or pickled: the
    allocators take `owner is self` for "live here" (a copy would pass as the live one).
    A plain slotted class with a hand-written __init__: a third cheaper to create than the
    equivalent slotted dataclass, and one is created per reservation.
    """

    __slots__ = ("request_id", "offset_bytes", "nbytes", "capacity_tokens", "used_tokens", "bucket",
                 "region", "block_ids", "live", "limit_tokens", "handle", "owner")

    def __init__(self, request_id: str, offset_bytes: int, nbytes: int, capacity_tokens: int, used_tokens: int,
                 bucket: int | str | None, region: str = "main", block_ids: array | None = None,
                 limit_tokens: int | None = None) -> None:
        self.request_id = request_id
        self.offset_bytes = offset_bytes
        self.nbytes = nbytes
        self.capacity_tokens = capacity_tokens
        self.used_tokens = used_tokens
        self.bucket = bucket
        self.region = region
        self.block_ids = block_ids
        self.live = True
        self.limit_tokens = limit_tokens
        self.handle = -1
        self.owner = None

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Allocation({fields})"

    def __copy__(self):
        raise TypeError("an Allocation names its memory by identity: a copy would be a second handle to it")

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        return self.__copy__()


def refuse_past_whole_blocks(config: AllocatorConfig, pool_bytes: int, bytes_per_token: int, unit: str) -> None:
    """Raise ConfigError when max_model_len is more than the pool holds in whole
    `block_size_tokens` blocks (`unit`: "blocks", "pages"), as vLLM refuses it at start-up: a request
    of that length could never be scheduled."""
    block = config.block_size_tokens
    held = pool_bytes // (block * bytes_per_token) * block
    if config.max_model_len_tokens > held:
        raise ConfigError(f"max_model_len ({config.max_model_len_tokens:,} tokens) is more than the KV pool holds in "
                          f"whole {block}-token {unit} ({held:,} tokens), which vLLM refuses at start-up",
                          hint=(f"a max_model_len up to {held:,}, " if held else "") + "a smaller block or a larger pool")


def with_tail(runs: list[list[int]], tail_start: int, tail_bytes: int) -> list[tuple[int, int]]:
    """Free runs [start, nbytes] in address order, ending at or before `tail_start`, as (start,
    nbytes) with the pool's tail (the `tail_bytes` after the last whole block or page: free, never
    handed out) merged into the last run when they touch."""
    if tail_bytes:
        if runs and runs[-1][0] + runs[-1][1] == tail_start:
            runs[-1][1] += tail_bytes
        else:
            runs.append([tail_start, tail_bytes])
    return [(start, n) for start, n in runs]


@dataclass(frozen=True)
class RegionStats:
    pool_bytes: int
    reserved_bytes: int
    free_bytes: int
    largest_free_extent_bytes: int
    free_extents: int

    @classmethod
    def of(cls, pool_bytes: int, free: list[tuple[int, int]]) -> RegionStats:
        """From a region's size and its free (start, nbytes) extents, touching pieces merged."""
        free_bytes = sum(n for _, n in free)
        return cls(pool_bytes=pool_bytes, reserved_bytes=pool_bytes - free_bytes, free_bytes=free_bytes,
                   largest_free_extent_bytes=max((n for _, n in free), default=0), free_extents=len(free))


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot. `largest_free_extent_bytes` and `fragmentation_ratio` (largest free extent /
    free bytes: 1.0 = the free space is one piece, or there is none) describe the "main" region,
    where every policy places ordinary reservations; `regions` has the same figures per region
    (ODMA's large pool is its own). `used_bytes` counts the KV tokens actually written."""

    policy: str
    arena: str
    device: str
    pool_bytes: int
    bytes_per_token: int
    reserved_bytes: int
    used_bytes: int
    free_bytes: int
    largest_free_extent_bytes: int
    fragmentation_ratio: float
    live_allocations: int
    peak_reserved_bytes: int
    reserves: int
    failed_reserves: int
    extends: int
    failed_extends: int
    migrations: int
    migrated_bytes: int
    releases: int
    regions: dict[str, RegionStats] = field(default_factory=dict)
    policy_counters: dict[str, int] = field(default_factory=dict)
    policy_totals: list[str] = field(default_factory=list)  # the counters that are running totals, not levels

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class HostTier(Protocol):
    """An optional collaborator a policy returns from `host_tier()`: host memory that holds KV the
    device pool cannot (eLLM's offload buffer). A request whose KV does not fit may be prefilled
    with its KV written to host memory (`reserve_offloaded`: an Allocation that is not live on the
    device, released by the allocator's `release`), and fetched back into the pool to decode
    (`fetch`: False while its blocks do not fit). `latency_feedback` hands the tier the latencies
    the replay observes (a prefill's longest TTFT, a decode iteration's time), for a tier that
    resizes itself by them; `host_bytes` counts the bytes moved over the host link."""

    host_bytes: int

    def reserve_offloaded(self, request_id: str, kv_tokens: int) -> Allocation | None: ...

    def fetch(self, allocation: Allocation) -> bool: ...

    def latency_feedback(self, ttft_s: float | None, tpot_s: float | None) -> None: ...


class AdapterCache(Protocol):
    """An optional collaborator a policy returns from `adapter_cache()`: LoRA adapters resident in
    the pool beside the KV (ADR-006's hot tier). A request with an adapter is admitted only if
    `acquire_adapter(key)` answers True (resident and pinned: loaded over the host link when it was
    not, counted in `host_bytes`); `release_adapter(key)` unpins it when the request leaves the
    batch, or (`admitted` False) when the request it was acquired for could not be admitted."""

    host_bytes: int

    def acquire_adapter(self, key) -> bool: ...

    def release_adapter(self, key, admitted: bool = True) -> None: ...


class Allocator(Protocol):
    """The KV manager: the API every policy implements (names are a contract replay, plan and
    users rely on). The replay (sim/) reads these members and nothing else of a policy, never its
    name; tests/test_layout.py fails when sim/ reads another.

    Operations. `reserve` (admit) and `extend` (grow) answer None / False for "does not fit now";
    misuse raises AllocationError. `release(a, final_tokens)` frees a request that grew to
    `final_tokens` since its last extend (within its capacity for contiguous policies; paged does
    not take the blocks that would go straight back): one call where a caller that reports growth
    lazily would make two. `record_peak(bytes)`: a caller that hands block growth over lazily
    reports the peak eager growth would have reached.

    How a request grows. `block_size_tokens` None: one contiguous block per request, which
    `extend` grows in place, moves (a migration, counted in `migrated_bytes`) or refuses; an
    integer: the KV grows a block of that many tokens at a time, from `num_blocks` blocks of
    `block_bytes` each (`free_blocks` of them free now), and a failed `extend` is the caller's cue
    to preempt (vLLM's recompute). `block_limit(tokens, sequences)`: the blocks the KV may hold
    during an iteration that runs `tokens` tokens for `sequences` sequences: `num_blocks`, unless
    the pool is shared with something that iteration needs (eLLM's activations).

    How KV is read (the cost model's layout). `read_block_tokens`: the run length in tokens (None:
    one run per range a request occupies, whatever it grows by: eLLM's virtual tensors grow in
    chunks and read as one run). `runs_of(a, kv_tokens)`: the runs one live request holding
    `kv_tokens` is read as; `kv_runs`: their sum over the live allocations, kept by policies with
    contiguous growth (0 for block growth, whose runs the replay counts as blocks grow);
    `mean_released_runs()`: the mean runs a released request was read as, where a policy counts
    them itself (None: the layout says).

    The pool. `pool_bytes` the bytes the policy places KV in; `kv_pool_bytes` the KV pool's share
    of them (less when the pool also holds borrowed memory); `reserved_bytes`, `peak_reserved_bytes`.
    `boundaries_tokens` / `boundary_updates`: the bucket upper bounds new reservations use and how
    many times they changed, for a policy whose boundaries change at run time (empty and 0
    otherwise).

    Collaborators, None unless a policy has them: `host_tier()` (HostTier) and `adapter_cache()`
    (AdapterCache).

    Scheduling. `scheduler`: the scheduler (sim/schedulers, by name) a replay runs the policy with
    when [scheduler] policy names none ("fcfs" unless a policy says otherwise: odma's papers
    describe a task pool). `tag_of(prompt_tokens, predicted_output_tokens, uncertainty)`: the tag of
    the block a request would be reserved (the papers' bucket tag; a scheduler that queues by tag
    reads it): a (pool, bucket) pair, requests whose tags name the same pool competing for the same
    memory; None where the policy has one kind of block. `overflow_waits(a, total_tokens)`:
    whether a contiguous request that `extend` refused may stall in place (keep its block, leave
    the batch, and be extended again after a release) rather than be preempted; False unless the
    policy holds space that a release makes usable for it (ODMA's large pool).
    `room_version(tag)`: a value that changes whenever a reservation of that tag that failed may
    succeed (memory given back to its pool, new boundaries); -1: unknown, retry every time.

    Of the policy's class, before a replay builds it: `settings`, the settings classes it reads
    (allocator/config.py); `complete_config(config, pool_bytes=, bytes_per_token=,
    realized_kv_tokens=, deployment=)`, the settings the policy fills in itself (`deployment`:
    config.Deployment, the facts of the device and model it may need); `arena_bytes`, the bytes its
    arena spans; `uses_predictions`, whether it sizes reservations from predicted lengths (a replay
    refuses to run it without a predictor unless told `--predictor none`); `describe(config)`, a
    line saying its settings for the console (None: nothing to say); `shares_prefixes`, whether a
    replay may keep a prefix cache in its blocks (allocator/prefix.py: `paged`).
    """

    name: str
    uses_predictions: bool
    shares_prefixes: bool
    settings: tuple[type, ...]
    pool_bytes: int
    kv_pool_bytes: int
    bytes_per_token: int
    config: AllocatorConfig
    arena: Arena
    block_size_tokens: int | None
    num_blocks: int
    block_bytes: int
    free_blocks: int
    read_block_tokens: int | None
    kv_runs: int
    migrated_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    releases: int
    boundaries_tokens: tuple[int, ...]
    boundary_updates: int
    scheduler: str

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None: ...

    def extend(self, allocation: Allocation, total_tokens: int) -> bool: ...

    def release(self, allocation: Allocation, final_tokens: int | None = None) -> None: ...

    def record_peak(self, reserved_bytes: int) -> None: ...

    def block_limit(self, tokens: int, sequences: int) -> int: ...

    def runs_of(self, allocation: Allocation, kv_tokens: int) -> int: ...

    def mean_released_runs(self) -> float | None: ...

    def host_tier(self) -> HostTier | None: ...

    def tag_of(self, prompt_tokens: int, predicted_output_tokens: float | None, uncertainty: float | None) -> object: ...

    def reservation_tokens(self, prompt_tokens: int, predicted_output_tokens: float | None,
                           uncertainty: float | None) -> int: ...

    def room_for(self, prompt_tokens: int, predicted_output_tokens: float | None, uncertainty: float | None) -> bool: ...

    def overflow_waits(self, allocation: Allocation, total_tokens: int) -> bool: ...

    def room_version(self, tag: object) -> object: ...

    def adapter_cache(self) -> AdapterCache | None: ...

    def live_allocations(self) -> list[Allocation]: ...

    def stats(self) -> AllocatorStats: ...

    def check_invariants(self) -> None: ...

    def free_extents(self) -> list[tuple[int, int]]: ...


class AllocatorBase:
    """Live-allocation bookkeeping, counters, misuse checks, stats and the tiling invariant.

    Subclasses implement `_ranges(a)` (the byte ranges a live allocation owns), `free_extents()`
    (free ranges in address order), `_region_stats()` and `_check_structures()`. The tiling check
    sorts owned and free ranges together and requires them to cover [0, pool_bytes) exactly once:
    that is "no two live allocations overlap" and "reserved + free == pool" in one pass.
    """

    name = "base"
    scheduler = "fcfs"  # the scheduler a replay runs it with unless [scheduler] policy names one
    uses_predictions = False  # True for a policy that sizes reservations from predicted lengths
    shares_prefixes = False  # True where a replay may cache prompt prefixes in its blocks (allocator/prefix.py)
    settings: tuple[type, ...] = ()  # the settings classes (allocator/config.py) the policy reads
    policy_totals: tuple[str, ...] = ()  # names in policy_counters() that only grow (the rest are levels)

    @classmethod
    def complete_config(cls, config: AllocatorConfig, *, pool_bytes: int, bytes_per_token: int,
                        realized_kv_tokens, deployment=None) -> tuple[AllocatorConfig, dict]:
        """The config a replay runs this policy with, and notes on what was filled in: what the
        settings leave open that the policy decides from the pool and the trace's realized KV
        lengths in arrival order (capped at max_model_len). Nothing, unless a policy says so."""
        return config, {}

    @classmethod
    def arena_bytes(cls, pool_bytes: int, config: AllocatorConfig) -> int:
        """The bytes the policy's arena spans for a KV pool of `pool_bytes`: the pool, unless a
        policy takes memory besides it (eLLM borrows the activation reserve)."""
        return pool_bytes

    @classmethod
    def describe(cls, config: dict) -> str | None:
        """A line saying the policy's settings (`config`: its [allocator] mapping), for the console."""
        return None

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None,
                 deployment: Deployment | None = None) -> None:
        if not isinstance(pool_bytes, int) or pool_bytes < 1:
            raise ConfigError(f"pool_bytes must be a positive integer, got {pool_bytes!r}")
        if not isinstance(bytes_per_token, int) or bytes_per_token < 1:
            raise ConfigError(f"bytes_per_token must be a positive integer, got {bytes_per_token!r}")
        self.pool_bytes = self.kv_pool_bytes = pool_bytes
        self.bytes_per_token = bytes_per_token
        self.config = config
        if deployment is not None and not isinstance(deployment, Deployment):
            raise ConfigError(f"deployment must be an allocator.config.Deployment, got {type(deployment).__name__}")
        self.deployment = deployment if deployment is not None else Deployment()
        self.arena = arena if arena is not None else VirtualArena(pool_bytes)
        if self.arena.pool_bytes != pool_bytes:
            raise ConfigError(f"arena holds {self.arena.pool_bytes:,} bytes but the pool is {pool_bytes:,}")
        self.max_tokens = config.max_model_len_tokens
        self._live: dict[str, Allocation] = {}
        # counters kept on the hot path; reserves (= releases + live) and used tokens (a sum over the
        # live table) are derived in stats(), so reserve and extend do not pay for them
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self.failed_reserves = 0
        self.extends = self.failed_extends = 0
        self.migrations = self.migrated_bytes = 0
        self.releases = 0
        # the protocol's growth geometry and boundaries: one contiguous block per request and no
        # boundaries that change, unless a policy says otherwise
        self.block_size_tokens = None
        self.num_blocks = self.block_bytes = 0
        self.boundaries_tokens = ()
        self.boundary_updates = 0
        # how KV is read: one run per range a request occupies, counted by contiguous growth
        self.read_block_tokens = None
        self.kv_runs = 0

    # -- the operations (the Allocator protocol's), which each policy implements -----------------

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        raise NotImplementedError

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        raise NotImplementedError

    def release(self, allocation: Allocation, final_tokens: int | None = None) -> None:
        raise NotImplementedError

    # -- shared checks ---------------------------------------------------------------------------

    def _admit(self, request_id: str, prompt_tokens: int) -> None:
        """Raise AllocationError for a request that is already live or can never fit. Policies
        inline the test `request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens`
        and call this only when it holds."""
        if request_id in self._live:
            raise AllocationError(f"request '{request_id}' already holds a live allocation")
        if not 1 <= prompt_tokens <= self.max_tokens:
            raise AllocationError(
                f"request '{request_id}': {prompt_tokens} prompt tokens can never fit "
                f"(1 to max_model_len_tokens = {self.max_tokens})")

    def _own(self, a: Allocation) -> None:
        if not isinstance(a, Allocation):
            raise AllocationError(f"expected an Allocation, got {type(a).__name__}")
        if self._live.get(a.request_id) is not a:
            state = "already released" if not a.live else "not made by this allocator"
            raise AllocationError(f"allocation of request '{a.request_id}' is {state}")

    def _final_growth(self, a: Allocation, final_tokens: int, capacity_tokens: int) -> None:
        """`release(a, final_tokens)`: raise AllocationError unless used <= final_tokens <=
        capacity_tokens, then record the final length (the caller checked that `a` is live here)."""
        if not a.used_tokens <= final_tokens <= capacity_tokens:
            raise AllocationError(
                f"request '{a.request_id}': released at {final_tokens} KV tokens, outside "
                f"{a.used_tokens} (written) to {capacity_tokens} (what it can hold without an extend)")
        a.used_tokens = final_tokens

    def _growth(self, a: Allocation, total_tokens: int) -> None:
        """Raise AllocationError unless `a` is live here and `total_tokens` is a whole number that
        does not shrink it."""
        if type(a) is Allocation and type(total_tokens) is int:  # the valid case first: every extend passes here
            x = a  # compiled, typed locals (base.pxd): `total` a C integer, without a Python int for the test
            if x.owner is self:
                try:
                    total = total_tokens
                except OverflowError:  # past a C integer: the checks below decide
                    total = -1
                if total >= x.used_tokens:
                    return
        self._own(a)
        if isinstance(total_tokens, bool) or not isinstance(total_tokens, numbers.Integral):
            raise AllocationError(f"request '{a.request_id}': expected a whole number of KV tokens, got "
                                  f"{total_tokens!r}")
        if total_tokens < a.used_tokens:
            raise AllocationError(
                f"request '{a.request_id}': KV cannot shrink from {a.used_tokens} to {total_tokens} tokens")

    def _admitted(self, a: Allocation) -> Allocation:
        self._live[a.request_id] = a
        a.owner = self
        self.reserved_bytes += a.nbytes
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        return a

    def _forget(self, a: Allocation) -> None:
        del self._live[a.request_id]
        a.live = False
        a.owner = None
        self.releases += 1
        self.reserved_bytes -= a.nbytes

    def record_peak(self, reserved_bytes: int) -> None:
        """A caller that hands growth over lazily (the replay's fast-forward gives paged blocks at
        completion) reports the most bytes eager growth would have held at once, so
        `peak_reserved_bytes` means the same whichever way growth arrived."""
        if reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = reserved_bytes

    def live_allocations(self) -> list[Allocation]:
        return list(self._live.values())

    @property
    def free_blocks(self) -> int:
        """Block-growth policies: blocks free now (0 for contiguous ones)."""
        return 0

    # -- the protocol's questions with defaults (see Allocator) ----------------------------------

    def block_limit(self, tokens: int, sequences: int) -> int:
        """The blocks the KV may hold during an iteration: the pool's, whatever the iteration runs."""
        return self.num_blocks

    def runs_of(self, allocation: Allocation, kv_tokens: int) -> int:
        """The runs a live request holding `kv_tokens` is read as: one per `read_block_tokens`, or
        one (a contiguous range)."""
        block = self.read_block_tokens
        return 1 if block is None else -(-kv_tokens // block)

    def mean_released_runs(self) -> float | None:
        return None

    def host_tier(self) -> HostTier | None:
        return None

    def adapter_cache(self) -> AdapterCache | None:
        return None

    def tag_of(self, prompt_tokens: int, predicted_output_tokens: float | None, uncertainty: float | None) -> object:
        """One kind of block: every request has the same tag."""
        return None

    def reservation_tokens(self, prompt_tokens: int, predicted_output_tokens: float | None,
                           uncertainty: float | None) -> int:
        """The KV tokens `reserve` takes for a new request of `prompt_tokens` now: by default its
        prompt. Every policy overrides it (its prompt in whole blocks or pages; static's slot; s3's
        and odma's blocks), and its `reserve` takes what this says."""
        return prompt_tokens

    def room_for(self, prompt_tokens: int, predicted_output_tokens: float | None, uncertainty: float | None) -> bool:
        """Whether a new request's reservation would find room now (`reserve` would succeed; a
        router's question, sim/cluster.py), taking nothing: by default its `reservation_tokens`
        against the bytes not reserved. A policy with regions or contiguous blocks overrides it."""
        return self.reservation_tokens(prompt_tokens, predicted_output_tokens, uncertainty) * self.bytes_per_token \
            <= self.pool_bytes - self.reserved_bytes

    def overflow_waits(self, allocation: Allocation, total_tokens: int) -> bool:
        """A refused extend preempts."""
        return False

    def room_version(self, tag: object) -> object:
        """Unknown: a failed reservation is retried every time."""
        return -1

    def kv_ranges(self, allocation: Allocation) -> list[tuple[int, int]]:
        """The (start, nbytes) byte ranges a live allocation owns, in the order its tokens fill
        them (an on-device replay reads a policy with contiguous growth through them)."""
        self._own(allocation)
        return self._ranges(allocation)

    # -- reporting -------------------------------------------------------------------------------

    def stats(self) -> AllocatorStats:
        regions = self._region_stats()
        main = regions["main"]
        free_bytes = sum(r.free_bytes for r in regions.values())
        largest = main.largest_free_extent_bytes
        return AllocatorStats(
            policy=self.name, arena=self.arena.kind, device=self.arena.device,
            pool_bytes=self.pool_bytes, bytes_per_token=self.bytes_per_token,
            reserved_bytes=self.reserved_bytes,
            used_bytes=sum(a.used_tokens for a in self._live.values()) * self.bytes_per_token,
            free_bytes=free_bytes, largest_free_extent_bytes=largest,
            fragmentation_ratio=largest / main.free_bytes if main.free_bytes else 1.0,
            live_allocations=len(self._live), peak_reserved_bytes=self.peak_reserved_bytes,
            reserves=self.releases + len(self._live), failed_reserves=self.failed_reserves,
            extends=self.extends, failed_extends=self.failed_extends,
            migrations=self.migrations, migrated_bytes=self.migrated_bytes, releases=self.releases,
            regions=regions, policy_counters=self.policy_counters(), policy_totals=list(self.policy_totals),
        )

    def check_invariants(self) -> None:
        """Raise InvariantError unless the allocator's state is consistent (O(live + free) log)."""
        spans: list[tuple[int, int, str]] = []
        reserved = 0
        for rid, a in self._live.items():
            if rid != a.request_id or not a.live or a.owner is not self:
                raise InvariantError(f"live table entry '{rid}' holds {a!r}")
            if a.nbytes != a.capacity_tokens * self.bytes_per_token or not 0 < a.used_tokens <= a.capacity_tokens:
                raise InvariantError(f"allocation sizes disagree: {a!r}")
            reserved += a.nbytes
            spans += [(start, n, f"request '{rid}'") for start, n in self._ranges(a)]
        spans += self._other_spans()
        spans += [(start, n, "free extent") for start, n in self.free_extents()]
        spans.sort()
        pos, prev = 0, "the pool's start"
        for start, n, what in spans:
            if start < pos:
                raise InvariantError(f"{what} at {start} overlaps {prev} (which ends at {pos})")
            if start > pos:
                raise InvariantError(f"bytes {pos}..{start} are neither reserved nor free (after {prev})")
            pos, prev = start + n, f"{what} at {start}"
        if pos != self.pool_bytes:
            raise InvariantError(f"owned and free ranges end at {pos}, the pool at {self.pool_bytes}")
        reserved += self._other_reserved_bytes()
        if reserved != self.reserved_bytes:
            raise InvariantError(f"reserved-bytes counter drifted: {self.reserved_bytes}, live allocations hold {reserved}")
        try:
            self._check_structures()
        except InvariantError:
            raise
        except AssertionError as exc:
            raise InvariantError(str(exc)) from exc

    # -- per policy ------------------------------------------------------------------------------

    def policy_counters(self) -> dict[str, int]:
        return {}

    def _other_spans(self) -> list[tuple[int, int, str]]:
        """(start, nbytes, what) of pool bytes held by something other than a request's KV (ADR-006's
        adapters), for the tiling check."""
        return []

    def _other_reserved_bytes(self) -> int:
        """Bytes counted as reserved that no live allocation holds (a prefix cache's referenced units)."""
        return 0

    def _ranges(self, a: Allocation) -> list[tuple[int, int]]:
        raise NotImplementedError

    def free_extents(self) -> list[tuple[int, int]]:
        raise NotImplementedError

    def _region_stats(self) -> dict[str, RegionStats]:
        raise NotImplementedError

    def _check_structures(self) -> None:
        raise NotImplementedError
