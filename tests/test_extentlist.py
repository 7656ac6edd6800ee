"""ExtentList (the coalesced free extents of allocator/extents.py) against a plain reference: a
sorted list of (start, nbytes) searched and merged the obvious way."""

from __future__ import annotations

import random

from odmactl.allocator.extentlist import ExtentList


def _reference_take(pieces: list[list[int]], nbytes: int) -> int:
    fits = [(n, s) for s, n in pieces if n >= nbytes]
    if not fits:
        return -1
    n, s = min(fits)  # smallest, then lowest address
    i = next(k for k, p in enumerate(pieces) if p[0] == s)
    if n == nbytes:
        del pieces[i]
    else:
        pieces[i] = [s + nbytes, n - nbytes]
    return s


def _reference_add(pieces: list[list[int]], start: int, nbytes: int) -> None:
    pieces.append([start, nbytes])
    pieces.sort()
    merged: list[list[int]] = []
    for s, n in pieces:
        if merged and merged[-1][0] + merged[-1][1] == s:
            merged[-1][1] += n
        else:
            merged.append([s, n])
    pieces[:] = merged


def test_take_and_add_match_the_reference_through_growth_and_merges():
    rng = random.Random(7)
    unit, region = 64, 4096
    extents, reference = ExtentList(capacity_extents=1), [[0, region * unit]]
    extents.add(0, region * unit)
    taken: list[tuple[int, int]] = []
    for step in range(6000):
        if taken and (rng.random() < 0.45 or len(taken) > 400):
            start, nbytes = taken.pop(rng.randrange(len(taken)))
            extents.add(start, nbytes)
            _reference_add(reference, start, nbytes)
        else:
            nbytes = unit * rng.choice((1, 2, 3, 8, 16, 40))
            got = extents.take(nbytes)
            assert got == _reference_take(reference, nbytes), step
            if got >= 0:
                taken.append((got, nbytes))
        assert extents.tolist() == [tuple(p) for p in reference], step
        assert len(extents) == len(reference)
    assert len(extents) <= len(taken) + 1  # extents are separated by taken blocks


def test_a_full_list_refuses_and_a_freed_middle_joins_both_neighbours():
    extents = ExtentList()
    assert extents.take(1) == -1 and len(extents) == 0
    extents.add(100, 10)
    extents.add(120, 10)
    assert extents.take(11) == -1
    extents.add(110, 10)  # touches both: one extent
    assert extents.tolist() == [(100, 30)]
    assert extents.take(30) == 100 and extents.tolist() == []
