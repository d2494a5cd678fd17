"""The checkpoint dtype policy (`engine.weight_dtype`): floats of any width are rounded to the engine's dtype,
values that would overflow it and non-float tensors raise a ModelLoadError naming the tensor, dtype and fix.

On the starting code the loader cast every tensor on the host first: a q_proj with values up to 2.4e5 became
inf in float16 and the spyre platform generated [0, 0, 0, 0] without an error, and int8 / bool / float64
tensors were silently cast (an int8 weight changed the tokens).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.loader import EMBEDDED_MODELS, ModelLoadError

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT = [1, 5, 9, 12]
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


def _folder(tmp_path: Path, edit) -> str:
    folder = tmp_path / "model"
    shutil.copytree(EMBEDDED_MODELS["tiny-granite"], folder)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)
    return str(folder)


def _scale_q_proj(tensors: dict[str, torch.Tensor]) -> None:
    weight = tensors[Q_PROJ]
    tensors[Q_PROJ] = weight * (2.4e5 / float(weight.abs().max()))


@pytest.mark.parametrize("options", [dict(platform="spyre"), dict(platform="cpu", dtype="float16")],
                         ids=["spyre", "cpu-float16"])
def test_weights_beyond_the_engine_dtype_range_are_refused_naming_tensor_value_and_fix(tmp_path, options):
    folder = _folder(tmp_path, _scale_q_proj)
    with pytest.raises(ModelLoadError) as info:
        LLM(folder, max_model_len=32, block_size=4, **options)
    message = str(info.value)
    assert "model.safetensors" in message and repr(Q_PROJ) in message
    assert "2.4e+05" in message and "torch.float16" in message and "dtype='float32'" in message


def test_the_same_weights_load_and_generate_in_float32(tmp_path):
    """The values are legal checkpoint values, only out of float16's range: float32 serves them."""
    folder = _folder(tmp_path, _scale_q_proj)
    out = LLM(folder, max_model_len=32, block_size=4).generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.error is None and len(out.outputs[0].token_ids) == 4


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool, torch.complex64])
def test_non_floating_checkpoint_tensors_are_refused_naming_tensor_and_dtype(tmp_path, dtype):
    def to_dtype(tensors):
        weight = tensors[Q_PROJ]
        tensors[Q_PROJ] = (weight * 100).to(dtype) if dtype != torch.bool else weight > 0

    folder = _folder(tmp_path, to_dtype)
    with pytest.raises(ModelLoadError, match=rf"tensor '{Q_PROJ}' is {dtype}.*floating-point checkpoints"):
        LLM(folder, max_model_len=32, block_size=4)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_checkpoint_tensor_holding_nan_or_inf_is_refused(tmp_path, value):
    def poison(tensors):
        tensors[Q_PROJ][0, 0] = value

    with pytest.raises(ModelLoadError, match=rf"'{Q_PROJ}' \(torch.float32\) holds 1 NaN or inf"):
        LLM(_folder(tmp_path, poison), max_model_len=32, block_size=4)


def test_float64_and_bfloat16_checkpoints_are_rounded_to_the_engine_dtype(tmp_path):
    """The documented policy for floats: any width, rounded. float64 holding float32 values gives the same tokens."""
    reference = LLM("tiny-granite", max_model_len=32, block_size=4).generate([PROMPT], GREEDY, use_tqdm=False)
    wide = _folder(tmp_path / "f64", lambda t: t.update({k: v.double() for k, v in t.items()}))
    out = LLM(wide, max_model_len=32, block_size=4).generate([PROMPT], GREEDY, use_tqdm=False)
    assert out[0].outputs[0].token_ids == reference[0].outputs[0].token_ids
    narrow = _folder(tmp_path / "bf16", lambda t: t.update({k: v.bfloat16() for k, v in t.items()}))
    llm = LLM(narrow, max_model_len=32, block_size=4)
    assert llm.llm_engine.model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    assert llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].error is None
