"""AsyncEngine: one background thread steps the one engine; asyncio callers await their own request's outputs.

This is how vLLM's OpenAI server drives its engine: every HTTP request adds a request to the same engine, and a
single stepper runs ``step()`` over whatever is waiting and running, so concurrent requests share continuous
batches. The stepper hands each step's outputs to the event loop (``call_soon_threadsafe``) into the queue of
the request they belong to. A caller that stops listening (a client that disconnects) aborts its request, and
the engine frees its KV blocks at once.

If the stepper itself dies (an exception outside a request's failure handling), ``dead`` holds why: `/health`
answers 503 and every waiting caller gets an error instead of hanging.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from spyre_lab.engine.llm_engine import LLMEngine, Prompt
from spyre_lab.engine.outputs import RequestOutput
from spyre_lab.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
"""How long the idle stepper sleeps between checks when no request is queued (an add wakes it at once)."""


class EngineDeadError(RuntimeError):
    """The stepper thread stopped; the server cannot serve until restarted."""


@dataclass
class _Listener:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    added_at: float = field(default_factory=time.perf_counter)


class AsyncEngine:
    """An LLMEngine stepped by one daemon thread; ``generate`` is an async iterator of one request's outputs.

    ``on_step(outputs, engine)`` (optional) runs on the stepper thread after every step: the metrics hook.
    """

    def __init__(self, engine: LLMEngine, on_step: Callable[[list[RequestOutput], LLMEngine], None] | None = None
                 ) -> None:
        self.engine = engine
        self.on_step = on_step
        self.dead: str | None = None
        self._listeners: dict[str, _Listener] = {}
        self._listeners_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="spyre-lab-stepper", daemon=True)
        self._thread.start()

    # ---- the stepper thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.clear()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait(IDLE_WAIT_S)
                    continue
                outputs = self.engine.step()
                if self.on_step is not None:
                    self.on_step(outputs, self.engine)
                self._deliver(outputs)
        except BaseException as error:  # recorded for /health, then every caller is told
            logger.exception("the engine loop died")
            self.dead = f"{type(error).__name__}: {error}"
            with self._listeners_lock:
                listeners = list(self._listeners.values())
            for listener in listeners:
                listener.loop.call_soon_threadsafe(listener.queue.put_nowait, EngineDeadError(self.dead))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        with self._listeners_lock:
            targets = [(self._listeners.get(o.request_id), o) for o in outputs]
        for listener, output in targets:
            if listener is not None:
                listener.loop.call_soon_threadsafe(listener.queue.put_nowait, output)

    # ---- callers ---------------------------------------------------------------------------------
    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def add(self, request_id: str, prompt: Prompt, params: SamplingParams) -> asyncio.Queue:
        """Queue a request (RequestError if the engine refuses it) and return the queue its outputs arrive in."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        listener = _Listener(asyncio.get_running_loop(), asyncio.Queue())
        with self._listeners_lock:
            self._listeners[request_id] = listener
        try:
            self.engine.add_request(request_id, prompt, params)
        except BaseException:
            self._forget(request_id)
            raise
        self._wake.set()
        return listener.queue

    async def stream(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        """The outputs of a request added with :meth:`add`, the last one finished. Leaving early (the caller
        stops iterating, or its task is cancelled by a disconnect) aborts the request in the engine."""
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._forget(request_id)
            if not finished:
                self.engine.abort_request(request_id)

    def _forget(self, request_id: str) -> None:
        with self._listeners_lock:
            self._listeners.pop(request_id, None)

    @property
    def num_listeners(self) -> int:
        with self._listeners_lock:
            return len(self._listeners)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the stepper after its current step (bounded wait)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
