"""Mixed steps: prompts run in the same forward pass as the running decode rows, with the same tokens as before."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.block_manager import BlockManager
from spyre_lab.engine.scheduler import Scheduler
from spyre_lab.engine.sequence import Sequence

from .test_hf_parity import hf_model


def mixed_load(vocab: int, count: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """Seeded (prompt, max_tokens) pairs of very different lengths, as on a mixed load."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 60, (count,), generator=gen).tolist()
    budgets = torch.randint(2, 20, (count,), generator=gen).tolist()
    return [(torch.randint(3, vocab, (n,), generator=gen).tolist(), m) for n, m in zip(lengths, budgets)]


def run(requests, **options):
    options = {"max_model_len": 96, "max_num_seqs": 6, "enable_prefix_caching": False, **options}
    llm = LLM("tiny-granite", **options)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in requests]
    outs = llm.generate([p for p, _ in requests], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm


def test_mixed_steps_give_the_same_greedy_tokens_in_fewer_steps():
    requests = mixed_load(46, 20)
    mixed, on = run(requests, mixed_steps=True)
    apart, off = run(requests, mixed_steps=False)
    assert mixed == apart
    assert [len(t) for t in mixed] == [m for _, m in requests]
    summary_on, summary_off = on.stats.summary(), off.stats.summary()
    assert summary_on["mixed_steps"] > 0 and summary_off["mixed_steps"] == 0
    assert summary_on["steps"] < summary_off["steps"]
    kinds = {r["kind"] for r in on.stats.to_rows()}
    assert kinds <= {"prefill", "decode", "mixed"} and "mixed" in kinds


def test_the_cpu_platform_mixes_by_default_and_static_shapes_do_not():
    assert LLM("tiny-granite", max_model_len=64).llm_engine.mixed_steps
    static = LLM("tiny-granite", max_model_len=64, static_shapes=True, max_num_seqs=2)
    assert not static.llm_engine.mixed_steps
    with pytest.raises(ValueError, match="mixed_steps=False"):
        LLM("tiny-granite", max_model_len=64, static_shapes=True, max_num_seqs=2, mixed_steps=True)
    with pytest.raises(TypeError, match="mixed_steps"):
        LLM("tiny-granite", max_model_len=64, mixed_steps="yes")


def test_a_mixed_step_records_its_decode_rows_and_its_arrivals():
    llm = LLM("tiny-granite", max_model_len=64, max_num_seqs=4)
    engine, greedy = llm.llm_engine, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("a", [1, 5, 6, 7], greedy)
    engine.step()                                                    # a's prefill
    engine.add_request("b", [1, 9, 10, 11, 12, 13], greedy)
    engine.add_request("c", [1, 14], greedy)
    engine.step()
    row = engine.stats.steps[-1]
    detail = engine.stats.details[row.step]
    assert row.kind == "mixed" and row.num_seqs == 3 and row.num_tokens == 1 + 6 + 2
    assert detail.batch == [("a", 1), ("b", 6), ("c", 2)] and detail.arrived == ["b", "c"]
    assert engine.stats.summary()["mixed_steps"] == 1


def test_prompts_joining_decode_rows_match_transformers(hf_granite_dir):
    """Requests arrive while others decode, so their prompts share steps with decode rows (and a cached prefix)."""
    prompts = [[1, 5, 9, 13, 17], [1, *range(20, 60)], [1, 7], [1, 5, 9, 13, 17, 30, 31, 32, 33], [1, *range(60, 83)]]
    hf = hf_model(hf_granite_dir)
    references = []
    with torch.no_grad():
        for prompt in prompts:
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
            references.append(out[0, len(prompt):].tolist())
    llm = LLM(hf_granite_dir, max_model_len=128, block_size=4, max_num_seqs=4)
    engine, greedy = llm.llm_engine, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    results = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, greedy)
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
    while engine.has_unfinished_requests():
        results.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    assert llm.stats.summary()["mixed_steps"] >= 3
    assert [results[str(i)] for i in range(len(prompts))] == references


def test_out_of_blocks_preempts_inside_mixed_steps_and_loses_no_request():
    requests = mixed_load(46, 16, seed=1)
    options = dict(block_size=4, num_kv_blocks=30)
    mixed, llm = run(requests, mixed_steps=True, **options)
    apart, _ = run(requests, mixed_steps=False, **options)
    assert sum(r["num_preemptions"] for r in llm.stats.to_rows("requests")) > 0
    assert llm.stats.summary()["mixed_steps"] > 0
    assert mixed == apart and [len(t) for t in mixed] == [m for _, m in requests]
    assert llm.llm_engine.block_manager.num_free_blocks == 30


def seqs(*lengths):
    return [Sequence(str(i), list(range(100 * i, 100 * i + n)), SamplingParams()) for i, n in enumerate(lengths)]


def decode_once(scheduler):
    out = scheduler.schedule()
    for seq in out.seqs:
        seq.num_computed_tokens = len(seq)
        scheduler.block_manager.commit(seq)
        seq.append_token(7)
    return out


def test_the_scheduler_puts_decode_rows_first_and_counts_them_in_the_token_budget():
    scheduler = Scheduler(BlockManager(32, 4), max_num_seqs=4, max_num_batched_tokens=10, mixed_steps=True)
    a, b, c = seqs(6, 8, 3)
    scheduler.add(a)
    first = decode_once(scheduler)
    assert first.kind == "prefill" and first.seqs == [a]
    scheduler.add(b)
    scheduler.add(c)
    second = decode_once(scheduler)        # a's decode token + b's 8 tokens fit 10; c's 3 more would not
    assert second.kind == "mixed" and second.seqs == [a, b] and second.num_decode == 1
    third = decode_once(scheduler)
    assert third.kind == "mixed" and third.seqs == [a, b, c] and third.num_decode == 2
    assert decode_once(scheduler).kind == "decode"


def test_a_mixed_step_that_preempts_admits_nobody():
    scheduler = Scheduler(BlockManager(4, 2), max_num_seqs=4, max_num_batched_tokens=64, mixed_steps=True)
    a, b, c = seqs(4, 4, 1)
    scheduler.add(a)
    scheduler.add(b)
    decode_once(scheduler)                 # both prefilled: the cache is full
    scheduler.add(c)
    out = decode_once(scheduler)           # each needs a third block: b is preempted, c waits behind it
    assert out.kind == "decode" and out.seqs == [a] and out.preempted == [b]
    assert list(scheduler.waiting) == [b, c]
