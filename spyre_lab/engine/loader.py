"""Load a model from a local Hugging Face folder (config.json + *.safetensors). Never downloads.

`"tiny-granite"` names the small Granite model shipped inside the package (made by
scripts/make_tiny_granite.py); anything else must be a path to a folder on disk.
A broken folder raises :class:`ModelLoadError` naming the file and the key or tensor at fault: a
config.json that is not JSON or lacks a field, a truncated .safetensors file, a missing tensor, a
tensor of the wrong shape, a tensor the dtype policy refuses (`weight_dtype`: integer, bool or complex
tensors; values beyond the range of the engine's dtype).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from spyre_lab.engine.errors import ModelLoadError
from spyre_lab.engine.layers.custom_op import more_overrides
from spyre_lab.engine.models.config import ModelConfig
from spyre_lab.engine.models.granite import MODEL_REGISTRY, GraniteForCausalLM
from spyre_lab.engine.parallel.group import TensorParallelGroup, building_for
from spyre_lab.engine.platforms.base import Platform, set_current_platform
from spyre_lab.engine.weight_dtype import WeightDtypeError

EMBEDDED_MODELS = {"tiny-granite": Path(__file__).parent / "models" / "tiny_granite"}


def resolve_model_path(model: str | os.PathLike) -> Path:
    """Folder of an embedded model name or a local path; a clear error for anything else."""
    if not isinstance(model, str | os.PathLike):
        raise TypeError(f"model must be an embedded model name ({', '.join(EMBEDDED_MODELS)}) or the path of a local "
                        f"folder with config.json, got {type(model).__name__} {model!r}")
    if isinstance(model, str) and model in EMBEDDED_MODELS:
        return EMBEDDED_MODELS[model]
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"model {str(model)!r} is neither an embedded model ({', '.join(EMBEDDED_MODELS)}) nor a local folder "
            "with config.json; spyre_lab never downloads — save the model locally first (e.g. save_pretrained)"
        )
    return folder


def read_config(folder: Path) -> ModelConfig:
    """The folder's config.json as a ModelConfig; a ModelLoadError names the file and the bad field."""
    path = folder / "config.json"
    try:
        document = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); re-save the model (save_pretrained) or fix the file") \
            from e
    if not isinstance(document, dict):
        raise ModelLoadError(f"{path} must hold a JSON object of model settings, got a {type(document).__name__}")
    for key in SIZE_KEYS:
        _check_size(path, key, document.get(key, 1))
    try:
        config = ModelConfig.from_hf_dict(document)
    except KeyError as e:
        raise ModelLoadError(f"{path} lacks the key {e.args[0]!r}, which the model needs") from e
    except (TypeError, ValueError, AttributeError) as e:
        raise ModelLoadError(f"{path}: {e}") from e
    for key in SIZE_KEYS:
        _check_size(path, key, getattr(config, key))
    _check_settings(path, config)
    if config.num_attention_heads % config.num_key_value_heads:
        raise ModelLoadError(f"{path}: num_attention_heads ({config.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({config.num_key_value_heads})")
    return config


SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings")
"""config.json fields that size the model: each must be a positive int."""


def _check_size(path: Path, key: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ModelLoadError(f"{path}: {key} must be a positive int, got {value!r}")


POSITIVE_NUMBER_KEYS = ("rms_norm_eps", "rope_theta", "embedding_multiplier", "residual_multiplier", "logits_scaling")
"""config.json fields the model multiplies or divides by: each must be a finite number > 0."""
BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias")


def _check_settings(path: Path, config: ModelConfig) -> None:
    """The types of the non-size settings, checked at load: a string ``"1e-6"`` would otherwise load and fail in
    the first forward pass, far from the file that holds it."""
    def refuse(key: str, value: object, expected: str) -> None:
        hint = ""
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                hint = f"; write it as a JSON number ({float(value)!r}), not a string"
        raise ModelLoadError(f"{path}: {key} must be {expected}, got {type(value).__name__} {value!r}{hint}")

    for key in POSITIVE_NUMBER_KEYS:
        value = getattr(config, key)
        if not (_is_number(value) and value > 0):
            refuse(key, value, "a finite number > 0")
    if config.attention_multiplier is not None and not (_is_number(config.attention_multiplier)
                                                        and config.attention_multiplier > 0):
        refuse("attention_multiplier", config.attention_multiplier, "a finite number > 0 or null")
    for key in BOOL_KEYS:
        if not isinstance(getattr(config, key), bool):
            refuse(key, getattr(config, key), "true or false")
    for key, ids in (("bos_token_id", () if config.bos_token_id is None else (config.bos_token_id,)),
                     ("eos_token_id", config.eos_token_ids)):
        for token_id in ids:
            if not (isinstance(token_id, int) and not isinstance(token_id, bool)
                    and 0 <= token_id < config.vocab_size):
                refuse(key, token_id, f"a token id in [0, {config.vocab_size}) (or a list of them for eos_token_id)")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def iter_safetensors(folder: Path) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """(file, tensor name, tensor) for every tensor of every *.safetensors file; unreadable files are named."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors files in {folder}; only safetensors checkpoints are supported")
    for file in files:
        try:
            reader = safe_open(file, framework="pt")
        except Exception as e:  # safetensors raises its own SafetensorError (and OSError) for a damaged header
            raise ModelLoadError(f"{file} cannot be read as safetensors ({e}); the file is damaged or truncated: "
                                 "copy or save it again") from e
        with reader:
            for name in reader.keys():  # noqa: SIM118 - safe_open is not a mapping
                try:
                    tensor = reader.get_tensor(name)
                except Exception as e:
                    raise ModelLoadError(f"{file}: tensor {name!r} cannot be read ({e}); the file is damaged or "
                                         "truncated: copy or save it again") from e
                yield file, name, tensor


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Parameters and buffers are created in the model's dtype, as vLLM builds a model: on a device that stores
    only fp16, a float32 weight would be rounded on creation (and warned about) only to be cast right after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_model(folder: Path, platform: Platform, dtype: torch.dtype,
               tensor_parallel: TensorParallelGroup | None = None) -> GraniteForCausalLM:
    """Build the model under `platform` (so its layer overrides apply), load weights, hand it to the platform.

    With ``tensor_parallel``, the layers are this rank's shards (`layers.tensor_parallel`) and every
    checkpoint tensor is sliced to them as it is loaded."""
    config = read_config(folder)
    with set_current_platform(platform), torch.device(platform.device), default_dtype(dtype), \
            _sharded_layers(tensor_parallel, platform):
        model = MODEL_REGISTRY[config.architecture](config).to(dtype)
    current: list[tuple[Path, str, torch.Tensor]] = []
    seen: set[str] = set()

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for entry in iter_safetensors(folder):
            current[:] = [entry]
            seen.add(entry[1])
            yield entry[1], entry[2]

    try:
        model.load_weights(weights())
    except (ValueError, RuntimeError) as e:
        if isinstance(e, WeightDtypeError) and current:
            raise WeightDtypeError(f"{current[0][0]}: {e}") from e
        if isinstance(e, ModelLoadError) or not current:
            raise
        file, name, tensor = current[0]
        raise ModelLoadError(f"{file}: tensor {name!r} (shape {tuple(tensor.shape)}, {tensor.dtype}) does not fit "
                             f"{config.architecture} as config.json describes it: {e}") from e
    missing = sorted(checkpoint_names(model) - seen)
    if missing:
        raise ModelLoadError(f"the checkpoint in {folder} lacks {len(missing)} tensor(s) the model needs: "
                             f"{missing[:5]}{' ...' if len(missing) > 5 else ''}; check the safetensors files are "
                             "complete")
    model.eval()
    return platform.prepare_model(model)


@contextlib.contextmanager
def _sharded_layers(group: TensorParallelGroup | None, platform: Platform) -> Iterator[None]:
    if group is None:
        yield
        return
    from spyre_lab.engine.layers.tensor_parallel import TENSOR_PARALLEL_LAYERS

    layers = platform.sharded_layers(TENSOR_PARALLEL_LAYERS)
    with building_for(group), more_overrides(f"tensor_parallel_size={group.size}", layers):
        yield


def checkpoint_names(model: GraniteForCausalLM) -> set[str]:
    """The Hugging Face tensor names the model's parameters are loaded from: a fused parameter (qkv_proj,
    gate_up_proj) needs every one of its shards, so a checkpoint lacking only k_proj is caught too."""
    names = set()
    for name, _ in model.named_parameters():
        shards = {fragment: fused for fragment, (fused, _) in model.fused_shards.items() if fused in name}
        names.update({name.replace(fused, fragment) for fragment, fused in shards.items()} or {name})
    return names
