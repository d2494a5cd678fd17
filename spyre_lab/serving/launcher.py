"""Starting and stopping servers: in this process (a thread, for notebooks) or as `spyre-lab serve` processes.

Every server binds 127.0.0.1 unless told otherwise, and stops by itself: after ``max_lifetime_s`` (when set),
when the process that started it exits (``exit_with_parent``), or when ``stop()`` is called. A port is chosen
by the caller (:func:`free_port`) before the server starts, so the caller knows the URL without parsing logs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Self

import httpx
import uvicorn

LOCALHOST = "127.0.0.1"
SERVE_COMMAND = "import sys; from spyre_lab.cli import main; sys.exit(main(sys.argv[1:]))"
"""What a child process runs: the `spyre-lab` command line (a program started, not a module imported)."""


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port nothing listens on right now (the OS picks it; a race with another process is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """Poll ``url``/health until it answers 200; TimeoutError (or RuntimeError if ``process`` exits) otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server process exited with code {process.returncode} before {url} was healthy")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")


def _watch(server: uvicorn.Server, max_lifetime_s: float | None, exit_with_parent: bool) -> None:
    """Ask ``server`` to exit when its lifetime is up or its parent process has gone."""
    parent, started = os.getppid(), time.monotonic()
    while not server.should_exit:
        if max_lifetime_s is not None and time.monotonic() - started > max_lifetime_s:
            server.should_exit = True
        if exit_with_parent and os.getppid() != parent:
            server.should_exit = True
        time.sleep(0.2)


def watch_in_thread(server: uvicorn.Server, max_lifetime_s: float | None, exit_with_parent: bool = False) -> None:
    """Start the thread that stops ``server`` when its lifetime is up (or its parent has gone)."""
    threading.Thread(target=_watch, args=(server, max_lifetime_s, exit_with_parent), daemon=True).start()


KEEP_ALIVE_S = 30
"""How long a server keeps an idle connection open: longer than any client here keeps one (``keepalive_expiry``
2 s), so a client never sends a request into a connection the server is closing (a ReadError with no reply)."""


def make_uvicorn(app: Any, host: str, port: int) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                         timeout_graceful_shutdown=2, timeout_keep_alive=KEEP_ALIVE_S,
                                         access_log=False))


def run_server(model: str = "tiny-granite", port: int = 8000, host: str = LOCALHOST,
               served_model_name: str | None = None, max_lifetime_s: float | None = None,
               exit_with_parent: bool = False, **engine_options: Any) -> None:
    """Serve ``model`` until stopped (what `spyre-lab serve` runs); engine options as for ``LLM``."""
    from spyre_lab.engine.llm_engine import LLMEngine
    from spyre_lab.serving.api_server import build_app

    engine = LLMEngine(model, **engine_options)
    engine.warmup(show_progress=False)
    server = make_uvicorn(build_app(engine, served_model_name or str(model)), host, port)
    watch_in_thread(server, max_lifetime_s, exit_with_parent)
    server.run()


class ServesOnThread:
    """An ASGI app served by uvicorn on a thread of this process, stopped by ``stop()`` or its lifetime.

    The class that mixes this in holds ``host``, ``port`` (0: one is chosen) and ``max_lifetime_s``, builds its app
    and calls :meth:`_serve`; it is then a context manager whose ``url`` answers ``/health``.
    """

    host: str
    port: int
    max_lifetime_s: float | None

    def _serve(self, app: Any, name: str) -> None:
        self.port = self.port or free_port(self.host)
        self._server = make_uvicorn(app, self.host, self.port)
        self._thread = threading.Thread(target=self._server.run, name=f"{name}-{self.port}", daemon=True)
        self._thread.start()
        watch_in_thread(self._server, self.max_lifetime_s)
        wait_healthy(self.url, 30)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ServerThread(ServesOnThread):
    """A server in this process, on its own thread and port: ``with ServerThread(...) as s: s.url``.

    One process can hold several (a notebook's fleet shares one copy of torch); each has its own engine,
    stepper and metrics registry."""

    model: str = "tiny-granite"
    port: int = 0
    host: str = LOCALHOST
    served_model_name: str | None = None
    max_lifetime_s: float | None = 600.0
    engine_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from spyre_lab.engine.llm_engine import LLMEngine
        from spyre_lab.serving.api_server import build_app

        self.engine = LLMEngine(self.model, **self.engine_options)
        self.engine.warmup(show_progress=False)
        self.app = build_app(self.engine, self.served_model_name or str(self.model))
        self._serve(self.app, "server")


@dataclass
class ServerProcess:
    """``spyre-lab serve`` in a child process on a port chosen here; it exits with its parent or its lifetime."""

    model: str = "tiny-granite"
    port: int = 0
    platform: str = "cpu"
    options: list[str] = field(default_factory=list)  # more `spyre-lab serve` flags, e.g. ["--max-num-seqs", "8"]
    max_lifetime_s: float = 600.0
    startup_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        command = [sys.executable, "-c", SERVE_COMMAND, "serve", self.model, "--platform", self.platform,
                   "--host", LOCALHOST, "--port", str(self.port), "--max-lifetime-s", str(self.max_lifetime_s),
                   "--exit-with-parent", *self.options]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
        try:
            wait_healthy(self.url, self.startup_timeout_s, self.process)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    def kill(self) -> None:
        """Stop it hard (SIGKILL), as a crashed replica would."""
        self.process.kill()
        self.process.wait(10)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
