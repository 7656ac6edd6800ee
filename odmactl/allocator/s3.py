"""`s3`: S3's static equal-width buckets over the output length, chosen from the prediction (Jin et
al., NeurIPS 2023, arXiv:2306.06000); an outgrown bucket is preempted (S3's supervisor) or moved."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from odmactl.allocator.arena import Arena
from odmactl.allocator.base import Allocation
from odmactl.allocator.config import AllocatorConfig, Deployment, PolicySettings, one_of, whole_numbers
from odmactl.allocator.contiguous import ContiguousAllocator
from odmactl.core.errors import ConfigError
from odmactl.core.limits import MAX_BUCKETS
from odmactl.rules.s3 import s3_capacities

S3_OVERFLOWS = ("preempt", "migrate")  # s3 on an outgrown bucket: the S3 paper's preemption, or a copy

OVERFLOW_MODES = dict(zip(S3_OVERFLOWS, (  # what happens to a request that outgrows its bucket, by s3_overflow
    "an outgrown request is preempted and re-admitted with the next bucket (S3's supervisor)",
    "an outgrown request is copied into a larger bucket (odmactl's earlier S3)",
)))


@dataclass(frozen=True)
class S3Settings(PolicySettings):
    """S3's equal-width buckets over the output (`s3_num_buckets`) and what an outgrown bucket does
    (`s3_overflow`, one of S3_OVERFLOWS)."""

    s3_num_buckets: int = 10
    s3_overflow: str = "preempt"

    def __post_init__(self) -> None:
        whole_numbers(self, ("s3_num_buckets", 1, MAX_BUCKETS))
        one_of(self, "s3_overflow", S3_OVERFLOWS)


def bucket_of(capacities_tokens: tuple, predicted_output_tokens) -> int:
    """A new request's bucket: the first whose capacity holds its predicted output (the last one
    without a prediction)."""
    if predicted_output_tokens is None:
        return len(capacities_tokens) - 1
    return min(bisect_left(capacities_tokens, int(predicted_output_tokens)), len(capacities_tokens) - 1)


def block_tokens(prompt_tokens: int, capacity_tokens: int, predicted: bool, max_tokens: int) -> int:
    """A new request's block: prompt + its bucket's capacity, max_model_len without a prediction,
    at most max_model_len (a re-admission after a preemption takes its record's)."""
    if not predicted:
        return max_tokens
    return prompt_tokens + capacity_tokens if prompt_tokens + capacity_tokens < max_tokens else max_tokens


class S3Allocator(ContiguousAllocator):
    """`s3_num_buckets` equal-width buckets over OUTPUT tokens up to max_model_len (rules/s3.py, the
    S3 predictor's classes): bucket i holds `capacities_tokens[i]` output tokens. A request with
    prompt p and predicted output L gets one block of p + capacities_tokens[b] KV tokens, b the
    bucket of L (the smallest that holds it, the last past max_model_len), capped at max_model_len;
    without a prediction, max_model_len (bucket b the last). `Allocation.bucket` is b.

    When a request grows past its block, `s3_overflow` decides:
    - "preempt" (the default, the S3 paper's supervisor): `extend` answers False, and the caller
      preempts the request (the replay releases it, queues it at the front and recomputes its prompt
      and generated tokens at re-admission). The allocator records, for that request id, its
      original prompt p and the next larger bucket b + 1; the next `reserve` of that id (whatever
      its prompt_tokens, now p + generated, and prediction) gets p + capacities_tokens[b + 1],
      capped at max_model_len and never less than prompt_tokens + 1 (its next token fits), with
      bucket b + 1, and drops the record (`escalations` counts these re-admissions). A request
      preempted again escalates again, one bucket at a time.
    - "migrate" (odmactl's earlier S3): `extend` moves the request by a copy (allocate, copy,
      release) to p + capacities_tokens[b'], b' the smallest bucket holding total_tokens - p;
      False (the caller preempts) when there is no room for it. A re-admission after such a
      preemption is sized like a new request, with p = prompt + generated.
    In both, growing past max_model_len fails (no record is kept). The original prompt is read back
    from the block, p = capacity_tokens - capacities_tokens[bucket]: exact for every block below
    max_model_len (a capped block never outgrows itself), except a re-admission that the
    prompt_tokens + 1 floor raised, which counts from that raised prompt.

    Invariants (beside ContiguousAllocator's): a record (p, b) has p >= 1 and 0 < b < number of
    buckets; a record is written only by a failed extend in "preempt" mode and removed by the
    successful reserve of its id, so records number at most the requests preempted and not yet
    re-admitted (one a caller never re-admits keeps its record, which holds no memory); "migrate"
    keeps none.
    """

    name = "s3"
    settings = (S3Settings,)
    uses_predictions = True  # sizes reservations from predicted lengths: a replay without a predictor must say so

    def __init__(self, pool_bytes: int, bytes_per_token: int, config: AllocatorConfig, arena: Arena | None = None,
                 deployment: Deployment | None = None) -> None:
        super().__init__(pool_bytes, bytes_per_token, config, arena, deployment)
        self._init_regions({"main": pool_bytes})
        self.capacities_tokens = s3_capacities(self.max_tokens, config.s3_num_buckets)
        self.preempts = config.s3_overflow == "preempt"
        self._escalated: dict = {}  # request id -> (original prompt tokens, the bucket it is re-admitted with)
        self.escalations = 0

    @classmethod
    def complete_config(cls, config: AllocatorConfig, *, pool_bytes: int, bytes_per_token: int,
                        realized_kv_tokens, deployment=None) -> tuple[AllocatorConfig, dict]:
        """Nothing to fill in; the notes say which overflow mode runs (AllocatorBase.complete_config)."""
        how = OVERFLOW_MODES[config.s3_overflow]
        return config, {"overflow": f"s3_overflow = {config.s3_overflow!r}: {how}"}

    def reserve(self, request_id: str, prompt_tokens: int, predicted_output_tokens: int | None = None,
                uncertainty: float | None = None) -> Allocation | None:
        if request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens:
            self._admit(request_id, prompt_tokens)
        caps = self.capacities_tokens
        record = self._escalated.get(request_id) if self._escalated else None
        if record is not None:
            bucket = record[1]
            need = max(record[0] + caps[bucket], prompt_tokens + 1)
        else:
            bucket = bucket_of(caps, predicted_output_tokens)
            need = block_tokens(prompt_tokens, caps[bucket], predicted_output_tokens is not None, self.max_tokens)
        a = self._reserve_in(self._main, "main", request_id, min(need, self.max_tokens), prompt_tokens, bucket)
        if a is not None and record is not None:
            del self._escalated[request_id]
            self.escalations += 1
        return a

    def reservation_tokens(self, prompt_tokens: int, predicted_output_tokens, uncertainty) -> int:
        caps = self.capacities_tokens
        return block_tokens(prompt_tokens, caps[bucket_of(caps, predicted_output_tokens)],
                            predicted_output_tokens is not None, self.max_tokens)

    def extend(self, allocation: Allocation, total_tokens: int) -> bool:
        if self._grow_in_place(allocation, total_tokens):
            return True
        if total_tokens > self.max_tokens:
            self.failed_extends += 1
            return False
        # below max_model_len here, so the block is p + capacities_tokens[bucket], uncapped
        caps = self.capacities_tokens
        bucket = allocation.bucket
        prompt = allocation.capacity_tokens - caps[bucket]
        if self.preempts:
            self.failed_extends += 1
            if bucket + 1 < len(caps):
                self._escalated[allocation.request_id] = (prompt, bucket + 1)
            return False
        bucket = bisect_left(caps, total_tokens - prompt)
        return self._migrate(allocation, "main", min(prompt + caps[bucket], self.max_tokens), bucket, total_tokens)

    policy_totals = ("escalations",)

    def policy_counters(self) -> dict[str, int]:
        return {"escalations": self.escalations, "awaiting_readmission": len(self._escalated)}

    def _check_structures(self) -> None:
        ContiguousAllocator._check_structures(self)
        n = len(self.capacities_tokens)
        for rid, (prompt, bucket) in self._escalated.items():
            assert prompt >= 1 and 0 < bucket < n, f"request '{rid}': escalation record ({prompt}, {bucket})"
        assert self.preempts or not self._escalated, "s3_overflow = 'migrate' keeps no escalation records"
