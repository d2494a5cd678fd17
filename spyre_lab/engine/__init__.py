"""spyre_lab.engine: a small vLLM-style inference engine on portable layers.

    from spyre_lab.engine import LLM, SamplingParams
    llm = LLM("tiny-granite")
    llm.generate(["count from 3 to 9:"], SamplingParams(temperature=0, max_tokens=32))
"""

from spyre_lab.engine.config import EngineConfig
from spyre_lab.engine.llm import LLM
from spyre_lab.engine.llm_engine import LLMEngine
from spyre_lab.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from spyre_lab.engine.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestMetrics", "RequestOutput", "SamplingParams"]
