"""200 random requests under a KV cache small enough to force preemption.

Every request must end (finished or aborted, never dropped); greedy outputs must equal the same
request run alone; seeded sampling must not depend on batching; all KV blocks must come back.
"""

from __future__ import annotations

import random

import pytest

from spyre_lab.engine import LLM, SamplingParams

NUM_REQUESTS = 200


def random_params(rng: random.Random, index: int) -> SamplingParams:
    max_tokens = rng.randint(1, 16)
    kind = rng.random()
    if kind < 0.5:
        return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=rng.random() < 0.5)
    if kind < 0.8:
        return SamplingParams(temperature=rng.uniform(0.5, 1.5), top_p=rng.uniform(0.5, 1.0),
                              top_k=rng.choice([-1, 5, 20]), max_tokens=max_tokens, seed=index)
    return SamplingParams(temperature=1.0, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def workload():
    rng = random.Random(0)
    llm = LLM("tiny-granite", max_model_len=48, block_size=4, max_num_seqs=8, num_kv_blocks=24, seed=0)
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    requests = {}
    for i in range(NUM_REQUESTS):
        prompt = [1] + [rng.randrange(4, vocab) for _ in range(rng.randint(0, 30))]
        requests[str(i)] = (prompt, random_params(rng, i))
    pending = list(requests)
    to_abort = set(rng.sample(sorted(requests), 20))
    finished, aborted, step = {}, set(), 0
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 6) if pending else 0):  # requests keep arriving while others run
            request_id = pending.pop(0)
            engine.add_request(request_id, *requests[request_id])
            if not pending:
                break
        for request_id in list(to_abort):
            if request_id in engine.requests and rng.random() < 0.2:
                assert engine.abort_request(request_id)
                aborted.add(request_id)
                to_abort.discard(request_id)
        for out in engine.step():
            if out.finished:
                assert out.request_id not in finished, "a request finished twice"
                finished[out.request_id] = out
        step += 1
    return llm, requests, finished, aborted


def test_every_request_finishes_or_is_reported_aborted(workload):
    _llm, requests, finished, aborted = workload
    assert set(finished) == set(requests)
    reasons = {rid: out.outputs[0].finish_reason for rid, out in finished.items()}
    assert {rid for rid, reason in reasons.items() if reason == "abort"} == aborted
    assert set(reasons.values()) <= {"stop", "length", "abort"}
    for rid, out in finished.items():
        params = requests[rid][1]
        if reasons[rid] == "length":
            assert len(out.outputs[0].token_ids) == params.max_tokens or len(out.prompt_token_ids) + len(
                out.outputs[0].token_ids) >= 48


def test_cache_pressure_forced_preemption(workload):
    llm, *_ = workload
    assert sum(r["num_preemptions"] for r in llm.stats.to_rows("requests")) > 0
    assert max(r["kv_blocks_used"] for r in llm.stats.to_rows()) == 24
    assert llm.stats.summary()["mixed_steps"] > 0     # preemptions and aborts met steps that mix prompts and decodes


def test_all_kv_blocks_return_to_the_free_list(workload):
    llm, *_ = workload
    manager = llm.llm_engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert all(block.ref_count == 0 for block in manager.blocks)
    assert not llm.llm_engine.requests


def test_greedy_outputs_equal_each_request_run_alone(workload):
    llm, requests, finished, aborted = workload
    alone = LLM("tiny-granite", max_model_len=48, block_size=4, enable_prefix_caching=False)
    greedy = [rid for rid, (_, params) in requests.items() if params.greedy and rid not in aborted]
    assert len(greedy) > 60
    preempted = {r["request_id"] for r in llm.stats.to_rows("requests") if r["num_preemptions"]}
    assert preempted & set(greedy), "no greedy request was preempted; the check would be weaker"
    for rid in greedy:
        prompt, params = requests[rid]
        reference = alone.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        assert finished[rid].outputs[0].token_ids == reference.token_ids, rid


def test_seeded_sampling_is_reproducible_in_another_batch(workload):
    _llm, requests, finished, aborted = workload
    seeded = [rid for rid, (_, params) in requests.items() if params.seed is not None and rid not in aborted]
    other = LLM("tiny-granite", max_model_len=48, block_size=4, max_num_seqs=16, seed=123)
    outs = other.generate([requests[rid][0] for rid in reversed(seeded)],
                          [requests[rid][1] for rid in reversed(seeded)], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [finished[rid].outputs[0].token_ids for rid in reversed(seeded)]
