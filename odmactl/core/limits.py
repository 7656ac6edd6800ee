"""The ranges odmactl accepts for its whole-number settings, in one place.

The upper limits lie far above any real deployment and low enough that no count overflows the
simulator's 64-bit arithmetic, allocates a buffer of that size, or keeps a command busy for hours:
a value past one is a typo, and is reported as one, naming the flag or key, before any work.
"""

from __future__ import annotations

from odmactl.core.errors import ConfigError

MAX_TOKENS = 1 << 24  # KV tokens of one request or block: max_model_len, block sizes, granularity, prefill
MAX_NUM_SEQS = 1 << 16  # requests in one batch
MAX_POOL_TOKENS = 1 << 27  # KV tokens in one engine's pool (134M: 8.4M paged blocks; real pools hold about 1M)
MAX_BUCKETS = 4_096  # ODMA's quantile buckets, S3's equal-width buckets, fit's --buckets
MAX_WINDOW_REQUESTS = 10_000_000  # ODMA's refit window and interval
MAX_TP = 64  # devices in one tensor-parallel group
MAX_WORKERS = 256  # plan's worker processes
MAX_REPLAYS = 10_000  # plan's full replays
MAX_REQUESTS = 1 << 40  # requests counted in a trace: --skip
MAX_EPOCHS = 10_000  # predictor training epochs
MAX_SEED = (1 << 63) - 1  # numpy's and torch's generators both take it
MAX_GAMMA = 1_000.0  # ODMA's inflation: L_hat * (1 + gamma * u); past this every request is a max_model_len block
HOLDOUT_RANGE = (0.05, 0.8)  # the share of a trace held out for evaluation: enough on both sides of the split
MAX_SEEDS = 100  # fit's --seeds: each seed is a whole fit


def check_whole(value: object, low: int, high: int, flag: str) -> None:
    """Raise a ConfigError naming `flag` unless `value` is a whole number in [low, high]."""
    problem = whole_number_problem(value, low, high)
    if problem is not None:
        raise ConfigError(f"{flag}: {problem}")


def check_seed(seed: object, flag: str = "--seed") -> None:
    """A seed for numpy's and torch's generators: a whole number from 0 to MAX_SEED."""
    check_whole(seed, 0, MAX_SEED, flag)


def whole_number_problem(value: object, low: int, high: int) -> str | None:
    """What is wrong with `value` as a whole number in [low, high], or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected a whole number, got {value!r}"
    if not low <= value <= high:
        return f"expected a whole number from {low:,} to {high:,}, got {value:,}"
    return None
