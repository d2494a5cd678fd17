"""LLM / LLMEngine behaviour: outputs, rejection of bad requests, abort, streaming, stops, stats, prefix cache."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from spyre_lab.engine import LLM, LLMEngine, RequestOutput, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[1, 5, 17, 33, 99], [1, 2, 3], [1, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74]]


def changed(params: SamplingParams, **fields) -> SamplingParams:
    """SamplingParams refuse bad values when built; a field changed afterwards is caught per request."""
    params = SamplingParams(**{**params.__dict__})
    for name, value in fields.items():
        setattr(params, name, value)
    return params


@pytest.fixture(scope="module")
def llm(hf_granite_dir) -> LLM:
    return LLM(hf_granite_dir, max_model_len=32, block_size=4, max_num_seqs=4)


def test_generate_returns_outputs_in_prompt_order(llm):
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    assert all(isinstance(o, RequestOutput) and o.finished for o in outs)
    assert all(len(o.outputs[0].token_ids) == 8 and o.outputs[0].finish_reason == "length" for o in outs)
    single = llm.generate(PROMPTS[2], GREEDY, use_tqdm=False)  # one token-id prompt, not a batch of ints
    assert single[0].outputs[0].token_ids == outs[2].outputs[0].token_ids


def test_bad_requests_are_reported_and_the_others_served(llm):
    outs = llm.generate(
        [PROMPTS[0], list(range(1, 40)), PROMPTS[1], [], [500], "text"],
        [GREEDY, GREEDY, changed(GREEDY, temperature=-1), GREEDY, GREEDY, GREEDY],
        use_tqdm=False,
    )
    reasons = [o.outputs[0].finish_reason for o in outs]
    assert reasons == ["length", "error", "error", "error", "error", "error"]
    assert "max_model_len is 32" in outs[1].error
    assert "temperature must be a finite number >= 0" in outs[2].error
    assert outs[2].prompt_token_ids == PROMPTS[1], "a rejected token-id request keeps its prompt"
    assert "empty" in outs[3].error
    assert "outside the vocabulary" in outs[4].error
    assert "no tokenizer.json" in outs[5].error
    assert all(o.finished for o in outs)


def test_engine_add_request_raises_value_error(hf_granite_dir):
    engine = LLMEngine(hf_granite_dir, max_model_len=32)
    with pytest.raises(ValueError, match="top_p"):
        engine.add_request("a", [1, 2], changed(GREEDY, top_p=2.0))
    engine.add_request("a", [1, 2], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", [1, 2], GREEDY)


def test_engine_step_loop_and_abort(hf_granite_dir):
    engine = LLMEngine(hf_granite_dir, max_model_len=32, block_size=4)
    engine.add_request("keep", PROMPTS[0], GREEDY)
    engine.add_request("drop", PROMPTS[1], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.add_request("never-run", PROMPTS[2], GREEDY)
    assert engine.abort_request("never-run")
    first = engine.step()
    assert next((o.request_id, o.outputs[0].finish_reason) for o in first) == ("never-run", "abort")
    engine.step()
    assert engine.abort_request("drop") and not engine.abort_request("drop")
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert finished["drop"].outputs[0].finish_reason == "abort"
    assert 0 < len(finished["drop"].outputs[0].token_ids) < 20
    assert finished["keep"].outputs[0].finish_reason == "length"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert {r.request_id for r in engine.stats.requests} == {"keep", "drop", "never-run"}


def test_stream_yields_growing_outputs(llm):
    seen = {}
    for out in llm.stream([PROMPTS[0], PROMPTS[1]], GREEDY):
        previous = seen.get(out.request_id, [])
        assert out.outputs[0].token_ids[: len(previous)] == previous
        seen[out.request_id] = out.outputs[0].token_ids
    assert sorted(map(len, seen.values())) == [8, 8]


def test_stop_token_ids_and_eos(llm):
    full = llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    stop_at = full[3]
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_at],
                                                    ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert out.token_ids == full[: full.index(stop_at) + 1]


def test_prefix_cache_reuses_blocks_without_changing_outputs(hf_granite_dir):
    shared = list(range(1, 14))
    prompts = [[*shared, 20, 21], [*shared, 30]]
    cached = LLM(hf_granite_dir, max_model_len=32, block_size=4)
    uncached = LLM(hf_granite_dir, max_model_len=32, block_size=4, enable_prefix_caching=False)
    first = cached.generate(prompts[:1], GREEDY, use_tqdm=False)
    second = cached.generate(prompts[1:], GREEDY, use_tqdm=False)
    assert second[0].metrics.num_cached_tokens == 12
    reference = uncached.generate(prompts, GREEDY, use_tqdm=False)
    assert [first[0].outputs[0].token_ids, second[0].outputs[0].token_ids] == [
        r.outputs[0].token_ids for r in reference
    ]
    assert reference[1].metrics.num_cached_tokens == 0


def test_stats_rows_and_table(hf_granite_dir):
    llm = LLM(hf_granite_dir, max_model_len=32, block_size=4)
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    rows = llm.stats.to_rows()
    assert rows[0]["kind"] == "prefill" and rows[0]["num_tokens"] == sum(map(len, PROMPTS))
    assert {r["kind"] for r in rows[1:]} == {"decode"}
    assert all(r["device_ms_modeled"] is None and r["host_ms"] > 0 for r in rows)  # cpu: nothing modeled
    requests = llm.stats.to_rows("requests")
    assert len(requests) == 3 and all(r["ttft_ms"] > 0 and r["tpot_ms"] > 0 for r in requests)
    text = str(llm.stats)
    assert "host ms measured, device ms modeled" in text and "n/a" in text
    with pytest.raises(ValueError, match="steps"):
        llm.stats.to_rows("nope")
    trace = llm.stats.to_trace()
    assert trace.lanes() == ["engine"] and len(trace) == len(rows)
    events = trace.on("engine")
    assert all(a.end_us <= b.start_us for a, b in itertools.pairwise(events))  # steps run one after another
    assert events[0].args["num_tokens"] == rows[0]["num_tokens"]


def test_static_shapes_pad_to_buckets_and_match_dynamic(hf_granite_dir, caplog):
    options = dict(max_model_len=32, block_size=4, max_num_seqs=4)
    static = LLM(hf_granite_dir, static_shapes=True, prefill_buckets=[8, 16, 32], batch_buckets=[1, 2, 4], **options)
    dynamic = LLM(hf_granite_dir, **options)
    static.warmup(show_progress=False)
    assert static.llm_engine.runner.warmed_buckets == {("prefill", b) for b in (8, 16, 32)} | {
        ("decode", b) for b in (1, 2, 4)}
    outs = static.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [
        o.outputs[0].token_ids for o in dynamic.generate(PROMPTS, GREEDY, use_tqdm=False)]
    rows = [r for r in static.stats.to_rows() if not r["kind"].startswith("warmup")]
    prefills = [r for r in rows if r["kind"] == "prefill"]
    assert len(prefills) == 3  # one request per prefill on a static-shape platform
    assert [r["token_bucket"] for r in prefills] == [8, 8, 16]
    assert all(r["padded_tokens"] == r["token_bucket"] - r["num_tokens"] for r in prefills)
    decodes = [r for r in rows if r["kind"] == "decode"]
    assert {r["batch_bucket"] for r in decodes} <= {1, 2, 4} and any(r["padded_tokens"] for r in decodes)
    assert not any("on-demand" in r["dispatch"] for r in rows)

    cold = LLM(hf_granite_dir, static_shapes=True, prefill_buckets=[8, 16, 32], batch_buckets=[1, 2, 4], **options)
    with caplog.at_level(logging.WARNING):
        cold.generate([PROMPTS[0]], GREEDY, use_tqdm=False)
    assert "was not warmed up" in caplog.text
    assert cold.stats.summary()["on_demand_steps"] == 2  # prefill bucket 8 and decode bucket 1, once each


def test_configuration_errors_name_the_fix(hf_granite_dir, tmp_path):
    with pytest.raises(ValueError, match="neither an embedded model"):
        LLM(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        LLM(hf_granite_dir, max_model_len=32, block_size=4, num_kv_blocks=4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLM(hf_granite_dir, max_model_len=10_000)
    with pytest.raises(ValueError, match="largest prefill bucket"):
        LLM(hf_granite_dir, max_model_len=32, static_shapes=True, prefill_buckets=[8, 16])
    with pytest.raises(ValueError, match="unknown dtype"):
        LLM(hf_granite_dir, dtype="float17")


def test_half_precision_runs(hf_granite_dir):
    out = LLM(hf_granite_dir, max_model_len=32, dtype=torch.bfloat16).generate(PROMPTS, GREEDY, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 8 for o in out)
