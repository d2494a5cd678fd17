"""Shared fixtures: small Hugging Face checkpoints saved by transformers (a reference we did not write), and a
modeled clock at zero for every test (:func:`spyre_lab.runtime.process_state.reset`)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

# The models here are tiny: one intra-op thread is fastest, and on a shared machine a second
# thread mostly spins waiting for a busy core (measured: 25x slower under load).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def clean_clock():
    """Every test starts at modeled time zero, on the default stream of spyre:0, whatever ran before it."""
    from spyre_lab.runtime import process_state

    process_state.reset("clock")
    yield


def save_hf_model(path, architecture: str = "granite", **overrides) -> str:
    from transformers import GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM

    config_class, model_class = {
        "granite": (GraniteConfig, GraniteForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[architecture]
    options = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1,
    )
    if architecture == "granite":
        options.update(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0)
    options.update(overrides)
    torch.manual_seed(0)
    model = model_class(config_class(**options)).eval()
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def hf_granite_dir(tmp_path_factory) -> str:
    return save_hf_model(tmp_path_factory.mktemp("hf_granite"))


@pytest.fixture(scope="session")
def hf_llama_dir(tmp_path_factory) -> str:
    return save_hf_model(tmp_path_factory.mktemp("hf_llama"), "llama")
