"""Shared fixtures for the studies: a small Granite-shaped config so engine tests stay quick."""

import dataclasses
import warnings

import pytest

from spyre_lab.studies.granite8b import GRANITE_3_3_8B

SMALL = dataclasses.replace(GRANITE_3_3_8B, vocab_size=1031, hidden_size=256, intermediate_size=512,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=4)
"""Granite-shaped (GQA, tied embeddings, the multipliers, a prime vocabulary) but small."""

SMALL_BUCKETS = [("prefill", 64), ("decode", 1)]


@pytest.fixture(autouse=True)
def _quiet_fallbacks():
    # the engine's documented host fallbacks (embedding, rotary index) warn once per process; not under test here
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(CPU fallback|runs on the host).*")
        yield
