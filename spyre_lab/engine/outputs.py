"""What `generate` and `step` return (vLLM's RequestOutput / CompletionOutput shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Measured host wall-clock times in milliseconds (not modeled)."""

    ttft_ms: float | None = None  # arrival -> first output token
    tpot_ms: float | None = None  # mean time per output token after the first
    e2e_ms: float | None = None  # arrival -> finished
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None = None  # the stop string or token id that ended it


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    error: str | None = None  # why a request was rejected (finish_reason "error")
    decoded_prompt: str | None = None  # what the model received: prompt_token_ids decoded, <bos>/<unk> shown

    @property
    def text(self) -> str:
        return self.outputs[0].text if self.outputs else ""
