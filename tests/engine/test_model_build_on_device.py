"""Building the engine's model on spyre runs nothing on the host and rounds nothing twice.

The loader builds the model under ``torch.device("spyre")``: constant tables (RoPE angles, the rotate-half
matrix) are computed on the host and moved, and parameters are created in the model's dtype, so model
construction needs no CPU fallback and stores no float32/float64 tensor as fp16.
"""

import warnings

import torch

from spyre_lab.engine import LLM
from spyre_lab.runtime.fallback import collect_fallbacks


def _rotary(llm: LLM) -> torch.nn.Module:
    return next(m for m in llm.llm_engine.model.modules() if hasattr(m, "cos_sin_cache"))


def test_building_the_model_on_spyre_needs_no_fallback_and_no_narrowing():
    with collect_fallbacks() as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = LLM("tiny-granite", platform="spyre", max_model_len=64)
    assert not log.stats, log.summary()
    narrowed = [str(w.message) for w in caught if "spyre stores" in str(w.message)]
    assert not narrowed, narrowed
    cpu = LLM("tiny-granite", dtype=torch.float16, max_model_len=64)
    spyre_table, cpu_table = _rotary(llm).cos_sin_cache, _rotary(cpu).cos_sin_cache
    assert spyre_table.device.type == "spyre" and spyre_table.dtype == torch.float16
    assert torch.equal(spyre_table.cpu(), cpu_table)        # the same rounding as the CPU platform's table
    assert torch.get_default_dtype() == torch.float32       # the loader put the default dtype back


def test_a_spyre_engine_run_gives_no_storage_warning():
    """The sampler copies the logits in the model's dtype and widens them on the host: no fp32 tensor is made on
    the card for it (an fp16 card would store it as fp16, and say so)."""
    from spyre_lab.engine import SamplingParams

    llm = LLM("tiny-granite", platform="spyre", max_model_len=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = llm.generate(["count from 5 to 12:"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert out[0].outputs[0].text == " 5 6"                 # the known continuation, 4 tokens
    narrowed = [str(w.message) for w in caught if "spyre stores" in str(w.message)]
    assert not narrowed, narrowed
