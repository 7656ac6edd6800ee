"""Cheap request features for the length predictor: hashed word n-grams of the prompt text,
identifier vocabularies (model, tenant) and the log prompt length. Numpy out; no torch here."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import polars as pl

# words (letters, digits, apostrophes) or single punctuation marks; "\x02" is prefixed to every
# text, so every prompt has at least one feature (a start marker that doubles as a bias term)
TOKEN_PATTERN = r"[a-z0-9']+|[^\s\w]"
START = "\x02 "
BIGRAM_MIX = 1_000_003  # odd multiplier combining two word hashes into a bigram hash


@dataclass(frozen=True)
class HashedText:
    """Hashed n-gram bags of N prompts in the layout of torch's EmbeddingBag: the features of prompt
    i are `indices[offsets[i]:offsets[i + 1]]` (`offsets` has N + 1 entries, non-decreasing, every
    bag non-empty), each an integer in [0, num_buckets)."""

    indices: np.ndarray  # int64
    offsets: np.ndarray  # int64, N + 1


def hash_ngrams(texts: pl.Series, *, num_buckets: int, max_words: int, ngram_orders: tuple[int, ...] = (1, 2)) -> HashedText:
    """Lower-cased word unigrams and bigrams of each text (null = empty), the first `max_words`
    words, hashed with CRC-32 (stable across runs, machines and Python versions) into buckets."""
    words = (pl.lit(START) + texts.fill_null("").str.to_lowercase())
    tokens = pl.select(words.str.extract_all(TOKEN_PATTERN).list.head(max_words).alias("t"))["t"]
    lengths = tokens.list.len().to_numpy().astype(np.int64)
    flat = tokens.explode()  # every list has >= 1 element, so one row per word
    uniq = flat.unique(maintain_order=True)
    word_hash = np.fromiter((zlib.crc32(w.encode()) for w in uniq.to_list()), dtype=np.int64, count=uniq.len())
    ids = (pl.DataFrame({"w": flat}).join(pl.DataFrame({"w": uniq, "h": word_hash}), on="w", how="left",
                                          maintain_order="left")["h"].to_numpy())
    owner = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    parts_owner, parts_hash = [], []
    if 1 in ngram_orders:
        parts_owner.append(owner)
        parts_hash.append(ids)
    if 2 in ngram_orders and ids.size > 1:
        same = owner[1:] == owner[:-1]  # a bigram never spans two prompts
        parts_owner.append(owner[1:][same])
        parts_hash.append((ids[:-1][same] * BIGRAM_MIX + ids[1:][same] + 0x9E3779B9) & 0xFFFFFFFF)
    all_owner = np.concatenate(parts_owner)
    order = np.argsort(all_owner, kind="stable")
    indices = np.concatenate(parts_hash)[order] % num_buckets
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(all_owner, minlength=lengths.size), out=offsets[1:])
    return HashedText(indices=indices.astype(np.int64), offsets=offsets)


def build_vocabulary(values: pl.Series) -> list[str]:
    """The sorted distinct non-null identifiers; id 0 is kept for null and unseen values."""
    return sorted(v for v in values.drop_nulls().unique().to_list())


def encode_ids(values: pl.Series, vocabulary: list[str]) -> np.ndarray:
    """Identifier -> 1 + its position in `vocabulary`; null or unseen -> 0."""
    if not vocabulary:
        return np.zeros(values.len(), dtype=np.int64)
    mapping = pl.DataFrame({"v": vocabulary, "id": np.arange(1, len(vocabulary) + 1, dtype=np.int64)})
    joined = pl.DataFrame({"v": values.cast(pl.Utf8)}).join(mapping, on="v", how="left", maintain_order="left")
    return joined["id"].fill_null(0).to_numpy().astype(np.int64)


def log_prompt_tokens(prompt_tokens: np.ndarray) -> np.ndarray:
    return np.log1p(np.asarray(prompt_tokens, dtype=np.float64))
