"""SortedInts (the free-extent sizes of allocator/extents.py) against a sorted list and bisect."""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest

from odmactl.sortedints import SortedInts


def test_sortedints_answers_what_bisect_on_a_sorted_list_answers_through_growth():
    rng = random.Random(11)
    values, reference = SortedInts(capacity=1), []
    for _ in range(20_000):
        x = rng.randrange(0, 1 << 40) if rng.random() < 0.7 else rng.choice(reference or [0])
        if x in reference and rng.random() < 0.5:
            values.remove(x)
            reference.remove(x)
        elif x not in reference:
            values.add(x)
            reference.insert(bisect_left(reference, x), x)
        probe = rng.randrange(0, 1 << 40)
        i = bisect_left(reference, probe)
        assert values.ceiling(probe) == (reference[i] if i < len(reference) else -1)
        assert len(values) == values.size == len(reference)
    assert values.tolist() == reference
    for x in list(reference):
        assert values.ceiling(x) == x
        values.remove(x)
    assert values.tolist() == [] and values.ceiling(0) == -1


def test_sortedints_refuses_negative_values_and_absent_removals():
    values = SortedInts()
    with pytest.raises(ValueError, match="non-negative"):
        values.add(-1)
    values.add(7)
    with pytest.raises(KeyError):
        values.remove(6)
    with pytest.raises(KeyError):
        values.remove(8)
    values.remove(7)
    with pytest.raises(KeyError):
        values.remove(7)
