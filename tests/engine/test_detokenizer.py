"""Incremental detokenization equals decoding and searching everything, step by step.

The engine used to decode a request's whole output and search all of it for every stop string at every step;
`detokenizer` appends one token's text (when the tokenizer's decode is per token) and searches only where a stop
string could newly end. Here both run side by side on token streams built to be awkward: stop strings spanning
tokens, stop strings that are prefixes of each other or overlap themselves, multi-byte characters split across
byte-level BPE tokens (whose earlier text changes when the next byte arrives), and stop strings changed mid-request.
"""

from __future__ import annotations

import random

import pytest

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.detokenizer import find_stop, update_text
from spyre_lab.engine.sequence import Sequence
from spyre_lab.engine.tokenizer import CharTokenizer, HFTokenizer


def full_check(tokenizer, ids: list[int], stops: list[str]) -> tuple[str, tuple[int, str] | None]:
    """What the engine did before: decode everything, search everything, stop strings in their order."""
    text = tokenizer.decode(ids)
    for stop in stops:
        cut = text.find(stop)
        if cut >= 0:
            return text, (cut, stop)
    return text, None


def run_both(tokenizer, ids: list[int], stops: list[str], change_stops_at: int | None = None,
             new_stops: list[str] | None = None) -> int:
    """Feed ``ids`` one token at a time to both; assert equal text and stop after every token. Returns the steps run."""
    seq = Sequence("r", [1], SamplingParams(temperature=0, stop=list(stops)))
    for step, token in enumerate(ids):
        if step == change_stops_at:
            seq.sampling_params.stop[:] = new_stops
        seq.output_token_ids.append(token)
        update_text(tokenizer, seq)
        params_stops = seq.sampling_params.stop
        found = find_stop(seq) if params_stops else None
        text, expected = full_check(tokenizer, seq.output_token_ids, params_stops)
        assert seq.output_text == text, f"step {step}"
        assert found == expected, f"step {step}: {found} != {expected} in {text!r}"
        if found is not None:
            return step + 1
    return len(ids)


CHARS = "abc 0123456789:+=-"


@pytest.fixture(scope="module")
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer(CHARS)


def char_ids(tokenizer: CharTokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_bos=False)


@pytest.mark.parametrize(("text", "stops", "stopped_at"), [
    ("cab 10 11 12", ["11 1"], 11),                         # spans several tokens
    ("aaab", ["aab"], 4),                                   # overlaps itself: the match starts in searched text
    ("abcabc", ["cab", "ab"], 2),                           # list order wins over position: "ab" at step 2 first
    ("0 1 2 3", ["9"], 7),                                  # never found
    ("ab", ["abc", "b"], 2),                                # a longer stop string that never completes
])
def test_char_tokenizer_stop_strings(char_tokenizer, text, stops, stopped_at) -> None:
    assert run_both(char_tokenizer, char_ids(char_tokenizer, text), stops) == stopped_at


def test_specials_and_out_of_range_ids_decode_to_nothing(char_tokenizer) -> None:
    # <pad>, <bos>, <eos>, <unk> and ids past the vocabulary decode to "" when skipped: the pieces still add up
    ids = [0, *char_ids(char_tokenizer, "a b"), 2, 3, 999, *char_ids(char_tokenizer, " c")]
    run_both(char_tokenizer, ids, ["b c", "zz"])


def test_random_streams_char_tokenizer(char_tokenizer) -> None:
    rng = random.Random(0)
    vocab = range(char_tokenizer.vocab_size + 2)             # specials and two out-of-range ids too
    for _ in range(300):
        ids = [rng.choice(vocab) for _ in range(rng.randint(1, 40))]
        stops = ["".join(rng.choice("ab ") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        change = rng.randint(0, len(ids)) if rng.random() < 0.3 else None
        run_both(char_tokenizer, ids, stops, change, ["".join(rng.choice("ab1") for _ in range(2))])


def test_stop_strings_changed_mid_request_are_searched_in_all_text(char_tokenizer) -> None:
    # "a a" is already in the text when it becomes a stop string: found there, as a full search finds it
    ids = char_ids(char_tokenizer, "a a b b")
    assert run_both(char_tokenizer, ids, ["zz"], change_stops_at=5, new_stops=["a a"]) == 6


@pytest.fixture(scope="module")
def byte_bpe(tmp_path_factory) -> HFTokenizer:
    """A byte-level BPE trained here, on text with multi-byte characters: some characters split across tokens."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet)
    tokenizer.train_from_iterator(["café crème brûlée", "日本語のテキスト", "naïve 🙂 emoji 🙂🙂"] * 20, trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return HFTokenizer(path, None, None)


def test_byte_level_bpe_multibyte_characters(byte_bpe) -> None:
    assert not getattr(byte_bpe, "decodes_token_by_token", False)
    raw = byte_bpe._tokenizer
    text = "crème 🙂 日本 brûlée 🙂🙂 naïve"
    ids = raw.encode(text).ids
    # split every token of a multi-byte character into its bytes' tokens, so characters span several tokens
    byte_ids = [raw.token_to_id(piece) for token in ids for piece in raw.id_to_token(token)]
    assert byte_bpe.decode(byte_ids) == text
    changed = [i for i in range(1, len(byte_ids)) if not byte_bpe.decode(byte_ids[:i + 1]).startswith(
        byte_bpe.decode(byte_ids[:i]))]
    assert changed, "some token must change the text decoded before it (a character completed)"
    for stops in (["🙂🙂"], ["日本"], ["e 🙂"], ["ûl", "xyz"], ["\ufffd"], ["naïve"]):
        run_both(byte_bpe, byte_ids, stops)


def test_random_streams_byte_level_bpe(byte_bpe) -> None:
    rng = random.Random(1)
    vocab = range(byte_bpe._tokenizer.get_vocab_size())
    pieces = ["é", "🙂", "日", "\ufffd", "a", "e "]
    for _ in range(150):
        ids = [rng.choice(vocab) for _ in range(rng.randint(1, 30))]
        stops = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 2))) for _ in range(rng.randint(1, 3))]
        run_both(byte_bpe, ids, stops)


def test_engine_stop_string_cut_and_reason() -> None:
    llm = LLM("tiny-granite", max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=48)
    full = llm.generate(["count from 5 to 12:"], params, use_tqdm=False)[0].outputs[0]
    stopped = llm.generate(["count from 5 to 12:"], SamplingParams(temperature=0, max_tokens=48, stop=["8 9", " 9"]),
                           use_tqdm=False)[0].outputs[0]
    cut = full.text.find("8 9")
    # both complete with the same token: the first in the list wins, cut where it starts
    assert cut > 0 and stopped.text == full.text[:cut] and stopped.stop_reason == "8 9"
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == full.token_ids[:len(stopped.token_ids)]
