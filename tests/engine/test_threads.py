"""Requests added and aborted from other threads while one thread steps the engine (what a server does).

On the starting code an abort that landed while `step()` ran freed the request's blocks under the step's
feet: `kv_cache.commit` raised IndexError and the stepping thread died. Here several threads hammer
`add_request` / `abort_request` while one steps; every request must end exactly once, no thread may
raise, and every KV block must come back.
"""

from __future__ import annotations

import random
import sys
import threading
from collections import Counter

import pytest

from spyre_lab.engine import LLM, LLMEngine, SamplingParams

NUM_ADDERS, PER_ADDER, NUM_ABORTERS = 3, 60, 2


@pytest.fixture
def busy_switching():
    """Switch threads every 10 us (default 5 ms), so adds and aborts land inside steps, not between them."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(previous)


def test_add_and_abort_from_other_threads_while_one_thread_steps(busy_switching):
    engine = LLMEngine("tiny-granite", max_model_len=48, block_size=4, max_num_seqs=8, num_kv_blocks=24)
    vocab = engine.model_config.vocab_size
    errors: list[BaseException] = []
    finishes: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    added: list[str] = []
    adding_done = threading.Event()

    def guarded(work):
        def run():
            try:
                work()
            except BaseException as error:  # reported by the test below
                errors.append(error)
        return run

    def stepper():
        while not (adding_done.is_set() and not engine.has_unfinished_requests()):
            for out in engine.step():
                if out.finished:
                    finishes[out.request_id] += 1
                    reasons[out.request_id] = out.outputs[0].finish_reason
            if errors:
                return

    def adder(index: int):
        rng = random.Random(index)
        for n in range(PER_ADDER):
            prompt = [1] + [rng.randrange(4, vocab) for _ in range(rng.randint(0, 20))]
            params = SamplingParams(temperature=rng.choice([0, 0.8]), max_tokens=rng.randint(1, 12), seed=n,
                                    ignore_eos=True)
            request_id = f"{index}-{n}"
            engine.add_request(request_id, prompt, params)
            added.append(request_id)

    def aborter(index: int):
        rng = random.Random(100 + index)
        while not adding_done.is_set() or engine.has_unfinished_requests():
            if added:
                engine.abort_request(rng.choice(added[-8:]))   # recent ones: most likely running right now
            if errors:
                return

    adders = [threading.Thread(target=guarded(lambda i=i: adder(i))) for i in range(NUM_ADDERS)]
    others = [threading.Thread(target=guarded(stepper))]
    others += [threading.Thread(target=guarded(lambda i=i: aborter(i))) for i in range(NUM_ABORTERS)]
    for thread in adders + others:
        thread.start()
    for thread in adders:
        thread.join(timeout=120)
    adding_done.set()
    for thread in others:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in adders + others), "a thread hung"
    assert not errors, f"a thread raised: {errors[0]!r}"
    assert len(added) == NUM_ADDERS * PER_ADDER
    assert set(finishes) == set(added) and set(finishes.values()) == {1}, "a request ended twice or never"
    assert set(reasons.values()) <= {"length", "abort"} and "abort" in reasons.values()
    assert engine.block_manager.num_used_blocks == 0 and not engine.requests
    assert {r.request_id for r in engine.stats.requests} == set(added)


def test_generate_from_a_second_thread_while_one_runs_is_refused_with_the_fix():
    llm = LLM("tiny-granite", max_model_len=32, block_size=4)
    started, release = threading.Event(), threading.Event()
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    caught: list[BaseException] = []

    def slow_stream():
        for _ in llm.stream([[1, 5, 9]], params):
            started.set()
            release.wait(30)

    thread = threading.Thread(target=slow_stream)
    thread.start()
    assert started.wait(30)
    try:
        llm.generate([[1, 6]], params, use_tqdm=False)
    except RuntimeError as error:
        caught.append(error)
    finally:
        release.set()
        thread.join(30)
    assert caught and "already running in another thread" in str(caught[0]) and "llm_engine" in str(caught[0])
    assert llm.generate([[1, 6]], params, use_tqdm=False)[0].outputs[0].finish_reason == "length"
