"""LengthPredictor: request features -> (L_hat, u) before decoding starts; fit, predict, save, load,
evaluate.

Two feature families share one torch network (`LengthNet`):
  - "embedded" (default): hashed word 1-2-grams of the prompt text (an EmbeddingBag), model and
    tenant identifiers, log prompt tokens; trained on the trace itself.
  - "encoder": a frozen local Hugging Face encoder's mean-pooled prompt embedding in place of the
    n-grams (`--encoder DIR`).
and two heads modes:
  - "odma": a regression head for log output tokens (L_hat = its exponential), a quantile head for
    the UPPER_QUANTILE (0.99) of log output tokens (pinball loss, Koenker & Bassett 1978), and a
    classification head over `num_classes` equal-occupancy length classes of the training data
    (trained alongside; it shapes the shared layers and reports bucket accuracy).
  - "s3": the S3 baseline (Jin et al., NeurIPS 2023, arXiv:2306.06000): a classifier over S3's
    equal-width buckets of the maximum length (rules/s3.py, the allocator's buckets); L_hat = the
    predicted bucket's capacity (what S3 reserves).
u (odma mode) is chosen by the `uncertainty` setting (`odmactl fit --uncertainty`):
  - "entropy": the papers' u (seeds/001 §3.2, "the entropy or margin of a softmax
    distribution over coarse length buckets"): the entropy of the classification head's softmax
    over its C classes divided by log C, in [0, 1] (0: one class certain; 1: all equally likely).
    The entropy, not the margin: it reads the whole distribution, the margin only its top two.
    So tau keeps the papers' meaning (route the requests whose class is most in doubt), and
    gamma * u inflates L_hat by at most gamma.
  - "headroom" (the default, measured to serve better; an artifact from before the choice has it): the headroom the
    request needs over L_hat, on a scale set by the training rows: u = (L_hi / L_hat - 1) /
    (K - 1) clipped to [0, 1], with L_hi = max(quantile head, L_hat) and K the 99th percentile of
    L_hi / L_hat over the training rows (a maximum would let one outlier squash every other u). So
    ODMA's need, L_hat * (1 + gamma * u), is L_hi itself at gamma = K - 1 for all but the top 1%.
    Its rank says by how much a request may outgrow L_hat, which the entropy's does not (Azure
    conv, MLU370-X4: plan's cheap bounds found nothing above 47% KV utilization within a 0.5%
    overflow rate with the entropy, 78% with the headroom, before the large block held prompt +
    the output cap).
Both are computed from one pass of the network; `evaluate` reports the calibration of both (the
overflow rate by decile of u). `coverage_gamma` is calibrated for the chosen u by split conformal
prediction with a normalised score (Lei et al. 2018, arXiv:1604.04173) on the held-back prompts:
the smallest gamma under which the share UPPER_QUANTILE of them fits L_hat * (1 + gamma * u).
In s3 mode u is the class distribution's normalised entropy (S3 itself has none; it is there for
the evaluation table).
"""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.core.stops import import_whole
from odmactl.predict.evaluation import EvalSettings, evaluate_predictions
from odmactl.predict.features import build_vocabulary, encode_ids, hash_ngrams, log_prompt_tokens
from odmactl.predict.network import Features, LengthNet, build_net
from odmactl.predict.settings import (
    FAMILIES,
    MAX_GAMMA,
    MODES,
    UNCERTAINTIES,
    UPPER_QUANTILE,
    FittedState,
    PredictorSettings,
    ProgressFn,
)
from odmactl.predict.threads import single_thread
from odmactl.rules.s3 import s3_capacities, s3_classes

torch = import_whole("torch")  # never interrupted half-way (core/stops.py)
nn = torch.nn


class LengthPredictor:
    """A fitted (or loaded) predictor; `predict` is deterministic and batched."""

    def __init__(self, settings: PredictorSettings, state: FittedState, net: LengthNet, encoder=None) -> None:
        self.settings = settings
        self.state = state
        self.net = net.eval()
        self.encoder = encoder

    # -- fitting ------------------------------------------------------------------------------------

    @classmethod
    def fit(cls, frame: pl.DataFrame, settings: PredictorSettings = PredictorSettings(), *, seed: int = 0,
            encoder_dir: Path | None = None, progress: ProgressFn | None = None) -> LengthPredictor:
        """Train on every row of `frame` (a canonical trace), early-stopping on a held-back share of
        its prompts."""
        from odmactl.core.errors import TraceError
        from odmactl.trace.splits import split_trace

        assert settings.family in FAMILIES and settings.mode in MODES
        encoder = _open_encoder(settings, encoder_dir)
        prompt = frame["prompt_tokens"].to_numpy().astype(np.int64)
        output = frame["output_tokens"].to_numpy().astype(np.int64)
        lp = log_prompt_tokens(prompt)
        y = np.log(output.astype(np.float64))
        edges = _class_edges(output, settings.num_classes) if settings.mode == "odma" else []
        state = FittedState(
            models=build_vocabulary(frame["model"]), tenants=build_vocabulary(frame["tenant"]),
            log_prompt_mean=float(lp.mean()), log_prompt_std=float(lp.std()) or 1.0,
            target_mean=float(y.mean()), target_std=float(y.std()) or 1.0, class_edges_tokens=edges,
            encoder_dir=str(encoder.directory.resolve()) if encoder else None,
            encoder_sha256=_fingerprint(encoder) if encoder else None)
        model = cls(settings, state, build_net(settings, state, encoder, seed), encoder)
        feats = model.features(frame, progress)
        target = torch.from_numpy(((y - state.target_mean) / state.target_std).astype(np.float32))
        classes = torch.from_numpy(model._classes(output))
        rows = np.arange(frame.height, dtype=np.int64)
        try:
            inner = split_trace(frame, settings.validation, "prompt", seed)
            train_rows, val_rows = inner.train_rows, inner.test_rows
        except TraceError:  # too few distinct prompts to hold any back: train on all, fixed epochs
            train_rows, val_rows = rows, rows[:0]
        # dropout draws from torch's global RNG: seed it, restore it after; one thread (threads.py)
        with torch.random.fork_rng(devices=[]), single_thread():
            torch.manual_seed(seed)
            epochs = model._train(feats, target, classes, train_rows, val_rows, seed, progress)
        if settings.mode == "odma":
            l_hat, spread, entropy = model._raw(feats, rows)  # one pass: K over every row, the score over the held-back
            model.state.headroom_scale = float(max(1.0, np.quantile(spread, 0.99)))
            calibration = val_rows if val_rows.size else rows
            u = model._uncertainty(spread, entropy)
            model.state.coverage_gamma = model._coverage_gamma(l_hat[calibration], u[calibration], output[calibration])
        model.state.training = {"rows": int(frame.height), "epochs": epochs,
                                "training_data_sha256": training_data_sha256(frame), "seed": seed}
        return model

    def _classes(self, output: np.ndarray) -> np.ndarray:
        s = self.settings
        if s.mode == "s3":
            return s3_classes(output, s3_capacities(s.max_model_len_tokens, s.s3_num_buckets))
        return np.searchsorted(np.asarray(self.state.class_edges_tokens, dtype=np.int64), output, side="left")

    def _loss(self, x: dict, target: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        reg, upper, logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, classes)
        if self.settings.mode == "odma":
            miss = target - upper  # pinball loss: the head settles where UPPER_QUANTILE of targets lie below
            pinball = torch.maximum(UPPER_QUANTILE * miss, (UPPER_QUANTILE - 1.0) * miss).mean()
            loss = loss + nn.functional.mse_loss(reg, target) + pinball
        return loss

    def _coverage_gamma(self, l_hat: np.ndarray, u: np.ndarray, output: np.ndarray) -> float:
        """Split conformal: the finite-sample UPPER_QUANTILE of the score (output / L_hat - 1) / u
        over the calibration rows, so that L_hat * (1 + gamma * u) covers that share of them."""
        excess = output / l_hat - 1.0
        score = np.where(excess <= 0, 0.0, np.divide(excess, u, out=np.full(u.size, np.inf), where=u > 0))
        rank = min(math.ceil((output.size + 1) * UPPER_QUANTILE), output.size)
        return float(min(np.sort(score)[rank - 1], MAX_GAMMA))  # MAX_GAMMA: only the large pool covers

    @property
    def uncertainty(self) -> str:
        """Which u `predict` gives in odma mode (the module docstring)."""
        return self.settings.uncertainty or "headroom"

    def _uncertainty(self, spread: np.ndarray, entropy: np.ndarray, kind: str | None = None) -> np.ndarray:
        """u of kind `kind` (default: the setting's) from one pass's spread and entropy."""
        kind = kind or self.uncertainty
        assert kind in UNCERTAINTIES
        return entropy if kind == "entropy" else self._headroom(spread)

    def _headroom(self, ratio: np.ndarray) -> np.ndarray:
        k = self.state.headroom_scale
        return np.clip((ratio - 1.0) / (k - 1.0), 0.0, 1.0) if k > 1.0 else np.zeros(ratio.size)

    def _train(self, feats: Features, target: torch.Tensor, classes: torch.Tensor, train_rows: np.ndarray,
               val_rows: np.ndarray, seed: int, progress: ProgressFn | None) -> int:
        s = self.settings
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(self.net.parameters(), lr=s.learning_rate, weight_decay=s.weight_decay)
        best, best_state, stale, epoch = math.inf, None, 0, 0
        val_x = feats.batch(val_rows) if val_rows.size else None
        for epoch in range(1, s.max_epochs + 1):
            self.net.train()
            order = train_rows[torch.randperm(train_rows.size, generator=gen).numpy()]
            for start in range(0, order.size, s.batch_size):
                rows = order[start:start + s.batch_size]
                loss = self._loss(feats.batch(rows), target[rows], classes[rows])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if progress:
                progress("training", epoch, s.max_epochs)
            if val_x is None:
                continue
            self.net.eval()
            with torch.inference_mode():
                val = float(self._loss(val_x, target[val_rows], classes[val_rows]))
            if val < best - 1e-4:
                best, best_state, stale = val, copy.deepcopy(self.net.state_dict()), 0
            else:
                stale += 1
                if stale >= s.patience_epochs:
                    break
        if best_state is not None:
            self.net.load_state_dict(best_state)
        self.net.eval()
        return epoch

    # -- prediction ---------------------------------------------------------------------------------

    def features(self, frame: pl.DataFrame, progress: ProgressFn | None = None) -> Features:
        s, st = self.settings, self.state
        lp = (log_prompt_tokens(frame["prompt_tokens"].to_numpy()) - st.log_prompt_mean) / st.log_prompt_std
        return Features(
            text=(hash_ngrams(frame["prompt_text"], num_buckets=s.num_hash_buckets, max_words=s.max_words)
                  if s.family == "embedded" else None),
            embedding=self.encoder.embed(frame["prompt_text"], progress) if self.encoder else None,
            model_ids=encode_ids(frame["model"], st.models), tenant_ids=encode_ids(frame["tenant"], st.tenants),
            log_prompt=lp)

    def predict(self, frame: pl.DataFrame, *, batch_rows: int = 16_384) -> tuple[np.ndarray, np.ndarray]:
        """(L_hat in output tokens, int64 >= 1; u in [0, 1], float64) for every row of `frame`."""
        return self._predict_both(frame, batch_rows)[:2]

    def _predict_both(self, frame: pl.DataFrame, batch_rows: int = 16_384) -> tuple[np.ndarray, np.ndarray, dict]:
        """(L_hat, u, {kind: u} of every kind odma mode has) for every row of `frame`."""
        rows = np.arange(frame.height, dtype=np.int64)
        l_hat, spread, entropy = self._raw(self.features(frame), rows, batch_rows)
        if self.settings.mode == "s3":
            return l_hat, entropy, {}
        both = {kind: self._uncertainty(spread, entropy, kind) for kind in UNCERTAINTIES}
        return l_hat, both[self.uncertainty], both

    def _raw(self, feats: Features, rows: np.ndarray,
             batch_rows: int = 16_384) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(L_hat, spread, entropy) for `rows` of `feats`: spread is L_hi / L_hat >= 1 in odma mode
        (1 in s3 mode), entropy the classification head's normalised entropy in [0, 1]."""
        s, st = self.settings, self.state
        l_hat = np.empty(rows.size, dtype=np.int64)
        spread = np.ones(rows.size, dtype=np.float64)
        entropy = np.empty(rows.size, dtype=np.float64)
        with torch.inference_mode(), single_thread():
            for start in range(0, rows.size, batch_rows):
                part = slice(start, start + batch_rows)
                reg, upper, logits = self.net(feats.batch(rows[part]))
                entropy[part] = normalised_entropy(logits)
                if s.mode == "s3":
                    capacities = np.asarray(s3_capacities(s.max_model_len_tokens, s.s3_num_buckets), dtype=np.int64)
                    l_hat[part] = capacities[logits.argmax(1).numpy()]  # the largest length in the bucket
                else:
                    log_len = np.minimum(reg.double().numpy() * st.target_std + st.target_mean, 30.0)
                    log_hi = np.minimum(upper.double().numpy() * st.target_std + st.target_mean, 30.0)
                    l_hat[part] = np.maximum(1, np.rint(np.exp(log_len))).astype(np.int64)
                    spread[part] = np.maximum(np.exp(log_hi) / l_hat[part], 1.0)
        return l_hat, spread, entropy

    def evaluate(self, frame: pl.DataFrame, settings: EvalSettings) -> dict:
        """The held-out figures with the chosen u, and in odma mode "calibration": the u deciles
        (overflow rate against u) of every kind of u, so the two can be compared."""
        l_hat, u, both = self._predict_both(frame)
        coverage = (self.state.coverage_gamma,) if self.settings.mode == "odma" else ()
        prompt, output = frame["prompt_tokens"].to_numpy(), frame["output_tokens"].to_numpy()
        out = evaluate_predictions(prompt, output, l_hat, u, settings, extra_gammas=coverage)
        if both:
            out["uncertainty"] = self.uncertainty
            out["calibration"] = {kind: evaluate_predictions(prompt, output, l_hat, other, settings)["u_deciles"]
                                  for kind, other in both.items()}
        return out


def normalised_entropy(logits: torch.Tensor) -> np.ndarray:
    """The entropy of softmax(logits) per row over log C (C classes), in [0, 1]; 0 with one class."""
    if logits.shape[1] < 2:
        return np.zeros(logits.shape[0])
    p = torch.softmax(logits.double(), dim=1)
    h = -(p * torch.log(p.clamp_min(1e-300))).sum(1) / math.log(p.shape[1])
    return h.clamp(0.0, 1.0).numpy()


def _class_edges(output: np.ndarray, num_classes: int) -> list[int]:
    """Upper edges (inclusive) of equal-occupancy length classes, all but the open last class."""
    q = np.quantile(output, np.arange(1, num_classes) / num_classes, method="higher")
    return [int(e) for e in np.unique(q)]


def _open_encoder(settings: PredictorSettings, encoder_dir: Path | None):
    if settings.family != "encoder":
        return None
    from odmactl.core.errors import PredictorError
    from odmactl.predict.encoder import TextEncoder

    if encoder_dir is None:
        raise PredictorError("the encoder family needs --encoder DIR (a local Hugging Face encoder directory)")
    return TextEncoder(encoder_dir, max_length_tokens=settings.encoder_max_length_tokens)


def _fingerprint(encoder) -> str:
    from odmactl.predict.encoder import encoder_fingerprint

    return encoder_fingerprint(encoder.directory)


def training_data_sha256(frame: pl.DataFrame) -> str:
    """A digest of the columns a predictor learns from, row by row (order matters)."""
    digest = hashlib.sha256()
    for name in ("prompt_tokens", "output_tokens"):
        digest.update(frame[name].to_numpy().astype("<i8").tobytes())
    for name in ("prompt_text", "model", "tenant"):
        digest.update("\x1f".join(frame[name].cast(pl.Utf8).fill_null("\x00").to_list()).encode())
    return digest.hexdigest()
