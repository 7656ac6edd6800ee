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


def _reference_take_at(pieces: list[list[int]], start: int, most: int, least: int) -> int:
    i = next((k for k, p in enumerate(pieces) if p[0] == start), None)
    if i is None or pieces[i][1] < least:
        return 0
    n = most if pieces[i][1] >= most else least
    pieces[i] = [start + n, pieces[i][1] - n]
    if pieces[i][1] == 0:
        del pieces[i]
    return n


def _reference_take_largest_first(pieces: list[list[int]], nbytes: int) -> list[tuple[int, int]]:
    """The largest extent (the lowest on a tie) gives from its start, again and again."""
    if sum(n for _, n in pieces) < nbytes:
        return []
    out = []
    while nbytes:
        size = max(n for _, n in pieces)
        i = next(k for k, p in enumerate(pieces) if p[1] == size)
        start, n = pieces[i][0], min(size, nbytes)
        pieces[i] = [start + n, size - n]
        if pieces[i][1] == 0:
            del pieces[i]
        out.append((start, n))
        nbytes -= n
    return out


def test_growth_in_place_and_largest_first_takes_match_the_reference():
    """unified's other takes: at a given start (the step, else what is needed), and from the
    largest extents, largest first (a scattered take)."""
    rng = random.Random(11)
    extents, reference = ExtentList(capacity_extents=1), [[0, 2000]]
    extents.add(0, 2000)
    taken: list[tuple[int, int]] = []
    for step in range(6000):
        kind = rng.random()
        if taken and (kind < 0.4 or len(taken) > 300):
            start, nbytes = taken.pop(rng.randrange(len(taken)))
            extents.add(start, nbytes)
            _reference_add(reference, start, nbytes)
        elif kind < 0.7 and taken:
            start, nbytes = rng.choice(taken)
            least = rng.randint(1, 8)
            most = least + rng.choice((0, 1, 5, 30))
            got = extents.take_at(start + nbytes, most, least)
            assert got == _reference_take_at(reference, start + nbytes, most, least), step
            if got:
                taken.append((start + nbytes, got))
        elif reference:
            nbytes = rng.randint(1, min(200, sum(n for _, n in reference)))  # the caller's free count allows it
            k = extents.take_largest_first(nbytes)
            got = [(extents.piece_start(i), extents.piece_size(i)) for i in range(max(k, 0))]
            assert got == _reference_take_largest_first(reference, nbytes), step
            taken += got
        assert extents.tolist() == [tuple(p) for p in reference], step
