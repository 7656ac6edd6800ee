"""S3's buckets: one rule for the allocator, the S3 predictor's classes and their evaluation.

S3 (Jin et al., NeurIPS 2023, arXiv:2306.06000) splits the maximum length into equal-width
buckets of OUTPUT (generated) tokens: S3 predicts the bucket of a request's output length. A
bucket is a reservation of whole tokens, so the width is an integer: w = ceil(max_tokens / n) with
n = min(num_buckets, max_tokens), and bucket i holds output lengths up to min((i + 1) * w,
max_tokens). The last bucket may be narrower, and where (i + 1) * w reaches max_tokens early the
capped capacities coincide and count once. A length's bucket is the smallest whose capacity holds
it (past max_tokens: the last). The allocator reserves the prompt plus the predicted output's
bucket capacity (allocator/s3.py), the S3 predictor classifies output lengths into these buckets
and predicts the capacity of its class, and `bucket_accuracy_s3` compares these classes, so the
three can never disagree about a length.
(Earlier versions classified with a fractional width, max_tokens / n: at max 4,096 and 10
buckets, a 410-token length was class 1 there and bucket 0 in the allocator.)
"""

from __future__ import annotations

import numpy as np


def s3_capacities(max_tokens: int, num_buckets: int) -> tuple[int, ...]:
    """The bucket capacities in tokens, increasing (see the module docstring)."""
    n = min(num_buckets, max_tokens)
    width = -(-max_tokens // n)
    return tuple(sorted({min((i + 1) * width, max_tokens) for i in range(n)}))


def s3_classes(tokens: np.ndarray, capacities: tuple[int, ...]) -> np.ndarray:
    """Each length's bucket: the smallest capacity that holds it, the last one past the maximum."""
    caps = np.asarray(capacities, dtype=np.int64)
    return np.minimum(np.searchsorted(caps, np.asarray(tokens, dtype=np.int64), side="left"), caps.size - 1)
