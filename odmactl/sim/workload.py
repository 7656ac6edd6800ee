"""The requests a replay serves, as numpy arrays in arrival order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odmactl.trace.prefix import PrefixKeys

PS = 10**12  # picoseconds per second: the replay's clock is integer picoseconds
CLOCK_LIMIT_PS = 2**63  # the compiled clock is a signed 64-bit integer: about 106.75 days


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, as numpy arrays (row i is request i). `arrival_ps` is
    nondecreasing; `output_tokens` >= 1; `predicted_output_tokens` and `uncertainty` are None when no
    predictor runs (then policies reserve without a prediction); `adapters` the LoRA adapter each
    request runs with (int64 codes >= 0, -1 for the base model), None when the trace names none."""

    request_ids: list[str]
    arrival_ps: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_output_tokens: np.ndarray | None = None
    uncertainty: np.ndarray | None = None
    adapters: np.ndarray | None = None
    prefix: PrefixKeys | None = None  # each prompt's prefix hashes (allocator/prefix.py), None when the trace has none

    @property
    def size(self) -> int:
        return len(self.request_ids)

    def kv_tokens(self, max_len: int, max_new_tokens: int | None = None) -> np.ndarray:
        """Each request's realized KV tokens (prompt + output, the output at most `max_new_tokens`
        when given), capped at max_len."""
        output = self.output_tokens.astype(np.int64)
        if max_new_tokens is not None:
            output = np.minimum(output, max_new_tokens)
        return np.minimum(self.prompt_tokens.astype(np.int64) + output, max_len)

    def take(self, start: int, stop: int) -> Workload:
        """Requests start..stop-1, arrival times unchanged (a replay starts at its first arrival)."""
        def cut(a):
            return None if a is None else a[start:stop]

        return Workload(self.request_ids[start:stop], self.arrival_ps[start:stop], self.prompt_tokens[start:stop],
                        self.output_tokens[start:stop], cut(self.predicted_output_tokens), cut(self.uncertainty),
                        cut(self.adapters), None if self.prefix is None else self.prefix.select(slice(start, stop)))

    def at_rate_scale(self, scale: float) -> Workload:
        """The same requests arriving `scale` times as fast: every arrival time divided by `scale`
        (rounded to whole ps, so still nondecreasing)."""
        arrival = np.round(self.arrival_ps.astype(np.float64) / scale).astype(np.int64)
        return Workload(self.request_ids, arrival, self.prompt_tokens, self.output_tokens,
                        self.predicted_output_tokens, self.uncertainty, self.adapters, self.prefix)

    def replica(self, index: int, replicas: int) -> Workload:
        """The requests a round-robin router sends to replica `index` of `replicas`: rows index,
        index + replicas, ..., arrival times unchanged."""
        def every(a):
            return None if a is None else a[index::replicas]

        return Workload(self.request_ids[index::replicas], self.arrival_ps[index::replicas],
                        self.prompt_tokens[index::replicas], self.output_tokens[index::replicas],
                        every(self.predicted_output_tokens), every(self.uncertainty), every(self.adapters),
                        None if self.prefix is None else self.prefix.select(slice(index, None, replicas)))
