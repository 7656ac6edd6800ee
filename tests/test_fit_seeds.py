"""`odmactl fit` against the trivial predictor (issue 29): the constant predictor's bucket
accuracies beside the predictor's, and `--seeds N`, the mean and sample sd over N seeded fits."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

from odmactl.predict.artifact import WEIGHTS, read_manifest
from odmactl.predict.evaluation import EvalSettings, constant_buckets, evaluate_predictions
from odmactl.predict.fitting import SEED_MARGINS, SEED_METRICS
from odmactl.rules.s3 import s3_capacities, s3_classes

BOUNDS = (64, 128, 256, 512)
SETTINGS = EvalSettings(BOUNDS, 0.2, 0.8, 1024, 4)  # S3: four 256-token buckets


@pytest.fixture(scope="module")
def alpaca(tmp_path_factory) -> Path:
    from odmactl.cli import main

    out = tmp_path_factory.mktemp("alpaca-seeds") / "alpaca.parquet"
    assert main(["ingest", str(SAMPLES / "alpaca_small_2000.json.gz"), "--out", str(out), "--offline"]) == 0
    return out


def _parts(seed: int) -> tuple[np.ndarray, ...]:
    """(train prompt, train output, held-out prompt, held-out output): lengths spread over every
    fitted and S3 bucket, with a different mix on the two sides."""
    rng = np.random.default_rng(seed)
    train_p, test_p = rng.integers(1, 40, 600), rng.integers(1, 40, 300)
    train_o = np.minimum(rng.geometric(1 / 120, 600), 1200)
    test_o = np.minimum(rng.geometric(1 / 90, 300), 1200)
    return train_p, train_o, test_p, test_o


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_constant_predictor_scores_exactly_the_constant_baseline(seed):
    train_p, train_o, test_p, test_o = _parts(seed)
    s = SETTINGS.with_constant_from(train_p, train_o)
    fitted, s3 = constant_buckets(train_p, train_o, SETTINGS)
    assert (s.constant_bucket, s.constant_bucket_s3) == (fitted, s3)
    # the most common bucket of the training part, by hand
    kv_classes = [next((i for i, b in enumerate(BOUNDS) if k <= b), len(BOUNDS)) for k in train_p + train_o]
    assert fitted == max(range(len(BOUNDS) + 1), key=lambda c: (kv_classes.count(c), -c))
    assert s3 == int(np.argmax(np.bincount(np.minimum(np.ceil(train_o / 256) - 1, 3).astype(int))))
    u = np.zeros(test_p.size)

    # S3's classes are over output tokens: one constant L_hat, the capacity of the mode class
    caps = s3_capacities(1024, 4)
    l_hat = np.full(test_p.size, caps[s3])
    ev = evaluate_predictions(test_p, test_o, l_hat, u, s)
    assert ev["bucket_accuracy_s3"] == ev["constant_bucket_accuracy_s3"]
    assert ev["constant_bucket_accuracy_s3"] == np.mean(s3_classes(test_o, caps) == s3)
    assert ev["kendall_tau"] is None and ev["constant_kendall_tau"] is None  # constant predictions rank nothing

    # the fitted buckets are over KV tokens: the constant predictor names one KV bucket for every
    # request (prompt + L_hat at that bucket's top, or one past the last boundary)
    top = BOUNDS[fitted] if fitted < len(BOUNDS) else BOUNDS[-1] + 1
    ev = evaluate_predictions(test_p, test_o, top - test_p, u, s)
    assert ev["bucket_accuracy"] == ev["constant_bucket_accuracy"]
    assert ev["constant_predictor"] == {"bucket": fitted, "bucket_s3": s3, "mode_of": "training part"}


def test_without_a_training_part_the_constant_is_the_held_out_mode():
    """Called with no training part, the constant is the evaluated part's own most common bucket:
    the best any constant predictor scores there, so no constant beats it."""
    _, _, test_p, test_o = _parts(3)
    ev = evaluate_predictions(test_p, test_o, test_o, np.zeros(test_p.size), SETTINGS)
    assert ev["constant_predictor"]["mode_of"] == "held-out part"
    assert ev["bucket_accuracy"] == ev["bucket_accuracy_s3"] == 1.0  # exact predictions
    caps = s3_capacities(1024, 4)
    for c in range(len(caps)):
        shares = evaluate_predictions(test_p, test_o, np.full(test_p.size, caps[c]), np.zeros(test_p.size), SETTINGS)
        assert shares["bucket_accuracy_s3"] <= ev["constant_bucket_accuracy_s3"]
    # a tie goes to the smaller bucket
    tie = EvalSettings(BOUNDS, 0.2, 0.8, 1024, 4).with_constant_from(np.array([1, 1, 1, 1]), np.array([10, 10, 300, 300]))
    assert (tie.constant_bucket, tie.constant_bucket_s3) == (0, 0)


def test_fit_seeds_json_reports_mean_and_sample_sd(cli, alpaca, tmp_path):
    out = tmp_path / "pred"
    args = ("fit", alpaca, "--out", out, "--epochs", "2", "--json")
    single = cli(*args)
    assert single.code == 0, single.err
    one = json.loads(single.out)
    digest = hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest()
    ev = one["evaluation"]
    assert {"constant_bucket_accuracy", "constant_bucket_accuracy_s3", "constant_kendall_tau"} <= ev.keys()
    assert ev["constant_kendall_tau"] is None and ev["constant_predictor"]["mode_of"] == "training part"
    assert one["over_seeds"]["count"] == 1 and one["over_seeds"]["metrics"]["kendall_tau"]["sd"] is None
    assert one["over_seeds"]["metrics"]["kendall_tau"]["mean"] == ev["kendall_tau"]

    many = cli(*args, "--seeds", "3", "--force")
    assert many.code == 0, many.err
    doc = json.loads(many.out)
    seeds = doc["over_seeds"]
    assert seeds["count"] == 3 and seeds["seeds"] == [0, 1, 2] and seeds["split_varies_with_seed"]
    assert set(seeds["metrics"]) == {*SEED_METRICS, *SEED_MARGINS, "constant_kendall_tau"}
    for name in (*SEED_METRICS, *SEED_MARGINS):
        figure = seeds["metrics"][name]
        assert len(figure["per_seed"]) == 3
        assert figure["mean"] == pytest.approx(np.mean(figure["per_seed"]), abs=1e-15)
        assert figure["sd"] == pytest.approx(np.std(figure["per_seed"], ddof=1), abs=1e-15)
    metrics = seeds["metrics"]
    for margin, (model, constant) in SEED_MARGINS.items():
        assert metrics[margin]["per_seed"] == pytest.approx(
            np.subtract(metrics[model]["per_seed"], metrics[constant]["per_seed"]))
    assert metrics["constant_kendall_tau"] == {"mean": None, "sd": None, "per_seed": [None] * 3}
    assert len(set(metrics["kendall_tau"]["per_seed"])) > 1  # the splits and fits differ
    # the evaluation and the artifact are the first seed's, the same as a single fit's
    assert doc["evaluation"] == ev and doc["split"] == one["split"]
    assert hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest() == digest
    assert read_manifest(out)["evaluation"]["bucket_accuracy"] == ev["bucket_accuracy"]
    # the same inputs and seeds give the same bytes
    again = cli(*args, "--seeds", "3", "--force")
    assert again.code == 0 and again.out == many.out


def test_fit_seeds_under_a_time_split_and_on_the_console(cli, alpaca, tmp_path):
    doc = json.loads(cli("fit", alpaca, "--out", tmp_path / "t", "--epochs", "1", "--split-by", "time",
                         "--seeds", "2", "--json").out)
    seeds = doc["over_seeds"]
    assert not seeds["split_varies_with_seed"] and seeds["test_rows"] == [400, 400]
    assert seeds["metrics"]["constant_bucket_accuracy"]["sd"] == 0.0  # same rows, same training part: same mode
    text = cli("fit", alpaca, "--out", tmp_path / "c", "--epochs", "1", "--seeds", "2", "--seed", "5")
    assert text.code == 0, text.err
    assert "over 2 seeds, 5-6" in text.out and "ddof=1" in text.out and "n/a" in text.out
    assert "constant: a predictor that always names the training part's most common bucket" in text.out


@pytest.mark.parametrize("value, code, words", [
    ("0", 1, "--seeds: expected a whole number from 1 to 100, got 0"),
    ("-1", 1, "--seeds: expected a whole number from 1 to 100, got -1"),
    ("101", 1, "--seeds: expected a whole number from 1 to 100, got 101"),
    ("1.5", 2, "Invalid value for '--seeds'"),
    ("x", 2, "Invalid value for '--seeds'"),
])
def test_bad_seeds_are_plain_errors(cli, alpaca, tmp_path, value, code, words):
    """Like every whole-number option: not a number is click's usage error (exit 2), a number out
    of range odmactl's message (exit 1); neither a traceback nor an artifact."""
    r = cli("fit", alpaca, "--out", tmp_path / "p", "--seeds", value)
    assert r.code == code and words in r.err and "--seeds" in r.err and "Traceback" not in r.err, r.err
    assert not (tmp_path / "p").exists()


def test_seeds_past_the_largest_seed_are_refused(cli, alpaca, tmp_path):
    r = cli("fit", alpaca, "--out", tmp_path / "p", "--seed", str((1 << 63) - 2), "--seeds", "3")
    assert r.code == 1 and "runs past the largest seed" in r.err and "Traceback" not in r.err
