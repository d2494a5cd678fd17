"""A bounded load generator and the workloads that show what prefix-aware routing buys.

* :func:`shared_prefix_workload`: ``num_prefixes`` long system prompts, each followed by many short user
  questions: the traffic of a service whose users share a few system prompts. A replica that has served a
  system prompt has its KV blocks cached; sending the next user of that prompt elsewhere recomputes them.
* :func:`unique_prefix_workload`: the control, prompts of the same lengths that share nothing.

:func:`run_load` sends a workload at Poisson arrivals (exponential gaps at ``rate`` requests/s) to one
OpenAI-compatible URL, each request streamed, at most ``max_in_flight`` at a time and for at most
``timeout_s``, while it samples every replica's ``/metrics``. It measures, on this machine's wall clock,
TTFT (send -> first token), ITL (between tokens) and end-to-end, and reads the prefix hit rate from the
replicas' own counters (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def _words(rng: random.Random, length: int) -> str:
    text = ""
    while len(text) < length:
        text += "".join(rng.choice(ALPHABET) for _ in range(rng.randint(3, 8))) + " "
    return text[:length]


def shared_prefix_workload(num_requests: int, num_prefixes: int = 8, prefix_chars: int = 96,
                           seed: int = 0) -> list[dict[str, Any]]:
    """``num_requests`` prompts: one of ``num_prefixes`` system prompts, then a short question."""
    rng = random.Random(seed)
    prefixes = [f"system {k}: {_words(rng, prefix_chars - 10)}" for k in range(num_prefixes)]
    rows = []
    for i in range(num_requests):
        group = rng.randrange(num_prefixes)
        a = rng.randint(1, 20)
        rows.append({"prompt": f"{prefixes[group]} count from {a} to {a + 6}:", "group": group, "index": i})
    return rows


def unique_prefix_workload(num_requests: int, prefix_chars: int = 96, seed: int = 1) -> list[dict[str, Any]]:
    """The control: prompts as long as the shared-prefix ones, each with a prefix of its own."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_requests):
        a = rng.randint(1, 20)
        rows.append({"prompt": f"user {i % 10}: {_words(rng, prefix_chars - 8)} count from {a} to {a + 6}:",
                     "group": -1, "index": i})
    return rows


@dataclass
class RequestRecord:
    index: int
    group: int
    sent_s: float  # since the run started (wall)
    replica: str | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    tokens: int = 0
    error: str | None = None


def scrape_counters(text: str) -> dict[str, float]:
    """The samples of one `/metrics` text by name (labels dropped: one model per replica)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


async def _one(client: httpx.AsyncClient, url: str, model: str, row: dict, max_tokens: int, started: float,
               record: RequestRecord) -> None:
    body = {"model": model, "prompt": row["prompt"], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    sent = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            # a router names the replica that served it; a request sent straight to a server was served there
            record.replica = response.headers.get("x-gateway-destination-endpoint-served", url.split("://")[-1])
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:200].decode()}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    record.error = chunk["error"]["message"]
                    return
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    now = time.perf_counter()
                    if last is None:
                        record.ttft_s = now - sent
                    else:
                        record.itl_s.append(now - last)
                    last, record.tokens = now, record.tokens + 1
        record.e2e_s = time.perf_counter() - sent
    except httpx.HTTPError as error:
        record.error = f"{type(error).__name__}: {error}"


async def _sample(client: httpx.AsyncClient, replicas: list[str], started: float, samples: list[dict],
                  interval_s: float) -> None:
    while True:
        for replica in replicas:
            try:
                values = scrape_counters((await client.get(f"{replica}/metrics", timeout=2.0)).text)
            except httpx.HTTPError:
                continue
            samples.append({"t_s": time.perf_counter() - started, "replica": replica.split("://")[-1],
                            "waiting": values.get("vllm:num_requests_waiting", 0.0),
                            "running": values.get("vllm:num_requests_running", 0.0),
                            "kv_usage": values.get("vllm:kv_cache_usage_perc", 0.0)})
        await asyncio.sleep(interval_s)


async def _counters(client: httpx.AsyncClient, replicas: list[str]) -> dict[str, dict[str, float]]:
    out = {}
    for replica in replicas:
        with_metrics = await client.get(f"{replica}/metrics", timeout=5.0)
        out[replica] = scrape_counters(with_metrics.text)
    return out


async def run_load_async(url: str, workload: list[dict], replicas: list[str], rate: float, model: str = "tiny-granite",
                         max_tokens: int = 12, max_in_flight: int = 32, timeout_s: float = 120.0, seed: int = 0,
                         sample_interval_s: float = 0.1) -> dict[str, Any]:
    """Send ``workload`` to ``url`` at Poisson arrivals; return the records, samples and counter deltas."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_in_flight)
    limits = httpx.Limits(max_connections=max_in_flight + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        before = await _counters(client, replicas)
        started = time.perf_counter()
        samples: list[dict] = []
        sampler = asyncio.ensure_future(_sample(client, replicas, started, samples, sample_interval_s))
        records, tasks = [], []

        async def gated(row: dict, record: RequestRecord) -> None:
            async with gate:
                await _one(client, url, model, row, max_tokens, started, record)

        for row in workload:
            await asyncio.sleep(rng.expovariate(rate))
            record = RequestRecord(row["index"], row["group"], time.perf_counter() - started)
            records.append(record)
            tasks.append(asyncio.ensure_future(gated(row, record)))
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        wall_s = time.perf_counter() - started
        after = await _counters(client, replicas)
    deltas = {r: {k: after[r].get(k, 0.0) - before[r].get(k, 0.0) for k in after[r]} for r in replicas}
    return {"wall_s": wall_s, "requests": [asdict(r) for r in records], "samples": samples, "counters": deltas}


def run_load(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_load_async` from synchronous code (a script); in a notebook ``await run_load_async(...)``."""
    return asyncio.run(run_load_async(*args, **kwargs))


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Throughput, TTFT/ITL p50/p99 (ms, wall), prefix hit rate and requests per replica of one run."""
    done = [r for r in run["requests"] if r["error"] is None]
    ttft = [r["ttft_s"] * 1e3 for r in done if r["ttft_s"] is not None]
    itl = [x * 1e3 for r in done for x in r["itl_s"]]
    hits = sum(c.get("vllm:prefix_cache_hits_total", 0.0) for c in run["counters"].values())
    queries = sum(c.get("vllm:prefix_cache_queries_total", 0.0) for c in run["counters"].values())
    per_replica: dict[str, int] = {}
    for r in run["requests"]:
        per_replica[r["replica"] or "none"] = per_replica.get(r["replica"] or "none", 0) + 1
    tokens = sum(r["tokens"] for r in done)
    return {"requests": len(run["requests"]), "errors": len(run["requests"]) - len(done),
            "tokens_per_s": tokens / run["wall_s"] if run["wall_s"] else 0.0,
            "ttft_p50_ms": _percentile(ttft, 50), "ttft_p99_ms": _percentile(ttft, 99),
            "itl_p50_ms": _percentile(itl, 50), "itl_p99_ms": _percentile(itl, 99),
            "prefix_hit_rate": hits / queries if queries else 0.0, "per_replica": dict(sorted(per_replica.items()))}
