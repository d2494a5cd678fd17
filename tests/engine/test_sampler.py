"""Sampler: greedy, top-k/top-p filtering, seeded reproducibility independent of batch."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.engine.sampler import Sampler, filter_top_k_top_p
from spyre_lab.engine.sampling_params import SamplingParams
from spyre_lab.engine.sequence import Sequence


def seq(params: SamplingParams, generated: int = 0) -> Sequence:
    s = Sequence("r", [1], params)
    s.output_token_ids = [0] * generated
    return s


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert Sampler()(logits, [seq(SamplingParams(temperature=0))] * 2) == [1, 0]


def test_top_k_keeps_k_largest():
    kept = filter_top_k_top_p(torch.tensor([1.0, 4.0, 3.0, 2.0]), top_k=2, top_p=1.0)
    assert torch.isfinite(kept).tolist() == [False, True, True, False]


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert torch.isfinite(filter_top_k_top_p(logits, -1, 0.7)).tolist() == [True, True, False, False]
    assert torch.isfinite(filter_top_k_top_p(logits, -1, 0.45)).tolist() == [True, False, False, False]
    assert torch.isfinite(filter_top_k_top_p(logits, -1, 0.81)).tolist() == [True, True, True, False]


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.7, 0.2, 0.1, 0.0])
    params = SamplingParams(temperature=1.0)
    sampler = Sampler(seed=1)
    counts = torch.bincount(torch.tensor(sampler(probs.log().repeat(4000, 1), [seq(params)] * 4000)), minlength=4)
    assert counts[3] == 0
    torch.testing.assert_close(counts.float() / 4000, probs, atol=0.03, rtol=0)


def test_seeded_request_draws_the_same_token_in_any_batch():
    logits = torch.randn(1, 50)
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = Sampler(seed=0)(logits, [seq(params, generated=3)])
    in_batch = Sampler(seed=99)(torch.cat([torch.randn(5, 50), logits]), [seq(SamplingParams())] * 5 + [seq(params, 3)])
    assert alone[0] == in_batch[-1]
    draws = {Sampler()(logits, [seq(params, generated=n)])[0] for n in range(20)}
    assert len(draws) > 1  # the seed advances with each generated token


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("temperature", -1.0, "temperature"), ("top_p", 0.0, "top_p"), ("top_k", -2, "top_k"),
     ("max_tokens", 0, "max_tokens"), ("stop", [""], "stop"), ("stop_token_ids", [-1], "stop_token_ids")],
)
def test_invalid_sampling_params_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value}).validate()
