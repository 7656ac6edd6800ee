"""PageRuns (unified's page ranges per request, allocator/pageruns.py) against a plain reference: a
dict of lists of [start, pages] ranges, changed the obvious way."""

from __future__ import annotations

import random

from odmactl.allocator.extentlist import ExtentList
from odmactl.allocator.pageruns import PageRuns


def test_chains_match_the_reference_through_appends_merges_and_releases():
    rng = random.Random(3)
    runs, reference = PageRuns(capacity_nodes=1), {}
    free = ExtentList()
    cursor = 0  # ranges are handed out upwards from here, so none overlap
    most_nodes = 0
    for step in range(4000):
        kind = rng.random()
        if reference and (kind < 0.25 or len(reference) > 40):  # a chain ends: its ranges to the free list
            h = rng.choice(sorted(reference))
            pages = sum(n for _, n in reference.pop(h))
            before = sum(n for _, n in free.tolist())
            assert runs.give_all(h, free) == pages, step
            assert sum(n for _, n in free.tolist()) == before + pages, step
        elif reference and kind < 0.7:  # a range appended (perhaps right after the chain's last, then merged)
            h = rng.choice(sorted(reference))
            last = runs.last(h)
            start = cursor + rng.choice((0, 0, 1, 5))
            pages = rng.randint(1, 9)
            cursor = start + pages
            runs.append(h, start, pages)
            reference[h].append([start, pages])
            if last >= 0 and rng.random() < 0.5:
                joined = runs.join_next(h, last)
                assert joined == (start == reference[h][-2][0] + reference[h][-2][1]), step
                if joined:
                    reference[h][-2][1] += reference[h].pop()[1]
        elif reference and kind < 0.8:  # the last range widens in place, when nothing follows it yet
            h = rng.choice(sorted(reference))
            if reference[h] and sum(reference[h][-1]) == cursor:
                runs.widen(runs.last(h), 2)
                reference[h][-1][1] += 2
                cursor += 2
        else:
            h = runs.new()
            assert h not in reference, step  # a live chain's handle is never handed out again
            reference[h] = []
        for h, ranges in reference.items():
            assert runs.tolist(h) == [v for r in ranges for v in r], step
            assert runs.runs(h) == len(ranges), step
            if ranges:
                assert runs.first_page(h) == ranges[0][0], step
        in_use = sum(len(r) + 1 for r in reference.values())
        assert runs.nodes_in_use() == in_use, step
        most_nodes = max(most_nodes, in_use)
    assert len(runs) // 3 == most_nodes  # nodes are reused: the buffer holds the most ever in use at once


def test_an_empty_chain_is_discarded_and_its_handle_reused():
    runs = PageRuns()
    h = runs.new()
    assert runs.runs(h) == 0 and runs.last(h) == -1 and runs.tolist(h) == []
    runs.discard(h)
    assert runs.nodes_in_use() == 0 and runs.new() == h
