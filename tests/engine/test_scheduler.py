"""Scheduler: prefill first, limits per step, preemption by recompute when blocks run out."""

from __future__ import annotations

from spyre_lab.engine.block_manager import BlockManager
from spyre_lab.engine.sampling_params import SamplingParams
from spyre_lab.engine.scheduler import Scheduler
from spyre_lab.engine.sequence import Sequence, SequenceStatus


def make(num_blocks=8, block_size=4, max_num_seqs=4, max_tokens=64, **kw) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, max_tokens, **kw)


def run_step(scheduler: Scheduler, token: int = 7):
    """Schedule, pretend the model ran, append one token to each scheduled sequence."""
    out = scheduler.schedule()
    for seq in out.seqs:
        seq.num_computed_tokens = len(seq)
        scheduler.block_manager.commit(seq)
        seq.append_token(token)
    return out


def seqs(*lengths):
    return [Sequence(str(i), list(range(100 * i, 100 * i + n)), SamplingParams()) for i, n in enumerate(lengths)]


def test_prefill_takes_priority_and_respects_limits():
    scheduler = make(num_blocks=32, max_num_seqs=2, max_tokens=10)
    for s in seqs(4, 5, 3):
        scheduler.add(s)
    first = run_step(scheduler)
    assert first.is_prefill and [s.request_id for s in first.seqs] == ["0", "1"]  # 4+5 <= 10 tokens, 2 seqs max
    second = run_step(scheduler)
    assert not second.is_prefill and len(second.seqs) == 2  # max_num_seqs reached: seq 2 waits
    assert [s.request_id for s in scheduler.waiting] == ["2"]


def test_token_budget_splits_prefills_across_steps():
    scheduler = make(num_blocks=32, max_num_seqs=8, max_tokens=8)
    for s in seqs(5, 5):
        scheduler.add(s)
    assert [s.request_id for s in run_step(scheduler).seqs] == ["0"]
    assert [s.request_id for s in run_step(scheduler).seqs] == ["1"]


def test_one_prefill_per_step_for_static_shapes():
    scheduler = make(num_blocks=32, one_prefill_per_step=True)
    for s in seqs(2, 2):
        scheduler.add(s)
    assert len(run_step(scheduler).seqs) == 1


def test_out_of_blocks_preempts_the_newest_and_requeues_it_first():
    scheduler = make(num_blocks=4, block_size=2, max_num_seqs=4)
    a, b = seqs(4, 4)  # 2 blocks each: the cache is full after prefill
    scheduler.add(a)
    scheduler.add(b)
    assert run_step(scheduler).is_prefill
    decode = run_step(scheduler)  # each needs a 3rd block for position 4: b is preempted for a
    assert [s.request_id for s in decode.seqs] == ["0"] and decode.preempted == [b]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_preemptions == 1
    assert scheduler.waiting[0] is b
    assert len(b.output_token_ids) == 1  # keeps what it generated; it is recomputed on re-prefill
    scheduler.finish(a, "length")
    again = run_step(scheduler)
    assert again.is_prefill and again.seqs == [b] and b.num_computed_tokens == len(b) - 1


def test_lone_sequence_that_cannot_grow_preempts_itself():
    scheduler = make(num_blocks=1, block_size=2, max_num_seqs=1)
    (s,) = seqs(2)
    scheduler.add(s)
    run_step(scheduler)
    out = scheduler.schedule()
    assert out.seqs == [] and out.preempted == [s]


def test_finish_frees_blocks_from_either_queue():
    scheduler = make()
    a, b = seqs(3, 3)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)
    scheduler.finish(a, "abort")
    assert a.status is SequenceStatus.FINISHED and a.finish_reason == "abort" and a.block_table == []
    scheduler.finish(b, "stop")
    assert not scheduler.has_unfinished()
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
