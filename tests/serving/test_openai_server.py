"""The server against the real `openai` client: the cases of vLLM's OpenAI server tests, and spyre_lab's own."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from serving_setup import MAX_MODEL_LEN, MODEL, PROMPTS, greedy_offline

from spyre_lab.serving.load import scrape_counters


def test_single_completion(client):
    completion = client.completions.create(model=MODEL, prompt="count from 1 to 99:", max_tokens=5, temperature=0)
    assert completion.id and completion.model == MODEL and len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.finish_reason == "length" and len(choice.text) >= 1
    assert completion.usage.completion_tokens == 5
    assert completion.usage.prompt_tokens == len("count from 1 to 99:") + 1  # one token per character, plus <bos>
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 5


def test_greedy_completions_equal_offline_generate(client, offline):
    served = [client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0).choices[0].text
              for p in PROMPTS[:4]]
    assert served == greedy_offline(offline, PROMPTS[:4], 24)


def test_a_batch_of_prompts_and_n_give_one_choice_each(client, offline):
    completion = client.completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=16, temperature=0, n=2)
    texts = [c.text for c in sorted(completion.choices, key=lambda c: c.index)]
    expected = greedy_offline(offline, PROMPTS[:3], 16)
    assert texts == [t for t in expected for _ in range(2)]
    prompt_tokens = sum(len(p) + 1 for p in PROMPTS[:3])
    assert completion.usage.prompt_tokens == prompt_tokens


@pytest.mark.parametrize("stop", [None, ["8 9"], " 1"])
def test_streamed_deltas_concatenate_to_the_whole_text_with_one_finish_reason(client, stop):
    args = dict(model=MODEL, prompt="count from 5 to 12:", max_tokens=30, temperature=0, stop=stop)
    whole = client.completions.create(**args).choices[0]
    chunks = list(client.completions.create(**args, stream=True))
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [whole.finish_reason]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text
    if stop:
        assert whole.finish_reason == "stop" and not any(s in whole.text for s in ([stop] if isinstance(stop, str)
                                                                                   else stop))


def test_include_usage_sends_a_last_chunk_without_choices(client):
    args = dict(model=MODEL, prompt="3 + 4 =", max_tokens=6, temperature=0)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert all(c.usage is None for c in chunks[:-1]) and all(c.choices for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == len("3 + 4 =") + 1
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens


def test_chat_stream_sends_the_role_first_and_equals_the_whole_answer(client):
    messages = [{"role": "user", "content": "count from 5 to 12:"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


def test_a_one_message_chat_is_the_same_prompt_as_a_completion(client):
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "letters from c to h:"}],
                                          max_tokens=12, temperature=0)
    plain = client.completions.create(model=MODEL, prompt="letters from c to h:", max_tokens=12, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text


@pytest.mark.parametrize(("field", "value"), [("temperature", -0.5), ("top_p", 1.5), ("top_k", -2),
                                              ("max_tokens", 0), ("n", 0), ("logprobs", 2), ("seed", "abc")])
def test_invalid_parameters_give_400_naming_the_field(client, field, value):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="3 + 4 =", extra_body={field: value})  # sent as given
    assert caught.value.status_code == 400
    assert field in caught.value.message and caught.value.body["param"] == field


def test_unknown_model_gives_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt="3 + 4 =")
    assert "no-such-model" in caught.value.message and caught.value.status_code == 404


def test_a_prompt_longer_than_the_model_gives_400_not_500(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="a" * (MAX_MODEL_LEN + 10), max_tokens=4)
    assert f"maximum context length is {MAX_MODEL_LEN}" in caught.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b" * MAX_MODEL_LEN}])


def test_a_malformed_body_is_a_400_error_object(server):
    response = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL}, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    response = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", timeout=10,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()


def test_models_lists_the_model_card_with_max_model_len(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].max_model_len == MAX_MODEL_LEN and models.data[0].owned_by
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_metrics_use_vllms_names_and_count_the_tokens(server, client):
    before = scrape_counters(httpx.get(f"{server.url}/metrics", timeout=5).text)
    client.completions.create(model=MODEL, prompt="count from 1 to 99:", max_tokens=7, temperature=0)
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    after = scrape_counters(text)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:cache_config_info", "spyre_lab:modeled_device_seconds_total"):
        assert name in after, name
    assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0) == 7
    prompt_tokens = after["vllm:prompt_tokens_total"] - before.get("vllm:prompt_tokens_total", 0)
    assert prompt_tokens == len("count from 1 to 99:") + 1
    assert after["vllm:e2e_request_latency_seconds_count"] - before["vllm:e2e_request_latency_seconds_count"] == 1
    assert 'block_size="16"' in text and "MODELED" in text


def test_the_async_client_serves_concurrent_requests_in_shared_batches(server, offline):
    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        try:
            results = await asyncio.gather(*(client.completions.create(model=MODEL, prompt=p, max_tokens=20,
                                                                       temperature=0) for p in PROMPTS))
        finally:
            await client.close()
        return [r.choices[0].text for r in results]

    assert asyncio.run(main()) == greedy_offline(offline, PROMPTS, 20)
