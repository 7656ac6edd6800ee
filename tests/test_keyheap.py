"""KeyHeap (the replay's pending events) against heapq on the same keys."""

from __future__ import annotations

import heapq
import random

import pytest

from odmactl.sim.keyheap import KeyHeap


def test_keyheap_pops_what_heapq_pops_through_growth_and_draining():
    rng = random.Random(7)
    heap, reference = KeyHeap(capacity=2), []
    for step in range(20_000):
        if reference and rng.random() < 0.45:
            assert heap.top() == reference[0]
            assert heap.pop() == heapq.heappop(reference)
        else:
            # keys as the replay makes them: iteration * 2**32 + admission number, up to 2**62
            key = rng.randrange(0, 1 << 30) * (1 << 32) + step
            heap.push(key)
            heapq.heappush(reference, key)
        assert len(heap) == heap.size == len(reference)
    drained = [heap.pop() for _ in range(len(heap))]
    assert drained == sorted(reference)
    assert len(heap) == 0


def test_keyheap_empty_top_and_pop_raise_index_error():
    heap = KeyHeap()
    with pytest.raises(IndexError, match="empty"):
        heap.top()
    with pytest.raises(IndexError, match="empty"):
        heap.pop()
    heap.push(-5)
    assert heap.pop() == -5
    with pytest.raises(IndexError):
        heap.pop()
