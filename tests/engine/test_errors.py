"""Errors point at the user: broken model folders, wrong argument types, bad sampling values, unknown characters."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from spyre_lab.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from spyre_lab.engine.loader import EMBEDDED_MODELS, ModelLoadError
from spyre_lab.engine.tokenizer import UnknownCharactersWarning, load_tokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A writable copy of the shipped tiny-granite folder, to break."""
    folder = tmp_path / "model"
    shutil.copytree(EMBEDDED_MODELS["tiny-granite"], folder)
    return folder


# --- broken model folders ----------------------------------------------------------------------
def test_a_corrupt_config_json_is_named(model_dir):
    (model_dir / "config.json").write_text('{"architectures": ["GraniteForCausalLM"], "vocab_size": 46,')
    with pytest.raises(ModelLoadError, match=r"config\.json is not valid JSON") as info:
        LLM(str(model_dir))
    assert str(model_dir / "config.json") in str(info.value)


def test_a_config_json_missing_a_key_names_the_file_and_the_key(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    del config["hidden_size"]
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"config\.json lacks the key 'hidden_size'"):
        LLM(str(model_dir))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_size", "128", "hidden_size must be a positive int, got '128'"),
    ("num_hidden_layers", 0, "num_hidden_layers must be a positive int, got 0"),
    ("num_key_value_heads", 3, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    ("architectures", ["BertModel"], "architectures.*not supported"),
])
def test_a_config_json_with_a_bad_value_names_the_file_and_the_key(model_dir, key, value, message):
    config = json.loads((model_dir / "config.json").read_text())
    config[key] = value
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=rf"config\.json: .*{message}"):
        LLM(str(model_dir))


def test_a_truncated_safetensors_file_is_named(model_dir):
    path = model_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors.*(damaged or truncated)") as info:
        LLM(str(model_dir))
    assert str(path) in str(info.value)


def _rewrite_weights(model_dir: Path, edit) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_a_missing_tensor_is_named_even_when_only_one_shard_of_a_fused_weight_is_missing(model_dir):
    """On main a checkpoint without k_proj loaded: q and v filled qkv_proj, k stayed uninitialized."""
    _rewrite_weights(model_dir, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"lacks 1 tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
        LLM(str(model_dir))


def test_a_tensor_of_the_wrong_shape_is_named_with_its_file(model_dir):
    def shrink(tensors):
        name = "model.layers.0.mlp.down_proj.weight"
        tensors[name] = tensors[name][:, :-8].contiguous()

    _rewrite_weights(model_dir, shrink)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.down_proj\.weight' "
                                             r"\(shape \(128, 248\)"):
        LLM(str(model_dir))


# --- wrong argument types ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-granite", max_model_len=32, block_size=4, max_num_seqs=4)


def test_llm_of_none_is_a_type_error():
    with pytest.raises(TypeError, match=r"model must be an embedded model name.*got NoneType None"):
        LLM(None)


def test_generate_of_a_number_is_a_type_error(llm):
    with pytest.raises(TypeError, match=r"prompts must be a str, a list of token ids.*got int 5"):
        llm.generate(5)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        llm.generate("3 + 4 =", {"temperature": 0})


# --- sampling parameters -----------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "message"), [
    ({"temperature": -1}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": math.nan}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"), ({"max_tokens": True}, "max_tokens"), ({"stop": 5}, "stop"),
    ({"seed": "1"}, "seed"),
])
def test_sampling_params_refuse_invalid_values_when_built(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_params_made_invalid_after_building_are_reported_per_request_for_token_id_prompts(llm):
    bad = SamplingParams(temperature=0, max_tokens=4)
    bad.top_p = 0.0
    outs = llm.generate([[1, 5, 9], {"prompt_token_ids": [1, 6, 7]}, [1, 8]], [bad, bad, GREEDY], use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["error", "error", "length"]
    assert all("top_p must be in (0, 1]" in o.error for o in outs[:2])
    assert [o.prompt_token_ids for o in outs] == [[1, 5, 9], [1, 6, 7], [1, 8]]
    assert outs[0].decoded_prompt == llm.tokenizer.decode([1, 5, 9], skip_special_tokens=False)


# --- the character tokenizer -------------------------------------------------------------------
def test_the_char_tokenizer_warns_once_per_call_naming_every_unknown_character():
    tokenizer = load_tokenizer(EMBEDDED_MODELS["tiny-granite"])
    with pytest.warns(UnknownCharactersWarning) as caught:
        ids = tokenizer.encode("Héllo wörld!!")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "'!', 'é', 'ö'" in message and "4 of 13 characters" in message
    assert caught[0].filename == __file__
    assert ids.count(tokenizer.unk_token_id) == 4
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<bos>h<unk>llo w<unk>rld<unk><unk>"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenizer.encode("count from 5 to 12:")  # every character known: no warning


def test_a_request_output_shows_what_the_model_saw(llm):
    with pytest.warns(UnknownCharactersWarning, match="'é'"):
        (out,) = llm.generate(["Café 3 + 4 ="], GREEDY, use_tqdm=False)
    assert out.prompt == "Café 3 + 4 ="
    assert out.decoded_prompt == "<bos>caf<unk> 3 + 4 ="  # lowercased, é unknown
    (plain,) = llm.generate(["3 + 4 ="], GREEDY, use_tqdm=False)
    assert plain.decoded_prompt == "<bos>3 + 4 ="


# --- EngineConfig ------------------------------------------------------------------------------
def test_llm_builds_one_engine_config_with_the_defaults_filled_in(llm):
    config = llm.config
    assert isinstance(config, EngineConfig) and config is llm.llm_engine.config
    assert (config.max_model_len, config.block_size, config.max_num_seqs) == (32, 4, 4)
    assert config.num_kv_blocks == 4 * 8 and config.max_num_batched_tokens == 2048
    assert config.dtype == torch.float32  # the cpu platform's default


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"max_num_seqs": 0}, ValueError, "max_num_seqs must be >= 1"),
    ({"block_size": "16"}, TypeError, "block_size must be an int"),
    ({"max_model_len": 1}, ValueError, "max_model_len must be >= 2"),
    ({"enable_prefix_caching": "yes"}, TypeError, "enable_prefix_caching must be True or False"),
    ({"prefill_buckets": 64}, ValueError, "prefill_buckets must be a list of positive ints"),
    ({"dtype": "float17"}, ValueError, "unknown dtype"),
    ({"platform": 3}, TypeError, "platform must be a platform name"),
    ({"max_model_lenght": 64}, TypeError, r"unknown engine option\(s\) \['max_model_lenght'\]"),
])
def test_engine_options_are_checked_in_one_place_before_any_model_is_read(options, error, message):
    with pytest.raises(error, match=message):
        EngineConfig.from_options("/no/such/model", **options)
    with pytest.raises(error, match=message):
        LLM("/no/such/model", **options)  # the option is refused first, not the missing folder


def test_an_engine_config_can_be_passed_whole_and_overridden():
    config = EngineConfig("tiny-granite", max_model_len=24, block_size=4, max_num_seqs=2)
    engine = LLMEngine(config)
    assert engine.config.max_model_len == 24 and engine.max_model_len == 24
    assert LLM(config, max_num_seqs=1).config.max_num_seqs == 1
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLMEngine(config.replace(max_model_len=10_000))


# --- settings of the wrong type, bad tokenizer files (named at load, not at the first generate) ----------------
@pytest.mark.parametrize(("key", "value", "message"), [
    ("rms_norm_eps", "1e-6", r"rms_norm_eps must be a finite number > 0, got str '1e-6'; write it as a JSON number "
                             r"\(1e-06\)"),
    ("rms_norm_eps", 0, "rms_norm_eps must be a finite number > 0, got int 0"),
    ("rope_parameters", {"rope_theta": None, "rope_type": "default"},
     "rope_theta must be a finite number > 0, got NoneType None"),
    ("logits_scaling", "2", "logits_scaling must be a finite number > 0"),
    ("attention_multiplier", [0.1], "attention_multiplier must be a finite number > 0 or null"),
    ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false, got str 'false'"),
    ("eos_token_id", 10_000, r"eos_token_id must be a token id in \[0, "),
    ("bos_token_id", "1", "bos_token_id must be a token id"),
])
def test_a_config_setting_of_the_wrong_type_is_named_at_load(model_dir, key, value, message):
    """On the starting code `"rms_norm_eps": "1e-6"` loaded and failed at the first generate."""
    config = json.loads((model_dir / "config.json").read_text())
    config[key] = value
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=rf"config\.json: {message}"):
        LLM(str(model_dir))


@pytest.mark.parametrize(("text", "message"), [
    ('{"type": "spyre_lab.char", "chars": "ab', r"tokenizer\.json is not valid JSON"),
    ("[1, 2]", r"tokenizer\.json must hold a JSON object"),
    ('{"type": "spyre_lab.char", "special_tokens": ["<pad>", "<bos>", "<eos>", "<unk>"]}',
     r"tokenizer\.json: a spyre_lab\.char tokenizer needs the key 'chars'"),
    ('{"version": "1.0", "model": {"type": "NoSuchModel"}}', r"tokenizer\.json cannot be read as a Hugging Face"),
])
def test_a_bad_tokenizer_json_is_named(model_dir, text, message):
    """On the starting code a broken tokenizer.json raised a bare JSONDecodeError without the file name."""
    (model_dir / "tokenizer.json").write_text(text)
    with pytest.raises(ModelLoadError, match=message) as info:
        LLM(str(model_dir))
    assert str(model_dir / "tokenizer.json") in str(info.value)


# --- prompts that are not text or token ids ----------------------------------------------------------------------
def test_bytes_as_prompts_are_refused_not_read_as_token_ids(llm):
    """On the starting code b"abc" was the token ids [97, 98, 99]."""
    for prompts in (b"abc", bytearray(b"abc")):
        with pytest.raises(TypeError, match=r"got (bytes|bytearray) b'abc'; decode bytes to text first"):
            llm.generate(prompts, GREEDY, use_tqdm=False)
    (out,) = llm.generate([b"abc"], GREEDY, use_tqdm=False)    # one bytes prompt in a list: that request's error
    assert out.outputs[0].finish_reason == "error" and "decode bytes to text first" in out.error


def test_integer_arrays_are_token_ids_one_prompt_per_row(llm):
    """On the starting code a 1-D array was split into one prompt per element."""
    np = pytest.importorskip("numpy")
    ids = [1, 5, 9, 12]
    (reference,) = llm.generate([ids], GREEDY, use_tqdm=False)
    for prompt in (np.array(ids), torch.tensor(ids), np.array(ids, dtype=np.int32), [np.int64(t) for t in ids]):
        outs = llm.generate(prompt, GREEDY, use_tqdm=False)
        assert [(o.prompt_token_ids, o.outputs[0].token_ids) for o in outs] == [
            (ids, reference.outputs[0].token_ids)], type(prompt)
    rows = llm.generate(torch.tensor([ids, ids]), GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in rows] == [reference.outputs[0].token_ids] * 2
    (from_list,) = llm.generate([torch.tensor(ids)], GREEDY, use_tqdm=False)
    assert from_list.outputs[0].token_ids == reference.outputs[0].token_ids


@pytest.mark.parametrize("prompts", [torch.tensor([1.0, 5.0]), torch.tensor(3), torch.ones(2, 2, 2, dtype=torch.long),
                                     torch.tensor([True, False])], ids=["float", "0-d", "3-d", "bool"])
def test_arrays_that_are_not_token_ids_are_refused_clearly(llm, prompts):
    with pytest.raises(TypeError, match="array of integer token ids"):
        llm.generate(prompts, GREEDY, use_tqdm=False)
