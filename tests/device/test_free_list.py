"""The free list's undo of its last first fit: every address and every listing is what the tree alone gives."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_lab.device.free_list import FreeList

CAPACITY = 64 * 128


def reference_first_fit(free: list[list[int]], size: int) -> int | None:
    """First fit over a plain sorted list of [start, size] blocks (no tree, no undo)."""
    for block in free:
        if block[1] >= size:
            start = block[0]
            block[0] += size
            block[1] -= size
            if not block[1]:
                free.remove(block)
            return start
    return None


def reference_give_back(free: list[list[int]], start: int, size: int) -> None:
    blocks = sorted([*map(tuple, free), (start, size)])
    merged: list[list[int]] = []
    for s, n in blocks:
        if merged and merged[-1][0] + merged[-1][1] == s:
            merged[-1][1] += n
        else:
            merged.append([s, n])
    free[:] = merged


steps = st.lists(st.tuples(st.sampled_from(["take", "undo", "free", "look"]), st.integers(1, 12),
                           st.integers(0, 10**6)), max_size=120)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_undo_hands_out_what_first_fit_would(sequence):
    """Take, give back the block just taken, take again (of the same or another size), free older blocks, and
    read the list only now and then: addresses, free bytes and blocks match a plain first fit at every step."""
    tree, plain = FreeList(0, CAPACITY), [[0, CAPACITY]]
    live: list[tuple[int, int]] = []
    for op, units, pick in sequence:
        size = units * 128
        if op == "take":
            got, expected = tree.take_first_fit(size), reference_first_fit(plain, size)
            assert got == expected
            if got is not None:
                live.append((got, size))
        elif op == "undo" and live:                       # the block taken last, straight back
            start, n = live.pop()
            tree.give_back(start, n)
            reference_give_back(plain, start, n)
        elif op == "free" and live:
            start, n = live.pop(pick % len(live))
            tree.give_back(start, n)
            reference_give_back(plain, start, n)
        elif op == "look":
            assert tree.blocks() == [tuple(b) for b in plain]
            assert tree.num_blocks == len(plain)
            assert tree.largest_block == max((n for _, n in plain), default=0)
        assert tree.free_bytes == sum(n for _, n in plain)
    assert tree.blocks() == [tuple(b) for b in plain]


def test_a_dropped_output_taken_again_lands_where_it_was():
    """The eager loop's pattern: the same block back and forth, the listing never disturbed."""
    tree = FreeList(0, CAPACITY)
    keep = tree.take_first_fit(256)
    for _ in range(5):
        start = tree.take_first_fit(384)
        assert start == 256
        tree.give_back(start, 384)
        assert tree.blocks() == [(256, CAPACITY - 256)]
    tree.give_back(keep, 256)
    assert tree.blocks() == [(0, CAPACITY)] and tree.num_blocks == 1


def test_giving_back_the_same_block_twice_is_still_refused():
    tree = FreeList(0, CAPACITY)
    start = tree.take_first_fit(128)
    tree.give_back(start, 128)
    with pytest.raises(ValueError, match="overlaps free space"):
        tree.give_back(start, 128)
