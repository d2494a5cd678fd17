"""spyre_lab.serving: the engine behind HTTP, as vLLM serves it and llm-d routes it.

* ``spyre-lab serve MODEL``: an OpenAI-compatible server (:mod:`.api_server`) over one engine stepped by one
  background thread (:mod:`.async_engine`), with vLLM's Prometheus metrics (:mod:`.metrics`);
* ``spyre-lab route``: llm-d's endpoint picker (filters -> weighted scorers -> max-score picker) in front of
  several such servers (:mod:`.router`), itself OpenAI-compatible;
* :mod:`.load`: a bounded Poisson load generator and the workloads of ``benchmarks/bench_serving.py``.

Servers bind 127.0.0.1 and stop by themselves (:mod:`.launcher`). ``docs/serving.md`` walks through it all.
"""

from pathlib import Path

from spyre_lab.serving.launcher import ServerProcess, ServerThread, free_port, wait_healthy

RECORDED_RUN = Path(__file__).parent / "recorded" / "fleet_run.json"
"""A fleet run under load, recorded with ``benchmarks/bench_serving.py shared-prefix --requests 60 --out``: 3 cpu
replicas, 60 requests per policy at 12/s Poisson (wall-clock times of the machine that recorded it), for
``RouterView`` in tutorial 12 without starting anything."""

__all__ = ["RECORDED_RUN", "ServerProcess", "ServerThread", "free_port", "wait_healthy"]
