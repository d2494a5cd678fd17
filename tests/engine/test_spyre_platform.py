"""The spyre platform: tiny-granite on torch.device("spyre") in fp16, static shapes, modeled step time."""

from __future__ import annotations

import warnings

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.platforms.base import available_platforms, resolve_platform

try:
    from spyre_lab.engine.platforms.spyre import SpyrePlatform
except ImportError as error:  # the runtime layer is optional for the engine
    pytest.skip(f"spyre runtime unavailable: {error}", allow_module_level=True)


def test_spyre_platform_is_discovered():
    assert "spyre" in available_platforms()
    assert isinstance(resolve_platform("spyre"), SpyrePlatform)


def test_tiny_granite_runs_on_the_spyre_device():
    params = SamplingParams(temperature=0, max_tokens=4)
    options = dict(max_model_len=16, max_num_seqs=1, prefill_buckets=[16], batch_buckets=[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU-fallback notices for ops the runtime has no kernel for
        llm = LLM("tiny-granite", platform="spyre", **options)
        assert next(llm.llm_engine.model.parameters()).device.type == "spyre"
        assert llm.llm_engine.dtype is torch.float16
        llm.warmup(show_progress=False)
        out = llm.generate(["3 + 4 ="], params, use_tqdm=False)[0]
    reference = LLM("tiny-granite", dtype=torch.float16, max_model_len=16).generate(["3 + 4 ="], params,
                                                                                     use_tqdm=False)[0]
    assert out.outputs[0].text == reference.outputs[0].text == " 7"
    rows = [r for r in llm.stats.to_rows() if not r["kind"].startswith("warmup")]
    assert all(r["device_ms_modeled"] > 0 and r["dispatch"] == "eager-ops" for r in rows)
    assert [r["token_bucket"] for r in rows if r["kind"] == "prefill"] == [16]
