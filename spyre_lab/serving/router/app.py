"""The router: an OpenAI-compatible front door that schedules each request onto one replica and proxies it.

``POST /v1/completions`` and ``/v1/chat/completions`` are scheduled by the endpoint picker
(:mod:`.scheduler`) and forwarded unchanged; a stream passes through chunk by chunk. Every response carries
``x-gateway-destination-endpoint-served: host:port``, the replica that served it (llm-d's header name).
A background task scrapes each replica's ``/metrics`` (vLLM's names) every ``scrape_interval_s``: the queue
and KV-cache numbers the scorers read.

A replica that refuses a connection or breaks a stream is marked unhealthy at once (the healthy filter stops
sending to it) and each request that was on it gets an OpenAI error object naming the replica: a 502 before
the response started, an error event inside a stream that had. A later successful scrape brings it back.
``GET /router/decisions`` lists where each request went and why (the recorded run of a ``RouterView``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client.parser import text_string_to_metric_families

from spyre_lab.serving.protocol import chat_text, error_body
from spyre_lab.serving.router.scheduler import NoReplicaError, Replica, RoutingRequest, SchedulingProfile

SERVED_HEADER = "x-gateway-destination-endpoint-served"
SCRAPED = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
           "vllm:kv_cache_usage_perc": "kv_usage"}


def prompt_text(path: str, body: dict[str, Any]) -> str:
    """The text the prefix scorer hashes: the prompt, or the chat rendered as the server's template does."""
    if path.endswith("chat/completions"):
        return chat_text(body)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str | list) else prompt
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


class Router:
    """Replicas, one scheduling profile, a scraper and an HTTP client; :meth:`app` is its FastAPI app."""

    def __init__(self, replica_urls: list[str], profile: SchedulingProfile, model: str, policy: str = "custom",
                 scrape_interval_s: float = 0.05, request_timeout_s: float = 120.0) -> None:
        if not replica_urls:
            raise ValueError("the router needs at least one replica URL")
        self.replicas = [Replica(url.rstrip("/")) for url in replica_urls]
        self.profile, self.model, self.policy = profile, model, policy
        self.scrape_interval_s, self.request_timeout_s = scrape_interval_s, request_timeout_s
        self.decisions: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self._client: httpx.AsyncClient | None = None

    # ---- replica state ------------------------------------------------------------------------------
    async def scrape(self, replica: Replica) -> None:
        assert self._client is not None
        try:
            response = await self._client.get(f"{replica.url}/metrics", timeout=2.0)
            response.raise_for_status()
        except httpx.HTTPError as error:
            replica.healthy, replica.last_error = False, f"/metrics: {type(error).__name__} {error}".strip()
            return
        for family in text_string_to_metric_families(response.text):
            field = SCRAPED.get(family.name)
            if field is not None and family.samples:
                setattr(replica, field, float(family.samples[0].value))
        replica.healthy, replica.last_error, replica.scraped_at = True, None, time.perf_counter()

    async def _scrape_forever(self) -> None:
        while True:
            await asyncio.gather(*(self.scrape(r) for r in self.replicas))
            await asyncio.sleep(self.scrape_interval_s)

    def _failed(self, replica: Replica, error: BaseException) -> JSONResponse:
        replica.healthy, replica.last_error = False, f"{type(error).__name__}: {error}"
        message = (f"replica {replica.name} failed while serving this request ({replica.last_error}); the router "
                   "stops sending to it until its /metrics answers again")
        return JSONResponse(error_body(message, "BadGatewayError", 502), status_code=502,
                            headers={SERVED_HEADER: replica.name})

    # ---- requests -----------------------------------------------------------------------------------
    def schedule(self, path: str, body: dict[str, Any]) -> Replica:
        request = RoutingRequest(str(body.get("model") or self.model), prompt_text(path, body))
        decision = self.profile.schedule(request, self.replicas)
        self.decisions.append({
            "t_s": time.perf_counter() - self.started, "replica": decision.chosen.name, "policy": self.policy,
            "prompt_head": request.text[:48], "totals": {Replica(u).name: v for u, v in decision.totals.items()},
            "state": {r.name: {"waiting": r.waiting, "running": r.running, "kv_usage": r.kv_usage,
                               "healthy": r.healthy} for r in self.replicas}})
        return decision.chosen

    async def forward(self, path: str, request: Request) -> Response:
        assert self._client is not None
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as error:
            return JSONResponse(error_body(f"the body is not JSON: {error}", "BadRequestError", 400), 400)
        if not isinstance(body, dict):
            return JSONResponse(error_body("the body must be a JSON object", "BadRequestError", 400), 400)
        try:
            replica = self.schedule(path, body)
        except NoReplicaError as error:
            return JSONResponse(error_body(str(error), "ServiceUnavailableError", 503), 503)
        url = f"{replica.url}{path}"
        if not body.get("stream"):
            try:
                upstream = await self._client.post(url, json=body, timeout=self.request_timeout_s)
            except httpx.HTTPError as error:
                return self._failed(replica, error)
            return Response(upstream.content, upstream.status_code, media_type="application/json",
                            headers={SERVED_HEADER: replica.name})
        upstream_request = self._client.build_request("POST", url, json=body, timeout=self.request_timeout_s)
        try:
            upstream = await self._client.send(upstream_request, stream=True)
        except httpx.HTTPError as error:
            return self._failed(replica, error)
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            return Response(content, upstream.status_code, media_type="application/json",
                            headers={SERVED_HEADER: replica.name})
        return StreamingResponse(self._pass_through(replica, upstream), media_type="text/event-stream",
                                 headers={SERVED_HEADER: replica.name})

    async def _pass_through(self, replica: Replica, upstream: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.HTTPError as error:  # the replica went away mid-stream: say so, in the stream
            replica.healthy, replica.last_error = False, f"{type(error).__name__}: {error}"
            message = f"replica {replica.name} broke the stream ({replica.last_error})"
            yield f"data: {json.dumps(error_body(message, 'BadGatewayError', 502))}\n\ndata: [DONE]\n\n".encode()
        finally:
            await upstream.aclose()

    # ---- the app ------------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=2.0)
            self._client = httpx.AsyncClient(limits=limits)
            await asyncio.gather(*(self.scrape(r) for r in self.replicas))
            scraper = asyncio.ensure_future(self._scrape_forever())
            yield
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
            await self._client.aclose()

        app = FastAPI(title="spyre_lab router (llm-d endpoint picker)", lifespan=lifespan)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await self.forward("/v1/completions", request)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self.forward("/v1/chat/completions", request)

        @app.get("/health")
        async def health() -> Response:
            ok = any(r.healthy for r in self.replicas)
            return Response(status_code=200 if ok else 503)

        @app.get("/v1/models")
        async def models() -> Response:
            for replica in (r for r in self.replicas if r.healthy):
                with contextlib.suppress(httpx.HTTPError):
                    upstream = await self._client.get(f"{replica.url}/v1/models", timeout=5.0)  # type: ignore[union-attr]
                    return Response(upstream.content, upstream.status_code, media_type="application/json")
            return JSONResponse(error_body("no replica is healthy", "ServiceUnavailableError", 503), 503)

        @app.get("/router/decisions")
        async def decisions() -> dict:
            return {"policy": self.policy, "replicas": [r.name for r in self.replicas], "decisions": self.decisions}

        @app.get("/router/replicas")
        async def replicas() -> list[dict]:
            return [{"name": r.name, "healthy": r.healthy, "waiting": r.waiting, "running": r.running,
                     "kv_usage": r.kv_usage, "last_error": r.last_error} for r in self.replicas]

        return app
