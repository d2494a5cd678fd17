"""Our loader + portable model vs the transformers implementation of the same checkpoint."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.model_runner import ModelRunner
from spyre_lab.engine.sequence import Sequence

PROMPT = [1, 5, 17, 33, 99, 100, 7, 8, 9, 10, 11, 64, 3]


def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("fixture", ["hf_granite_dir", "hf_llama_dir"])
def test_prefill_logits_match_transformers(fixture, request):
    path = request.getfixturevalue(fixture)
    llm = LLM(path, max_model_len=64, block_size=4)
    engine = llm.llm_engine
    seq = Sequence("0", PROMPT, SamplingParams())
    engine.block_manager.allocate(seq)
    runner: ModelRunner = engine.runner
    model_input = runner.prepare_prefill([seq])
    model_input.logits_indices = torch.arange(len(PROMPT))  # every position, not just the last
    ours = runner.execute(model_input)
    with torch.no_grad():
        reference = hf_model(path)(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("fixture", ["hf_granite_dir", "hf_llama_dir"])
def test_32_greedy_tokens_match_transformers_generate(fixture, request):
    path = request.getfixturevalue(fixture)
    with torch.no_grad():
        reference = hf_model(path).generate(
            torch.tensor([PROMPT]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(PROMPT):].tolist()
    llm = LLM(path, max_model_len=64, block_size=4)
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == reference
    assert out.outputs[0].finish_reason == "length"


def test_granite_multipliers_are_applied(tmp_path):
    """Changing only logits_scaling changes our logits by exactly that factor."""
    from tests.engine.conftest import save_hf_model

    a = LLM(save_hf_model(tmp_path / "a", logits_scaling=1.0), max_model_len=32)
    b = LLM(save_hf_model(tmp_path / "b", logits_scaling=4.0), max_model_len=32)
    hidden = torch.randn(3, 64)
    torch.testing.assert_close(a.llm_engine.model.compute_logits(hidden) / 4,
                               b.llm_engine.model.compute_logits(hidden))


def test_spyre_platform_matches_transformers_within_fp16_tolerance(hf_granite_dir):
    """The transformers-saved checkpoint on the spyre platform (fp16 on the modeled card, piecewise compiled).

    Stated tolerance: every greedy token spyre picks is the fp32 reference's argmax up to 2e-2 in logit
    (fp16 keeps ~3 significant digits; this random model's logits are below ~1 in magnitude, and its
    top-2 margins go down to 2e-3, so an exact-token comparison would test fp16 rounding, not the
    model). The reference is teacher-forced on spyre's own sequence, so one near-tie cannot cascade.
    """
    llm = LLM(hf_granite_dir, platform="spyre", max_model_len=64, block_size=64, max_num_seqs=1)
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)[0]
    tokens = out.outputs[0].token_ids
    with torch.no_grad():
        logits = hf_model(hf_granite_dir)(torch.tensor([PROMPT + tokens])).logits[0]
    steps = logits[len(PROMPT) - 1: len(PROMPT) - 1 + len(tokens)]
    chosen = steps.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    gaps = steps.max(-1).values - chosen
    assert len(tokens) == 32 and float(gaps.max()) <= 2e-2, gaps.tolist()
    assert int((gaps == 0).sum()) >= 24  # most steps pick exactly the reference argmax
