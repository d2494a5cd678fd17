"""The embedded tiny-granite: small, a real Granite checkpoint, and its greedy completions make sense."""

from __future__ import annotations

import json

import pytest

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.loader import EMBEDDED_MODELS
from spyre_lab.engine.tokenizer import CharTokenizer, load_tokenizer

FOLDER = EMBEDDED_MODELS["tiny-granite"]
GREEDY = SamplingParams(temperature=0, max_tokens=48)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-granite", max_model_len=128)


def test_shipped_files_are_small_and_granite():
    assert sum(f.stat().st_size for f in FOLDER.iterdir()) < 4 * 2**20
    config = json.loads((FOLDER / "config.json").read_text())
    assert config["architectures"] == ["GraniteForCausalLM"]
    multipliers = [config[k] for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                       "logits_scaling")]
    assert all(m != 1.0 for m in multipliers)  # the engine must really apply all four


def test_char_tokenizer_round_trips():
    tokenizer = load_tokenizer(FOLDER)
    assert isinstance(tokenizer, CharTokenizer)
    ids = tokenizer.encode("count from 5 to 12:")
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids) == "count from 5 to 12:"


@pytest.mark.parametrize(
    ("prompt", "completion"),
    [
        ("count from 5 to 12:", " 5 6 7 8 9 10 11 12"),
        ("count down from 20 to 14:", " 20 19 18 17 16 15 14"),
        ("3 + 4 =", " 7"),
        ("letters from c to h:", " c d e f g h"),
        ("spyre has", " 32 cores."),
        ("The answer is", " 42."),  # the tokenizer lowercases; the vocabulary has no capitals
    ],
)
def test_known_prompts_complete_sensibly(llm, prompt, completion):
    out = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].text == completion
    assert out.outputs[0].finish_reason == "stop"  # the model ends the line with <eos>


def test_stop_string_cuts_the_text(llm):
    out = llm.generate(["count from 5 to 12:"], SamplingParams(temperature=0, max_tokens=48, stop=" 9"),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == " 5 6 7 8" and out.finish_reason == "stop" and out.stop_reason == " 9"


def test_text_streams_token_by_token(llm):
    texts = [out.outputs[0].text for out in llm.stream("3 + 4 =", GREEDY)]
    assert texts[-1] == " 7" and texts[0] == " "
