"""A failure inside a step fails only the requests it concerns; the engine keeps serving the rest.

On the starting code, a request whose sampling produced NaN probabilities raised out of `step()`; it
stayed in the running queue, so every later `generate()` raised the same error, the other requests of
its batch were lost, and its KV blocks were never freed.
"""

from __future__ import annotations

import math

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.linear import VocabEmbedding
from spyre_lab.engine.platforms.cpu import CpuPlatform
from spyre_lab.engine.sampling_params import MIN_TEMPERATURE

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPTS = [[1, 5, 9, 12], [1, 6, 7], [1, 8, 10, 11, 13]]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-granite", max_model_len=32, block_size=4, max_num_seqs=4)


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    """Each prompt's greedy tokens, run on its own."""
    return [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]


def _assert_engine_clean(llm: LLM) -> None:
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and not engine.requests
    assert engine.block_manager.num_used_blocks == 0, "a failed request kept KV blocks"


@pytest.mark.parametrize("temperature", [1e-40, 1e-45, 5e-324, MIN_TEMPERATURE / 2])
def test_temperatures_whose_reciprocal_overflows_are_refused_when_built(temperature):
    with pytest.raises(ValueError, match="1/temperature overflows float32"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-30, 1e-8, 1e-3])
def test_the_smallest_accepted_temperatures_sample_the_argmax(llm, alone, temperature):
    """Every temperature validation accepts samples without NaN: tiny ones give the greedy tokens."""
    params = SamplingParams(temperature=temperature, max_tokens=4, ignore_eos=True, seed=3)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.error for o in outs] == [None] * len(PROMPTS)
    if temperature <= 1e-8:
        assert [o.outputs[0].token_ids for o in outs] == alone
    _assert_engine_clean(llm)


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", 1e-40), ("temperature", math.nan), ("temperature", -math.inf), ("top_p", math.nan),
    ("top_p", 0.0), ("top_k", 2.5), ("temperature", "0.5"),
])
def test_a_request_whose_params_break_while_it_runs_fails_alone_and_the_engine_keeps_serving(llm, alone, field,
                                                                                            value):
    """The params object is the caller's: changed after the request was accepted, the sampler meets the bad
    value mid-run. Only that request fails (with the reason), the rest of its batch finishes as if alone, its
    blocks come back, and the next generate() works."""
    bad = SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True, seed=1)
    engine = llm.llm_engine
    engine.add_request("bad", PROMPTS[0], bad)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"good{i}", prompt, GREEDY)
    first = engine.step()                                  # the prefill of all four succeeds
    assert {o.request_id for o in first} == {"bad", "good0", "good1", "good2"}
    setattr(bad, field, value)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    failed = finished["bad"]
    assert failed.outputs[0].finish_reason == "error" and failed.error and field in failed.error
    assert len(failed.outputs[0].token_ids) == 1          # the token sampled before the params broke
    assert [finished[f"good{i}"].outputs[0].token_ids for i in range(len(PROMPTS))] == alone
    assert next(r for r in engine.stats.requests if r.request_id == "bad").finish_reason == "error"
    _assert_engine_clean(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == alone


POISON = 44  # in no prompt here nor in their greedy outputs (checked below)


class PoisonedEmbedding(VocabEmbedding):
    """A platform's embedding kernel that cannot take token id 7 (a layer override that raises)."""

    def forward_oot(self, input_ids: torch.Tensor) -> torch.Tensor:
        if bool((input_ids == POISON).any()):
            raise RuntimeError(f"embedding kernel: token id {POISON} is not supported")
        return self.forward_native(input_ids)


class PoisonedPlatform(CpuPlatform):
    def register_ops(self) -> None:
        self.register_oot("VocabEmbedding", PoisonedEmbedding)


def test_a_forward_pass_that_raises_fails_only_its_batch_and_frees_its_blocks(alone):
    assert all(POISON not in tokens for tokens in [*PROMPTS, *alone])
    llm = LLM("tiny-granite", platform=PoisonedPlatform(), max_model_len=32, block_size=4, max_num_seqs=4)
    engine = llm.llm_engine
    engine.add_request("poisoned", [1, POISON, 9], GREEDY)
    engine.add_request("same-batch", PROMPTS[1], GREEDY)
    outputs = engine.step()                            # one prefill of both: the forward raises
    assert {o.request_id: o.outputs[0].finish_reason for o in outputs} == {"poisoned": "error",
                                                                          "same-batch": "error"}
    assert all("token id 44 is not supported" in o.error for o in outputs)
    _assert_engine_clean(llm)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)   # serving goes on
    assert [o.outputs[0].token_ids for o in outs] == alone
    (mixed_bad, mixed_good) = llm.generate([[1, POISON], PROMPTS[1]], [GREEDY, GREEDY], use_tqdm=False)
    assert mixed_bad.outputs[0].finish_reason == "error" and "not supported" in mixed_bad.error
    assert mixed_good.outputs[0].finish_reason == "error"  # it shared the failing forward pass
    _assert_engine_clean(llm)


def test_nan_logits_fail_the_request_instead_of_a_silent_token(llm):
    """A NaN row of logits (a numerical failure in the forward) is that request's error, greedy or sampled."""
    from spyre_lab.engine.sampler import Sampler
    from spyre_lab.engine.sequence import Sequence

    logits = torch.randn(3, 10)
    logits[1, 4] = math.nan
    seqs = [Sequence(str(i), [1], p) for i, p in enumerate([GREEDY, GREEDY, SamplingParams(seed=0)])]
    tokens = Sampler()(logits, seqs)
    assert tokens[1] is None and set(tokens.failures) == {1} and "NaN logits" in tokens.failures[1]
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] is not None
