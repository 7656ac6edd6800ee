"""The overflow ceilings below examples/paper_table.md's alpaca_eval table, on hand cases."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("paper_table", ROOT / "examples" / "paper_table.py")
paper_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_table)


def test_best_reservation_spends_the_overflow_budget_where_it_saves_most():
    """Two groups of four, one overflow allowed (1/8 of 8): letting group A's 10 outgrow reserves
    1 for each of A (4) and 5 for each of B (20), 24 tokens, against 60 with none outgrowing."""
    prompt = np.ones(8, dtype=np.int64)
    output = np.array([10, 1, 1, 1, 5, 5, 5, 5], dtype=np.int64)
    group = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    assert paper_table._best_reservation(prompt, output, group, share=1 / 8) == pytest.approx((8 + 33) / (8 + 24))
    assert paper_table._best_reservation(prompt, output, group, share=0.0) == pytest.approx((8 + 33) / (8 + 60))
    # one group: the budget lets its longest outgrow, the rest reserve the next longest (5)
    assert paper_table._best_reservation(prompt, output, np.zeros(8), share=1 / 8) == pytest.approx(41 / (8 + 40))


def test_known_effects_counts_unseen_generators_and_ranks_additive_lengths_exactly():
    """Outputs that are a prompt's length times a generator's factor: the score (the prompt's mean
    over the training generators, plus the replayed generator's offset) orders them exactly, so
    with as many groups as distinct lengths nothing is reserved in vain."""
    prompts = [f"instruction {i}" for i in range(16)]
    base = {p: 10 * (i + 1) for i, p in enumerate(prompts)}
    factor = {"seen-a": 1, "seen-b": 2, "new-c": 4}

    def frame(models):
        rows = [(p, m, base[p] * factor[m]) for m in models for p in prompts]
        return pl.DataFrame({"prompt_text": [r[0] for r in rows], "model": [r[1] for r in rows],
                             "output_tokens": [r[2] for r in rows], "prompt_tokens": [1] * len(rows)})

    train, replayed = frame(["seen-a", "seen-b"]), frame(["seen-a", "new-c"])
    known = paper_table._known_effects(train, replayed, cap=10_000)
    assert (known["generators"], known["unseen_generators"], known["training_generators"]) == (2, 1, 2)
    assert known["share_unseen"] == 0.5 and known["prompts_seen"] == 1.0
    # 32 requests, 0.5% of them: no overflow allowed; 128 groups give every length its own, 16
    # groups of two requests reserve the longer of two lengths in most of them
    assert known["best_split_utilization"][128] == pytest.approx(1.0)
    assert known["best_split_utilization"][16] < 1.0
