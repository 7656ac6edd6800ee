from __future__ import annotations

import numpy as np

from odmactl.rules.buckets import SlidingWindowRefit, bucket_of, quantile_boundaries


def test_quantile_boundaries_match_numpy() -> None:
    x = np.random.default_rng(1).lognormal(5, 1, 5000).astype(int) + 1
    got = quantile_boundaries(x, 4, granularity_tokens=1)
    assert got == tuple(int(v) for v in np.quantile(x, [0.25, 0.5, 0.75, 1.0], method="higher"))
    assert got[-1] == x.max()
    assert quantile_boundaries(x, 4, granularity_tokens=64, max_tokens=512)[-1] == 512
    assert all(b % 64 == 0 for b in quantile_boundaries(x, 4, granularity_tokens=64))
    assert quantile_boundaries(np.full(100, 7), 4, granularity_tokens=16) == (16,)  # merged


def test_bucket_of() -> None:
    assert bucket_of((64, 128), 1) == 0 and bucket_of((64, 128), 64) == 0
    assert bucket_of((64, 128), 65) == 1 and bucket_of((64, 128), 129) is None


def test_sliding_window_only_sees_the_last_window() -> None:
    refit = SlidingWindowRefit(window=100, refresh_every=50, num_buckets=2, granularity_tokens=1)
    out = [refit.observe(v) for v in [1000] * 100 + [10] * 100]
    fresh = [o for o in out if o is not None]
    assert len(fresh) == 4 and refit.refits == 4
    assert fresh[1] == (1000,) and fresh[-1] == (10,)  # the 1000s have left the window
    assert fresh[2] == (1000,)  # half and half: both quantiles at the higher value


def test_observe_many_equals_one_at_a_time() -> None:
    values = np.random.default_rng(3).integers(1, 5000, 2345)
    one = SlidingWindowRefit(window=300, refresh_every=70, num_buckets=4)
    many = SlidingWindowRefit(window=300, refresh_every=70, num_buckets=4)
    last = None
    for v in values:
        out = one.observe(int(v))
        last = out if out is not None else last
    got = None
    for chunk in np.array_split(values, [5, 400, 401, 1200]):  # chunks smaller and larger than the window
        out = many.observe_many(chunk)
        got = out if out is not None else got
    assert got == last and many.refits == one.refits == 2345 // 70 and many.seen == one.seen
    assert sorted(many._ring) == sorted(-(-values[-300:] // 16))
    assert many.boundaries() == quantile_boundaries(values[-300:], 4, granularity_tokens=16)


def test_histogram_boundaries_equal_the_sorted_quantiles() -> None:
    rng = np.random.default_rng(5)
    for window, g, b in [(1000, 16, 4), (77, 1, 3), (500, 64, 8)]:
        refit = SlidingWindowRefit(window=window, refresh_every=window, num_buckets=b, granularity_tokens=g,
                                   max_tokens=6000)
        values = rng.lognormal(6, 1.2, 3 * window).astype(int) + 1
        out = refit.observe_many(values)
        assert out == quantile_boundaries(values[-window:], b, granularity_tokens=g, max_tokens=6000)


def test_quantile_levels_other_than_equal_occupancy() -> None:
    x = np.random.default_rng(2).lognormal(5, 1, 4000).astype(int) + 1
    levels = (0.4375, 0.75, 0.9375, 1.0)
    got = quantile_boundaries(x, 4, granularity_tokens=1, levels=levels)
    assert got == tuple(int(v) for v in np.quantile(x, levels, method="higher"))
    refit = SlidingWindowRefit(window=1000, refresh_every=1000, num_buckets=4, granularity_tokens=16, levels=levels)
    assert refit.observe_many(x) == quantile_boundaries(x[-1000:], 4, granularity_tokens=16, levels=levels)


def test_refit_follows_a_real_distribution_shift(shared_traces) -> None:
    """Azure conv traffic, then Azure code traffic (real KV lengths: context + generated). The first
    refresh after the switch already moves the boundaries toward the new distribution; once a whole
    window of the new traffic has been seen they are exactly its quantiles (issue 4, acceptance 4)."""
    import polars as pl

    def kv(name: str) -> np.ndarray:
        f = pl.read_csv(shared_traces / name)
        return (f["ContextTokens"] + f["GeneratedTokens"]).to_numpy()

    conv, code = kv("AzureLLMInferenceTrace_conv.csv.gz"), kv("AzureLLMInferenceTrace_code.csv.gz")
    refit = SlidingWindowRefit(window=2000, refresh_every=200, num_buckets=4, max_tokens=16384)
    before = refit.observe_many(conv[:6000])
    assert before == quantile_boundaries(conv[4000:6000], 4, max_tokens=16384)
    first = refit.observe_many(code[:200])  # one refresh period into the new traffic
    target = quantile_boundaries(code[:2000], 4, max_tokens=16384)
    assert first != before
    # the boundary the shift moves most (here the 75th percentile: 1536 -> 2784 tokens) responds at
    # the first refresh; the top one is the window's maximum and waits for the old maximum to leave
    k = max(range(len(before) - 1), key=lambda i: abs(target[i] - before[i]))
    assert abs(target[k] - first[k]) < abs(target[k] - before[k])
    after = refit.observe_many(code[200:2000])  # a whole window of the new traffic
    assert after == target
