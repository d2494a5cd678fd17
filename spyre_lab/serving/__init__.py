"""spyre_lab.serving: the engine behind HTTP, as vLLM serves it and llm-d routes it.

* ``spyre-lab serve MODEL``: an OpenAI-compatible server (:mod:`.api_server`) over one engine stepped by one
  background thread (:mod:`.async_engine`), with vLLM's Prometheus metrics (:mod:`.metrics`);
* ``spyre-lab route``: llm-d's endpoint picker (filters -> weighted scorers -> max-score picker) in front of
  several such servers (:mod:`.router`), itself OpenAI-compatible;
* :mod:`.load`: a bounded Poisson load generator and the workloads of ``benchmarks/bench_serving.py``.

Servers bind 127.0.0.1 and stop by themselves (:mod:`.launcher`). ``docs/serving.md`` walks through it all.
"""

from spyre_lab.serving.launcher import ServerProcess, ServerThread, free_port, wait_healthy

__all__ = ["ServerProcess", "ServerThread", "free_port", "wait_healthy"]
