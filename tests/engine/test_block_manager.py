"""Block manager: allocation, prefix caching over a hash chain, LRU eviction, free-list integrity."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_lab.engine.block_manager import BlockManager
from spyre_lab.engine.sampling_params import SamplingParams
from spyre_lab.engine.sequence import Sequence


def seq(tokens, request_id="r") -> Sequence:
    return Sequence(request_id, list(tokens), SamplingParams())


def prefill(manager: BlockManager, s: Sequence) -> None:
    """What the engine does around a prefill: allocate, compute everything, publish full blocks."""
    manager.allocate(s)
    s.num_computed_tokens = len(s)
    manager.commit(s)


def test_allocate_gives_enough_blocks_and_free_returns_them():
    manager = BlockManager(num_blocks=8, block_size=4)
    s = seq(range(10))
    manager.allocate(s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert manager.num_free_blocks == 5
    manager.free(s)
    assert manager.num_free_blocks == 8 and s.block_table == []


def test_shared_prefix_reuses_full_blocks_but_always_computes_the_last_token():
    manager = BlockManager(num_blocks=16, block_size=4)
    first = seq(range(13), "a")
    prefill(manager, first)
    second = seq([*range(12), 99, 100], "b")  # shares 3 full blocks
    manager.allocate(second)
    assert second.block_table[:3] == first.block_table[:3]
    assert second.num_cached_tokens == 12
    same = seq(range(12), "c")  # identical 12-token prompt: only 2 blocks reusable (last token recomputed)
    manager.allocate(same)
    assert same.num_cached_tokens == 8
    assert manager.blocks[first.block_table[0]].ref_count == 3


def test_chain_hash_depends_on_everything_before_the_block():
    manager = BlockManager(num_blocks=16, block_size=4)
    prefill(manager, seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a"))
    other = seq([0, 2, 3, 4, 5, 6, 7, 8, 9], "b")  # same second block, different first block
    manager.allocate(other)
    assert other.num_cached_tokens == 0


def test_freed_prefix_survives_until_evicted_least_recently_used_first():
    manager = BlockManager(num_blocks=6, block_size=2)
    old, recent = seq([1, 2, 3, 4, 5], "old"), seq([7, 8, 9, 10, 11], "recent")
    prefill(manager, old)
    prefill(manager, recent)
    manager.free(old)
    manager.free(recent)
    assert manager.num_free_blocks == 6
    filler = seq([20, 21, 22, 23], "filler")  # needs 2 blocks: taken from the front (oldest freed)
    manager.allocate(filler)
    manager.free(filler)
    again_recent = seq([7, 8, 9, 10, 11], "recent2")
    manager.allocate(again_recent)
    assert again_recent.num_cached_tokens == 4  # the recently freed prefix was kept
    again_old = seq([1, 2, 3, 4, 5], "old2")
    manager.allocate(again_old)
    assert again_old.num_cached_tokens < 4  # the older one lost at least one block to eviction


def test_decode_appends_a_block_only_at_block_boundaries():
    manager = BlockManager(num_blocks=4, block_size=4)
    s = seq(range(4))
    prefill(manager, s)
    assert len(s.block_table) == 1
    s.output_token_ids.append(4)  # 5 tokens: the decode step writes position 4 -> needs block 2
    assert manager.can_append(s)
    manager.append_slot(s)
    assert len(s.block_table) == 2
    s.output_token_ids.append(5)
    manager.append_slot(s)
    assert len(s.block_table) == 2


def test_can_allocate_counts_reusable_blocks():
    manager = BlockManager(num_blocks=3, block_size=2)
    holder = seq([1, 2, 3, 4, 5], "holder")
    prefill(manager, holder)  # uses all 3 blocks
    assert manager.num_free_blocks == 0
    assert manager.can_allocate(seq([1, 2, 3, 4], "x")) is False  # needs 2 blocks, 1 reusable, 0 free
    assert manager.can_allocate(seq([1, 2, 3], "y")) is False
    manager.free(holder)
    assert manager.can_allocate(seq([1, 2, 3, 4, 9, 9], "z"))


def test_allocating_twice_is_an_error():
    manager = BlockManager(num_blocks=4, block_size=2)
    s = seq([1, 2, 3])
    manager.allocate(s)
    with pytest.raises(RuntimeError, match="already holds blocks"):
        manager.allocate(s)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 4), st.booleans())
def test_random_workload_returns_every_block(seed, block_size, caching):
    rng = random.Random(seed)
    manager = BlockManager(num_blocks=24, block_size=block_size, enable_prefix_caching=caching)
    live = []
    for i in range(60):
        if live and rng.random() < 0.4:
            manager.free(live.pop(rng.randrange(len(live))))
            continue
        s = seq([rng.randrange(3) for _ in range(rng.randrange(1, 12))], str(i))
        if manager.can_allocate(s):
            prefill(manager, s)
            live.append(s)
        in_use = [b for s in live for b in s.block_table]
        assert manager.num_used_blocks == len(set(in_use))
        assert all(manager.blocks[b].ref_count == in_use.count(b) for b in set(in_use))
    for s in live:
        manager.free(s)
    assert manager.num_free_blocks == manager.num_blocks
    assert all(block.ref_count == 0 for block in manager.blocks)
