"""The router in front of three real `spyre-lab serve` replicas, with the real `openai` client."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serving_setup import MODEL, PROMPTS, SERVER_FLAGS, greedy_offline

from spyre_lab.serving import ServerProcess
from spyre_lab.serving.router import SERVED_HEADER
from spyre_lab.serving.router.run import RouterThread, make_router


@pytest.fixture(scope="module")
def fleet(server):
    """Three replicas: the session's server and two more (started side by side)."""
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        more = [pool.submit(ServerProcess, MODEL, options=SERVER_FLAGS, max_lifetime_s=600) for _ in range(2)]
        replicas = [server, *(stack.enter_context(f.result(timeout=180)) for f in more)]
        yield replicas


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_identical_prefixes_stick_to_one_replica(fleet):
    with RouterThread(make_router([r.url for r in fleet], "prefix-aware"), max_lifetime_s=120) as router:
        client = _client(router.url)
        system = "system 5: you answer counting questions with the numbers only, one space between them"
        served = []
        for tail in (" count from 1 to 5:", " count from 3 to 8:", " count from 2 to 6:", " count from 4 to 9:"):
            raw = client.completions.with_raw_response.create(model=MODEL, prompt=system + tail, max_tokens=4,
                                                              temperature=0)
            served.append(raw.headers[SERVED_HEADER])
            raw.parse()
        assert len(set(served)) == 1, served
        assert served[0] in {r.url.split("://")[1] for r in fleet}
        decisions = httpx.get(f"{router.url}/router/decisions", timeout=5).json()["decisions"]
        assert [d["replica"] for d in decisions] == served


def test_round_robin_spreads_and_streams_pass_through_unchanged(fleet, offline):
    with RouterThread(make_router([r.url for r in fleet], "round-robin"), max_lifetime_s=120) as router:
        client = _client(router.url)
        names = []
        for prompt in PROMPTS[:3]:
            with client.completions.with_streaming_response.create(model=MODEL, prompt=prompt, max_tokens=16,
                                                                   temperature=0, stream=True) as response:
                names.append(response.headers[SERVED_HEADER])
        assert len(set(names)) == 3
        streamed = ["".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt=p, max_tokens=16, temperature=0, stream=True)) for p in PROMPTS[:3]]
        assert streamed == greedy_offline(offline, PROMPTS[:3], 16)
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}],
                                              max_tokens=16, temperature=0)
        assert chat.choices[0].message.content == streamed[0]
        with pytest.raises(openai.BadRequestError, match="temperature"):  # a replica's 400 passes through
            client.completions.create(model=MODEL, prompt="3 + 4 =", temperature=-1)
        assert [m.id for m in client.models.list().data] == [MODEL]


def test_killing_a_replica_fails_only_its_requests_and_the_router_stops_sending_to_it(fleet):
    victim = ServerProcess(MODEL, options=SERVER_FLAGS, max_lifetime_s=300)
    urls = [fleet[0].url, fleet[1].url, victim.url]
    victim_name = victim.url.split("://")[1]
    try:
        with RouterThread(make_router(urls, "round-robin"), max_lifetime_s=120) as router:
            client = _client(router.url)
            outcomes: list[tuple[str, str | None]] = []
            lock = threading.Lock()
            started = threading.Barrier(10)

            def one(i: int) -> None:
                served, error = None, None
                try:
                    with client.completions.with_streaming_response.create(
                            model=MODEL, prompt=PROMPTS[i % 3], max_tokens=100, temperature=0, stream=True,
                            extra_body={"ignore_eos": True}) as response:
                        served = response.headers[SERVED_HEADER]
                        started.wait(30)
                        for _ in response.parse():
                            pass
                except openai.APIError as caught:
                    error = str(caught)
                with lock:
                    outcomes.append((served, error))

            with ThreadPoolExecutor(10) as pool:
                futures = [pool.submit(one, i) for i in range(9)]
                started.wait(30)  # every stream is open: kill the third replica under its in-flight requests
                victim.kill()
                for future in futures:
                    future.result(timeout=120)
            on_victim = [o for o in outcomes if o[0] == victim_name]
            assert len(outcomes) == 9 and len(on_victim) == 3
            assert all(error is not None and victim_name in error for _, error in on_victim), on_victim
            assert all(error is None for served, error in outcomes if served != victim_name), outcomes
            after = []
            for prompt in PROMPTS[:6]:
                raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=4)
                after.append(raw.headers[SERVED_HEADER])
            assert victim_name not in after and len(set(after)) == 2
            state = {r["name"]: r for r in httpx.get(f"{router.url}/router/replicas", timeout=5).json()}
            assert state[victim_name]["healthy"] is False and state[victim_name]["last_error"]
    finally:
        victim.stop()
    deadline = time.monotonic() + 5
    while victim.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert victim.process.poll() is not None
