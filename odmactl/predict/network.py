"""The predictor's torch network (`LengthNet`), its inputs (`Features`) and how a fresh one is built
from the settings and the fitted state."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odmactl.core.stops import import_whole
from odmactl.predict.features import HashedText
from odmactl.predict.settings import FittedState, PredictorSettings
from odmactl.rules.s3 import s3_capacities

torch = import_whole("torch")  # never interrupted half-way (core/stops.py)
nn = torch.nn


@dataclass
class Features:
    """The network's inputs for N requests; row i of every array is request i."""

    text: HashedText | None
    embedding: np.ndarray | None  # (N, dim) float32, encoder family
    model_ids: np.ndarray
    tenant_ids: np.ndarray
    log_prompt: np.ndarray  # standardised log1p(prompt_tokens)

    def batch(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        out = {"model": torch.from_numpy(self.model_ids[rows]), "tenant": torch.from_numpy(self.tenant_ids[rows])}
        dense = [self.log_prompt[rows, None].astype(np.float32)]
        if self.embedding is not None:
            dense.append(self.embedding[rows])
        out["dense"] = torch.from_numpy(np.concatenate(dense, axis=1))
        if self.text is not None:
            starts, ends = self.text.offsets[rows], self.text.offsets[rows + 1]
            lengths = ends - starts
            offsets = np.zeros(rows.size, dtype=np.int64)
            np.cumsum(lengths[:-1], out=offsets[1:])
            within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)
            out["text_indices"] = torch.from_numpy(self.text.indices[np.repeat(starts, lengths) + within])
            out["text_offsets"] = torch.from_numpy(offsets)
        return out


class LengthNet(nn.Module):
    """Inputs -> (standardised log-length estimate, its UPPER_QUANTILE, class logits). Two ReLU
    layers over the concatenated text bag, identifier embeddings (id 0 = null or unseen) and dense
    features."""

    def __init__(self, *, num_hash_buckets: int, text_dim: int, num_models: int, num_tenants: int, id_dim: int,
                 dense_dim: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.text = nn.EmbeddingBag(num_hash_buckets, text_dim, mode="mean") if num_hash_buckets else None
        self.text_dropout = nn.Dropout(0.5)  # n-grams of a few hundred prompts are easy to memorise
        self.models = nn.Embedding(num_models + 1, id_dim)
        self.tenants = nn.Embedding(num_tenants + 1, id_dim)
        width = (text_dim if self.text is not None else 0) + 2 * id_dim + dense_dim
        self.body = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.reg = nn.Linear(hidden, 1)
        self.upper = nn.Linear(hidden, 1)
        self.cls = nn.Linear(hidden, num_classes)

    def forward(self, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        parts = [self.models(x["model"]), self.tenants(x["tenant"]), x["dense"]]
        if self.text is not None:
            parts.insert(0, self.text_dropout(self.text(x["text_indices"], x["text_offsets"])))
        h = self.body(torch.cat(parts, dim=1))
        return self.reg(h).squeeze(1), self.upper(h).squeeze(1), self.cls(h)


def build_net(settings: PredictorSettings, state: FittedState, encoder, seed: int = 0) -> LengthNet:
    """A fresh network; its initial weights come from `seed` without touching torch's global RNG."""
    num_classes = (len(s3_capacities(settings.max_model_len_tokens, settings.s3_num_buckets)) if settings.mode == "s3"
                   else len(state.class_edges_tokens) + 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LengthNet(num_hash_buckets=settings.num_hash_buckets if settings.family == "embedded" else 0,
                         text_dim=settings.text_dim, num_models=len(state.models), num_tenants=len(state.tenants),
                         id_dim=settings.id_dim, dense_dim=1 + (encoder.dim if encoder else 0),
                         hidden=settings.hidden, num_classes=num_classes)
