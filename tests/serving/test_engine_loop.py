"""The server in this process: when its engine loop dies, /health says 503 and requests get an error, not a hang."""

from __future__ import annotations

import httpx
import openai
import pytest
from serving_setup import MODEL

from spyre_lab.serving import ServerThread


def test_health_is_503_once_the_engine_loop_has_died():
    with ServerThread(MODEL, engine_options={"max_model_len": 64, "max_num_seqs": 2}, max_lifetime_s=60) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=20)
        assert client.completions.create(model=MODEL, prompt="3 + 4 =", max_tokens=2).choices[0].text

        def broken_hook(outputs, engine):  # a failure outside any one request's handling kills the loop
            raise RuntimeError("metrics hook broke")

        server.app.state.async_engine.on_step = broken_hook
        with pytest.raises(openai.InternalServerError, match="metrics hook broke"):
            client.completions.create(model=MODEL, prompt="3 + 4 =", max_tokens=2)
        health = httpx.get(f"{server.url}/health", timeout=5)
        assert health.status_code == 503 and "metrics hook broke" in health.json()["error"]["message"]
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model=MODEL, prompt="3 + 4 =", max_tokens=2)
        assert caught.value.status_code == 503
