"""Decode rows kept across steps (`layers.decode_rows`, the cpu platform's decode attention with dynamic shapes).

The rows must give the gathered rectangle's tokens (the same softmax over the same keys), copy in only the keys a
row lacks, and refill a row whenever its sequence's cache entries may have changed (prefilled again, a step
prepared and not run).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.attention import Attention
from spyre_lab.engine.layers.decode_rows import DecodeRows, host_long_tensor
from spyre_lab.engine.platforms.cpu import CpuPlatform

PROMPTS = ["3 + 4 =", "count from 5 to 12:", "letters from c to h:", "spyre has", "count down from 20 to 14:",
           "the answer is"]


class GatheringCpuPlatform(CpuPlatform):
    """The cpu platform gathering every block table each decode step (the path the rows replace)."""

    decode_rows = False


def _generate(platform, **options) -> tuple[list[list[int]], list, int]:
    llm = LLM("tiny-granite", platform=platform, max_model_len=40, enable_prefix_caching=False, **options)
    seen, execute = [], llm.llm_engine.runner.execute

    def record(model_input):
        seen.append(model_input.meta)
        return execute(model_input)

    llm.llm_engine.runner.execute = record
    budgets = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 3, 14, 6, 11, 4)]
    outs = llm.generate(PROMPTS, budgets, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], seen, sum(s.num_preempted for s in llm.stats.steps)


def test_rows_give_the_gathered_tokens_as_sequences_join_leave_and_are_preempted():
    # few blocks: decode steps preempt, and rows for three sequences would hold more tokens than the paged cache
    # (3 x 40 > 20 blocks x 4): those steps gather
    options = dict(max_num_seqs=3, block_size=4, num_kv_blocks=20)
    rows, seen, preempted = _generate(CpuPlatform(), **options)
    gathered, seen_gathering, _ = _generate(GatheringCpuPlatform(), **options)
    assert rows == gathered and preempted
    decodes = [m for m in seen if m.query_index.shape[1] == 1]
    fallbacks = [m for m in decodes if m.decode_rows is None]
    decodes = [m for m in decodes if m.decode_rows is not None]
    assert decodes and fallbacks and all(m.key_mask is not None for m in fallbacks)
    assert all(m.key_mask is None and m.attn_bias is None for m in decodes)
    assert all(m.decode_rows is None and m.key_mask is not None for m in seen_gathering if m.query_index.shape[1] == 1)
    # most steps copy one token per sequence and head; a gather would copy every block of every table
    copied = sum(m.decode_rows.src_index.numel() for m in decodes)
    assert copied < sum(m.block_tables.numel() * 4 * 2 for m in decodes) / 2


@dataclass
class _Seq:
    request_id: str
    length: int
    block_table: list[int]

    def __len__(self) -> int:
        return self.length


def _plan(store: DecodeRows, seqs: list[_Seq]):
    return store.plan(seqs, lambda seq, p: seq.block_table[p // 4] * 4 + p % 4, 16, torch.float32,
                      torch.device("cpu"))


def test_a_row_is_refilled_after_its_sequence_is_prefilled_again_or_a_step_did_not_run():
    store = DecodeRows(length=16, capacity=64, num_kv_heads=1)
    a, b = _Seq("a", 5, [0, 1]), _Seq("b", 3, [2, 4])
    step = _plan(store, [a, b])
    assert step.src_index.numel() == 4 + 2                      # new rows: every earlier key from the cache
    assert step.new_index.tolist() == [4, 16 + 2]                 # and the step's own key from its projection
    store.commit(step)
    a.length, b.length = 6, 4
    step = _plan(store, [a, b])
    assert step.src_index.numel() == 0                            # nothing from the cache: one new key each,
    assert step.new_index.tolist() == [5, 16 + 3]                 # a's position 5 in row 0, b's position 3 in row 1
    assert step.row_of_batch.tolist() == [0, 1]
    # prepared, not run: the next plan cannot count on this step's keys
    a.length, b.length = 7, 5
    assert _plan(store, [a, b]).src_index.numel() == 6 + 4
    store.commit(step)
    c = _Seq("c", 2, [3])
    step = _plan(store, [c, a])                                   # b left: c takes its row, a keeps its own
    assert step.row_of_batch.tolist() == [1, 0] and step.batch_of_row.tolist() == [1, 0]
    assert step.src_index.numel() == 1 and step.new_index.tolist() == [16 + 1, 6]
    assert torch.equal(step.bias[:, 0, 0] == 0, torch.arange(16).view(1, -1) < torch.tensor([[7], [2]]))
    store.commit(step)
    store.forget(["a"])                                           # a prefilled again: its row no longer counts
    a.length, c.length = 8, 3
    assert _plan(store, [a, c]).src_index.numel() == 7              # a refills every earlier key, c none


def test_refill_indices_name_every_key_and_head_a_row_lacks():
    # two KV heads, rows of 16 positions, blocks of 4: each key a row lacks comes from (slot, head) of the cache and
    # goes to (row, head, position) of the rows, position by position and head by head within it
    store = DecodeRows(length=16, capacity=64, num_kv_heads=2)
    store.commit(_plan(store, [_Seq("a", 2, [7])]))               # row 0 held by a, which then leaves
    seq = _Seq("b", 6, [3, 5])                                    # b joins: its 5 earlier keys, into row 0
    step = _plan(store, [seq])
    slots = [seq.block_table[p // 4] * 4 + p % 4 for p in range(5)]
    assert step.src_index.tolist() == [s * 2 + h for s in slots for h in range(2)]
    assert step.dst_index.tolist() == [h * 16 + p for p in range(5) for h in range(2)]
    assert step.new_index.tolist() == [5, 16 + 5]
    store.commit(step)
    seq.length = 7
    step = _plan(store, [seq])
    assert step.src_index.numel() == step.dst_index.numel() == 0 and step.src_index.dtype == torch.long


def test_host_long_tensor_equals_torch_tensor():
    for values in ([], [0], [3, -1, 2**40, 7]):
        made = host_long_tensor(values)
        assert made.dtype == torch.long and made.tolist() == values
    assert torch.equal(host_long_tensor(list(range(1000))), torch.arange(1000))


def test_rows_beyond_the_paged_cache_capacity_fall_back_to_the_gather():
    store = DecodeRows(length=16, capacity=16, num_kv_heads=1)
    assert _plan(store, [_Seq("a", 3, [0])]) is not None
    assert _plan(store, [_Seq("a", 3, [0]), _Seq("b", 2, [1])]) is None


def test_rows_are_kept_per_layer_not_per_cache_tensor_id():
    # a cache tensor's id() can be taken by another tensor once it is freed; rows keyed by it would then hand one
    # layer another layer's keys. Two layers seen through the same tensor object must still get rows of their own
    store = DecodeRows(length=16, capacity=64, num_kv_heads=1)
    cache = torch.zeros(5, 4, 1, 8)
    first, second = store.tensors(0, cache, 2), store.tensors(1, cache, 2)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, second, strict=True))
    first[0].fill_(1.0)
    assert store.tensors(0, cache, 2)[0].eq(1.0).all() and store.tensors(1, cache, 2)[0].eq(0.0).all()
    with pytest.raises(ValueError, match="kv_layer"):
        store.tensors(0, torch.zeros(5, 4, 1, 16), 2)      # layer 0's rows were made for head_dim 8


def test_each_attention_layer_of_an_engine_keeps_its_own_rows():
    llm = LLM("tiny-granite", max_model_len=40, enable_prefix_caching=False)
    runner = llm.llm_engine.runner
    layers = [m.kv_layer for m in llm.llm_engine.model.modules() if isinstance(m, Attention)]
    assert layers == list(range(len(runner.kv_caches)))
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    kept = runner.decode_rows._tensors
    assert sorted(kept) == layers
    assert len({rows[0].data_ptr() for rows in kept.values()}) == len(layers)
