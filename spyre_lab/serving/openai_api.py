"""The two OpenAI endpoints: turn a request body into engine requests, and engine outputs into OpenAI responses.

Non-streamed, a response holds every choice's whole text. Streamed, it is server-sent events in the shape the
``openai`` client reads: ``data: {json}\\n\\n`` frames, a chat stream's first delta per choice carrying
``role``, exactly one chunk per choice with a ``finish_reason``, ``data: [DONE]`` last, and, when
``stream_options.include_usage`` asks, a final chunk with ``choices: []`` and the usage. The deltas of a choice
concatenate to its non-streamed text: while a request has stop strings, the last characters that could still
begin one are held back until the engine decides (it cuts a stop string out of the text when it finishes).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from spyre_lab.engine.llm_engine import RequestError
from spyre_lab.engine.outputs import RequestOutput
from spyre_lab.engine.sampling_params import SamplingParams
from spyre_lab.serving.async_engine import AsyncEngine, EngineDeadError
from spyre_lab.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidRequest,
    error_body,
    render_chat,
)

DEFAULT_COMPLETION_MAX_TOKENS = 16
"""The OpenAI completions default; chat completions default to whatever fits in max_model_len."""


@dataclass
class Choice:
    """One engine request behind one choice of a response."""

    index: int
    prompt_index: int
    request_id: str
    prompt_tokens: int
    params: SamplingParams
    queue: asyncio.Queue


class ChoiceFailed(RuntimeError):
    """A choice's engine request ended with finish_reason "error" (the engine's reason in the message)."""


class OpenAIServing:
    """Completions and chat completions over one :class:`AsyncEngine` serving ``model_name``."""

    def __init__(self, engine: AsyncEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_model_len = engine.engine.max_model_len

    # ---- request -> engine requests ---------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise InvalidRequest(f"The model `{model}` does not exist. This server serves `{self.model_name}`.",
                                 "model", 404, "NotFoundError")

    def _token_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        tokenizer = self.engine.engine.tokenizer
        if tokenizer is None:
            raise InvalidRequest("this model has no tokenizer; send prompts as lists of token ids", "prompt")
        return tokenizer.encode(prompt)

    def add_choices(self, body: CompletionRequest | ChatCompletionRequest, prefix: str) -> list[Choice]:
        """Add one engine request per prompt and per ``n``; InvalidRequest (nothing left running) if any fails."""
        self.check_model(body.model)
        prompts = body.prompts() if isinstance(body, CompletionRequest) else [render_chat(body.messages)]
        choices: list[Choice] = []
        try:
            for prompt_index, prompt in enumerate(prompts):
                token_ids = self._token_ids(prompt)
                room = self.max_model_len - len(token_ids)
                default = DEFAULT_COMPLETION_MAX_TOKENS if isinstance(body, CompletionRequest) else max(1, room)
                params = body.sampling_params(default)
                if room < 1 or params.max_tokens > room:
                    raise InvalidRequest(
                        f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                        f"{len(token_ids) + params.max_tokens} tokens ({len(token_ids)} in the prompt, "
                        f"{params.max_tokens} in the completion). Please reduce the length of the prompt or "
                        "max_tokens.", "messages" if isinstance(body, ChatCompletionRequest) else "prompt")
                for _ in range(body.n):
                    request_id = self.engine.new_request_id(prefix)
                    queue = self.engine.add(request_id, token_ids, params)
                    choices.append(Choice(len(choices), prompt_index, request_id, len(token_ids), params, queue))
        except RequestError as error:
            self.abort(choices)
            raise InvalidRequest(str(error), "prompt") from None
        except BaseException:
            self.abort(choices)
            raise
        return choices

    def abort(self, choices: list[Choice]) -> None:
        for choice in choices:
            self.engine.engine.abort_request(choice.request_id)

    async def merged(self, choices: list[Choice]) -> AsyncIterator[tuple[Choice, RequestOutput]]:
        """Every choice's outputs as they come; leaving early cancels the readers, which abort their requests."""
        inbox: asyncio.Queue = asyncio.Queue()

        async def read(choice: Choice) -> None:
            try:
                async for output in self.engine.stream(choice.request_id, choice.queue):
                    await inbox.put((choice, output))
            except Exception as error:  # handed to the consumer; a cancel (a disconnect) just ends
                await inbox.put((choice, error))

        readers = [asyncio.ensure_future(read(c)) for c in choices]
        remaining = len(choices)
        try:
            while remaining:
                choice, item = await inbox.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    remaining -= 1
                yield choice, item
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    # ---- whole responses ----------------------------------------------------------------------------
    async def respond(self, body: CompletionRequest | ChatCompletionRequest) -> dict:
        chat = isinstance(body, ChatCompletionRequest)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        choices = self.add_choices(body, response_id)
        finals: dict[int, RequestOutput] = {}
        async for choice, output in self.merged(choices):
            if output.finished:
                finals[choice.index] = output
        rows = []
        for choice in choices:
            output = finals[choice.index]
            completion = output.outputs[0]
            if completion.finish_reason == "error":
                raise ChoiceFailed(output.error or "the engine failed this request")
            row = {"index": choice.index, "logprobs": None, "finish_reason": completion.finish_reason,
                   "stop_reason": completion.stop_reason}
            row.update({"message": {"role": "assistant", "content": completion.text}} if chat
                       else {"text": completion.text})
            rows.append(row)
        return {"id": response_id, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name, "choices": rows,
                "usage": _usage(choices, finals)}

    # ---- streams ------------------------------------------------------------------------------------
    async def stream(self, body: CompletionRequest | ChatCompletionRequest, choices: list[Choice],
                     response_id: str) -> AsyncIterator[str]:
        """The SSE frames of a streamed response (``choices`` already added, so errors before it were HTTP)."""
        chat = isinstance(body, ChatCompletionRequest)
        created, obj = int(time.time()), "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        sent = {c.index: 0 for c in choices}
        finals: dict[int, RequestOutput] = {}

        def frame(rows: list[dict], usage: dict | None = None) -> str:
            chunk = {"id": response_id, "object": obj, "created": created, "model": self.model_name, "choices": rows}
            if include_usage:
                chunk["usage"] = usage
            return f"data: {json.dumps(chunk)}\n\n"

        if chat:  # the first delta of each choice names the role
            yield frame([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for c in choices])
        try:
            async for choice, output in self.merged(choices):
                completion = output.outputs[0]
                if completion.finish_reason == "error":
                    raise ChoiceFailed(output.error or "the engine failed this request")
                text = completion.text if output.finished else _safe_text(completion.text, choice.params)
                delta, sent[choice.index] = text[sent[choice.index]:], max(sent[choice.index], len(text))
                if not delta and not output.finished:
                    continue
                row = {"index": choice.index, "logprobs": None,
                       "finish_reason": completion.finish_reason if output.finished else None}
                row.update({"delta": {"content": delta}} if chat else {"text": delta})
                if output.finished:
                    finals[choice.index] = output
                    row["stop_reason"] = completion.stop_reason
                yield frame([row])
            if include_usage:
                yield frame([], _usage(choices, finals))
        except (ChoiceFailed, EngineDeadError) as error:
            yield f"data: {json.dumps(error_body(str(error), 'InternalServerError', 500))}\n\n"
        yield "data: [DONE]\n\n"


def _safe_text(text: str, params: SamplingParams) -> str:
    """The part of a running request's text no stop string can still cut (the engine cuts at finish)."""
    if not params.stop:
        return text
    hold = max(len(s) for s in params.stop) - 1
    return text[: max(0, len(text) - hold)]


def _usage(choices: list[Choice], finals: dict[int, RequestOutput]) -> dict:
    """Token counts of a response: each prompt once (whatever its ``n``), every choice's completion."""
    prompt = sum({c.prompt_index: c.prompt_tokens for c in choices}.values())
    completion = sum(len(o.outputs[0].token_ids) for o in finals.values())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
