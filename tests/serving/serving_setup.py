"""Constants and helpers the serving tests share (importable: conftest puts this folder on sys.path)."""

from __future__ import annotations

from spyre_lab.engine import LLM, SamplingParams

MODEL = "tiny-granite"
MAX_MODEL_LEN = 128
SERVER_FLAGS = ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16"]
PROMPTS = ["count from 5 to 12:", "letters from c to h:", "3 + 4 =", "count from 1 to 9:", "letters from a to f:",
           "count from 20 to 30:", "2 + 2 =", "letters from m to s:", "count from 7 to 15:", "5 + 3 ="]


def greedy_offline(llm: LLM, prompts: list[str], max_tokens: int) -> list[str]:
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return [o.outputs[0].text for o in outputs]
