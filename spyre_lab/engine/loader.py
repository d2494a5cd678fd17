"""Load a model from a local Hugging Face folder (config.json + *.safetensors). Never downloads.

`"tiny-granite"` names the small Granite model shipped inside the package (made by
scripts/make_tiny_granite.py); anything else must be a path to a folder on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from spyre_lab.engine.models.config import ModelConfig
from spyre_lab.engine.models.granite import MODEL_REGISTRY, GraniteForCausalLM
from spyre_lab.engine.platforms.base import Platform, set_current_platform

EMBEDDED_MODELS = {"tiny-granite": Path(__file__).parent / "models" / "tiny_granite"}


def resolve_model_path(model: str | Path) -> Path:
    """Folder of an embedded model name or a local path; a clear error for anything else."""
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
    return ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))


def iter_safetensors(folder: Path):
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}; only safetensors checkpoints are supported")
    for file in files:
        with safe_open(file, framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, reader.get_tensor(name)


def load_model(folder: Path, platform: Platform, dtype: torch.dtype) -> GraniteForCausalLM:
    """Build the model under `platform` (so its layer overrides apply), load weights, hand it to the platform."""
    config = read_config(folder)
    with set_current_platform(platform), torch.device(platform.device):
        model = MODEL_REGISTRY[config.architecture](config).to(dtype)
    loaded = model.load_weights(iter_safetensors(folder))
    expected = {name for name, _ in model.named_parameters()}
    missing = expected - loaded
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks {sorted(missing)[:5]}{' ...' if len(missing) > 5 else ''}")
    model.eval()
    return platform.prepare_model(model)
