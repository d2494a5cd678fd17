"""The OpenAI request bodies the server accepts (pydantic models, as vLLM's protocol.py) and their SamplingParams.

Field names and defaults follow the OpenAI API and vLLM's extensions (``top_k``, ``ignore_eos``,
``stop_token_ids``). Values are checked by the engine's own :class:`SamplingParams` so the server refuses
exactly what ``LLM.generate`` refuses, with the same message; :class:`InvalidRequest` carries the field name
for the error object's ``param``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spyre_lab.engine.sampling_params import SamplingParams

MAX_N = 8
"""The most choices one request may ask for (each is one engine request)."""


class InvalidRequest(ValueError):
    """A request the server refuses: HTTP ``status``, OpenAI error ``type`` and the offending ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 error_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.error_type = message, param, status, error_type


def error_body(message: str, error_type: str, status: int, param: str | None = None) -> dict[str, Any]:
    """An OpenAI error object (what ``openai.APIStatusError.body`` holds)."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields (user, presence_penalty=0...) are ignored

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Any = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams for this body; InvalidRequest naming the field otherwise."""
        if not 1 <= self.n <= MAX_N:
            raise InvalidRequest(f"n must be in [1, {MAX_N}], got {self.n}", "n")
        if self.logprobs not in (None, False, 0):
            raise InvalidRequest("logprobs is not supported: the spyre_lab engine returns sampled tokens only; "
                                 "leave logprobs unset", "logprobs")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options is only allowed when stream is true", "stream_options")
        values: dict[str, Any] = dict(max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
                                      stop=self.stop, stop_token_ids=self.stop_token_ids or [],
                                      ignore_eos=self.ignore_eos, seed=self.seed)
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        try:
            return SamplingParams(**values)
        except ValueError as error:
            message = str(error)
            raise InvalidRequest(message, message.split()[0] if message else None) from None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(...)
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """One prompt or a batch of them, as the OpenAI API allows."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise InvalidRequest("prompt must not be empty", "prompt")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: only text parts exist for this model
            return " ".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)


def render_chat(messages: list[ChatMessage]) -> str:
    """The chat template of the embedded model: the messages' texts joined by one space.

    The embedded tiny model was trained on plain task prompts ("count from 5 to 12:") and its character
    vocabulary has no newline or angle bracket, so role markers would only be <unk> noise to it; its template
    is the conversation's text in order, and a one-message chat gives the same tokens as that prompt sent to
    /v1/completions. The router's prefix index renders chats the same way (:func:`chat_text`)."""
    return " ".join(m.text() for m in messages if m.text())


def chat_text(body: dict[str, Any]) -> str:
    """The text of a raw chat body (the router hashes it without validating the whole request)."""
    return render_chat([ChatMessage(**m) for m in body.get("messages") or [] if isinstance(m, dict)
                        and m.get("role") in ("system", "user", "assistant", "developer")])
