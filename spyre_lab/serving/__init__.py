"""spyre_lab.serving: the engine behind HTTP, as vLLM serves it and llm-d routes it.

* ``spyre-lab serve MODEL``: an OpenAI-compatible server (:mod:`.api_server`) over one engine stepped by one
  background thread (:mod:`.async_engine`), with vLLM's Prometheus metrics (:mod:`.metrics`);
* ``spyre-lab route``: llm-d's endpoint picker (filters -> weighted scorers -> max-score picker) in front of
  several such servers (:mod:`.router`), itself OpenAI-compatible;
* :mod:`.load`: a bounded Poisson load generator and the workloads of ``benchmarks/bench_serving.py``.

Servers bind 127.0.0.1 and stop by themselves (:mod:`.launcher`). ``docs/serving.md`` walks through it all.
"""

from pathlib import Path

RECORDED_RUN = Path(__file__).parent / "recorded" / "fleet_run.json"
"""A fleet run under load, recorded with ``benchmarks/bench_serving.py shared-prefix --requests 60 --out``: 3 cpu
replicas, 60 requests per policy at 12/s Poisson (wall-clock times of the machine that recorded it), for
``RouterView`` in tutorial 12 without starting anything."""

_LAUNCHER = ("ServerProcess", "ServerThread", "free_port", "wait_healthy")

__all__ = ["RECORDED_RUN", *_LAUNCHER]


def __getattr__(name: str) -> object:
    """The launcher (uvicorn, FastAPI) loads on first use: ``spyre-lab``'s argument parser reads
    :mod:`.cli_args` from this package, and every command would otherwise pay for a web server it does not start."""
    if name not in _LAUNCHER:
        raise AttributeError(f"module 'spyre_lab.serving' has no attribute {name!r}")
    from spyre_lab.serving import launcher

    return getattr(launcher, name)
