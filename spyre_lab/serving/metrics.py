"""The server's Prometheus metrics under vLLM's names, plus spyre_lab's modeled device time under its own.

A scraper that knows vLLM (Grafana dashboards, llm-d's endpoint picker, `spyre-lab route`) reads these names
unchanged: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (a
fraction, 1.0 = every block held, as in vLLM), ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``
(prompt tokens looked up / found), the latency histograms and token counters, ``vllm:cache_config_info``.

Latencies are measured wall-clock on this machine (host time). ``spyre_lab:modeled_device_*`` is the device
model's estimate of what each step would take on the card: modeled, never measured; the cpu platform has no
device model, so these stay at zero there. Each server has its own registry, so several servers can live in
one process (a notebook's fleet).
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from spyre_lab.engine.llm_engine import LLMEngine
from spyre_lab.engine.outputs import RequestOutput

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0)
DEVICE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

disable_created_metrics()  # no `*_created` series beside each counter: vLLM's /metrics shows none either


class ServerMetrics:
    """Metrics of one engine; :meth:`on_step` is the stepper's hook, :meth:`render` the `/metrics` body."""

    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.registry = registry = CollectorRegistry()
        self._engine = engine
        self._lock = threading.Lock()
        self._tokens_seen: dict[str, int] = {}
        self._last_token_at: dict[str, float] = {}
        self._steps_seen = engine.stats.next_step
        label = {"model_name": model_name}
        scheduler, blocks = engine.scheduler, engine.block_manager

        def gauge(name: str, doc: str, read) -> None:
            Gauge(name, doc, ["model_name"], registry=registry).labels(**label).set_function(read)

        gauge("vllm:num_requests_running", "Requests in the running batch (they hold KV blocks).",
              lambda: len(scheduler.running))
        gauge("vllm:num_requests_waiting", "Requests waiting to be prefilled.", lambda: len(scheduler.waiting))
        gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks held by requests (1 = full).",
              lambda: blocks.num_used_blocks / blocks.num_blocks)
        gauge("spyre_lab:kv_blocks_used", "KV-cache blocks held by requests right now.",
              lambda: blocks.num_used_blocks)
        info = Gauge("vllm:cache_config_info", "The KV cache's configuration (labels; value 1).",
                     ["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"], registry=registry)
        info.labels(block_size=str(engine.config.block_size), num_gpu_blocks=str(blocks.num_blocks),
                    enable_prefix_caching=str(engine.config.enable_prefix_caching),
                    cache_dtype=str(engine.dtype).removeprefix("torch.")).set(1)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, ["model_name", *extra], registry=registry)

        def histogram(name: str, doc: str, buckets=LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry).labels(**label)

        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
                                      ).labels(**label)
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.").labels(**label)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of requests that started.").labels(**label)
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.").labels(**label)
        self.request_success = counter("vllm:request_success", "Requests finished, by finish reason.",
                                       ("finished_reason",))
        self._label = label
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token (measured wall time).")
        self.itl = histogram("vllm:inter_token_latency_seconds", "Between two tokens of a request (measured).")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish (measured wall time).")
        self.device_step = histogram("spyre_lab:modeled_device_time_per_step_seconds",
                                     "MODELED device time of each engine step (device model, not measured).",
                                     DEVICE_BUCKETS)
        self.device_total = counter("spyre_lab:modeled_device_seconds",
                                    "MODELED device time summed over engine steps (not measured).").labels(**label)

    def on_step(self, outputs: list[RequestOutput], engine: LLMEngine) -> None:
        """Called on the stepper thread after each step with that step's outputs."""
        now = time.perf_counter()
        with self._lock:
            for output in outputs:
                self._observe(output, now)
            stats = engine.stats
            if stats.next_step != self._steps_seen:
                self._steps_seen = stats.next_step
                modeled = stats.steps[-1].device_ms_modeled if stats.steps else None
                if modeled is not None:
                    self.device_step.observe(modeled / 1e3)
                    self.device_total.inc(modeled / 1e3)

    def _observe(self, output: RequestOutput, now: float) -> None:
        rid = output.request_id
        produced = len(output.outputs[0].token_ids) if output.outputs else 0
        before = self._tokens_seen.get(rid, 0)
        if before == 0 and produced > 0:  # the request's prefill step: its prompt met the prefix cache
            prompt = len(output.prompt_token_ids)
            self.prompt_tokens.inc(prompt)
            self.prefix_queries.inc(prompt)
            self.prefix_hits.inc(output.metrics.num_cached_tokens)
            if output.metrics.ttft_ms is not None:
                self.ttft.observe(output.metrics.ttft_ms / 1e3)
        elif produced > before and rid in self._last_token_at:
            self.itl.observe((now - self._last_token_at[rid]) / max(1, produced - before))
        if produced > before:
            self.generation_tokens.inc(produced - before)
            self._last_token_at[rid] = now
        self._tokens_seen[rid] = produced
        if output.finished:
            self._tokens_seen.pop(rid, None)
            self._last_token_at.pop(rid, None)
            reason = output.outputs[0].finish_reason if output.outputs else "error"
            self.request_success.labels(**self._label, finished_reason=str(reason)).inc()
            if output.metrics.e2e_ms is not None:
                self.e2e.observe(output.metrics.e2e_ms / 1e3)

    def render(self) -> bytes:
        return generate_latest(self.registry)
