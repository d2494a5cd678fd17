"""Many concurrent streams on one server: continuous batching under real load, disconnects that free their blocks."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from serving_setup import MODEL, PROMPTS, greedy_offline

from spyre_lab.serving.load import scrape_counters

NUM_REQUESTS, NUM_THREADS, MAX_TOKENS = 200, 20, 24


def _finished_by_reason(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            reason = line.split('finished_reason="')[1].split('"')[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def test_200_streams_from_20_threads_with_early_disconnects(server, offline):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    before = _finished_by_reason(server.url)
    expected = dict(zip(PROMPTS, greedy_offline(offline, PROMPTS, MAX_TOKENS)))
    results: dict[int, tuple[str, str | None, int]] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        prompt = PROMPTS[i % len(PROMPTS)]
        disconnect_after = 2 if i % 5 == 0 else None  # every fifth client hangs up after two chunks
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True)
        text, reasons = "", []
        for seen, chunk in enumerate(stream, 1):
            text += chunk.choices[0].text
            if chunk.choices[0].finish_reason:
                reasons.append(chunk.choices[0].finish_reason)
            if disconnect_after is not None and seen >= disconnect_after:
                stream.close()
                break
        with lock:
            assert i not in results, f"request {i} answered twice"
            results[i] = (text, reasons[0] if reasons else None, len(reasons))

    with ThreadPoolExecutor(NUM_THREADS) as pool:
        for future in [pool.submit(one, i) for i in range(NUM_REQUESTS)]:
            future.result(timeout=180)

    assert sorted(results) == list(range(NUM_REQUESTS))
    completed = {i: r for i, r in results.items() if i % 5 != 0}
    for i, (text, _, reasons) in completed.items():
        assert reasons == 1, f"request {i}: {reasons} chunks with a finish_reason"
        assert text == expected[PROMPTS[i % len(PROMPTS)]], f"request {i}: greedy text differs from offline"
    for i in (i for i in results if i % 5 == 0):
        assert expected[PROMPTS[i % len(PROMPTS)]].startswith(results[i][0])

    deadline = time.monotonic() + 30  # the disconnected ones are aborted as the server notices them
    while True:
        values = scrape_counters(httpx.get(f"{server.url}/metrics", timeout=10).text)
        after = _finished_by_reason(server.url)
        total = sum(after.values()) - sum(before.values())
        idle = values["vllm:num_requests_running"] == 0 and values["vllm:num_requests_waiting"] == 0
        if (total == NUM_REQUESTS and idle) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert total == NUM_REQUESTS, f"{total} requests finished in the engine for {NUM_REQUESTS} sent"
    aborted = after.get("abort", 0) - before.get("abort", 0)
    assert 0 < aborted <= NUM_REQUESTS // 5, f"{aborted} aborted for {NUM_REQUESTS // 5} disconnected"
    assert values["spyre_lab:kv_blocks_used"] == 0 and values["vllm:kv_cache_usage_perc"] == 0
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    again = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0)
    assert again.choices[0].text == expected[PROMPTS[0]]


def test_a_non_streamed_request_whose_client_leaves_is_aborted(server):
    before = _finished_by_reason(server.url).get("abort", 0)
    body = {"model": MODEL, "prompt": "count from 1 to 99:", "max_tokens": 100, "temperature": 0,
            "ignore_eos": True}
    with contextlib.suppress(httpx.TimeoutException):  # the client gives up long before the 100 tokens
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.05)
    deadline = time.monotonic() + 20
    while _finished_by_reason(server.url).get("abort", 0) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _finished_by_reason(server.url).get("abort", 0) == before + 1
    values = scrape_counters(httpx.get(f"{server.url}/metrics", timeout=10).text)
    assert values["spyre_lab:kv_blocks_used"] == 0
