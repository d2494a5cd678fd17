"""Fixtures of the serving tests: real `spyre-lab serve` processes on ports chosen here, real clients.

Each server runs the embedded tiny-granite on the cpu platform, binds 127.0.0.1, exits when this test
process does (``--exit-with-parent``) or after its lifetime, and is stopped by the fixture.
"""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from serving_setup import MAX_MODEL_LEN, MODEL, SERVER_FLAGS

from spyre_lab.engine import LLM
from spyre_lab.serving import ServerProcess

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def server():
    with ServerProcess(MODEL, options=SERVER_FLAGS, max_lifetime_s=900) as process:
        yield process


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def offline() -> LLM:
    """The same model offline: what greedy decoding must give through the server too."""
    return LLM(MODEL, max_model_len=MAX_MODEL_LEN, max_num_seqs=16)
