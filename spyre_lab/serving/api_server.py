"""The OpenAI-compatible HTTP server: FastAPI routes over one engine (``spyre-lab serve MODEL``).

Routes: ``/health`` (200, or 503 once the engine loop has died), ``/v1/models`` (vLLM's model card, with
``max_model_len``), ``/v1/completions``, ``/v1/chat/completions`` (streamed as server-sent events or not) and
``/metrics`` (Prometheus text, :mod:`spyre_lab.serving.metrics`).

Every error is an OpenAI error object with its status: 400 for a field the engine's SamplingParams refuses (or
a body that does not parse, which FastAPI would make a 422), 404 for a model this server does not serve, 400
for a prompt longer than the model, 500 (with the engine's reason, no traceback) when the engine fails a
request. A client that disconnects aborts its requests in the engine, streamed or not, and their KV blocks
return to the free list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from spyre_lab.engine.llm_engine import LLMEngine
from spyre_lab.serving.async_engine import AsyncEngine, EngineDeadError
from spyre_lab.serving.metrics import CONTENT_TYPE, ServerMetrics
from spyre_lab.serving.openai_api import ChoiceFailed, OpenAIServing
from spyre_lab.serving.protocol import ChatCompletionRequest, CompletionRequest, InvalidRequest, error_body

logger = logging.getLogger(__name__)


def error_response(message: str, error_type: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, error_type, status, param), status_code=status)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _cancel_on_disconnect(request: Request, work: Any) -> Any:
    """Run ``work`` unless the client goes away first; then cancel it (its requests abort in the engine)."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return task.result()
    finally:
        watch.cancel()


def build_app(engine: LLMEngine, model_name: str) -> FastAPI:
    """The server's FastAPI app; it starts its own stepper thread (``app.state.async_engine``)."""
    metrics = ServerMetrics(engine, model_name)
    async_engine = AsyncEngine(engine, on_step=metrics.on_step)
    serving = OpenAIServing(async_engine, model_name)
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        async_engine.shutdown()  # the stepper stops with the server

    app = FastAPI(title="spyre_lab OpenAI-compatible server", lifespan=lifespan)
    app.state.async_engine, app.state.metrics, app.state.serving = async_engine, metrics, serving
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        first = problems[0] if problems else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
                            for e in problems)
        return error_response(message or "invalid request body", "BadRequestError", 400, field)

    @app.exception_handler(InvalidRequest)
    async def refused(_: Request, error: InvalidRequest) -> JSONResponse:
        return error_response(error.message, error.error_type, error.status, error.param)

    @app.exception_handler(EngineDeadError)
    async def dead(_: Request, error: EngineDeadError) -> JSONResponse:
        return error_response(f"the engine loop has stopped: {error}", "ServiceUnavailableError", 503)

    @app.exception_handler(ChoiceFailed)
    async def failed(_: Request, error: ChoiceFailed) -> JSONResponse:
        return error_response(str(error), "InternalServerError", 500)

    @app.get("/health")
    async def health() -> Response:
        if async_engine.dead is not None:
            return error_response(f"the engine loop has stopped: {async_engine.dead}", "ServiceUnavailableError", 503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "spyre_lab", "root": model_name,
                "parent": None, "max_model_len": engine.max_model_len,
                "permission": [{"id": f"modelperm-{model_name}", "object": "model_permission", "created": created,
                                "allow_sampling": True, "allow_logprobs": False, "allow_view": True,
                                "organization": "*", "is_blocking": False}]}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        """vLLM's endpoint of the same name: the next requests find no cached prefix (benchmarks start cold)."""
        return {"cleared_blocks": engine.reset_prefix_cache()}

    async def answer(body: CompletionRequest | ChatCompletionRequest, request: Request, kind: str) -> Response:
        if async_engine.dead is not None:
            raise EngineDeadError(async_engine.dead)
        if body.stream:
            response_id = f"{kind}-{uuid.uuid4().hex}"
            choices = serving.add_choices(body, response_id)  # refusals are still plain HTTP errors here
            return StreamingResponse(serving.stream(body, choices, response_id), media_type="text/event-stream")
        result = await _cancel_on_disconnect(request, serving.respond(body))
        return JSONResponse(result) if result is not None else Response(status_code=499)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await answer(body, request, "cmpl")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await answer(body, request, "chatcmpl")

    return app
