"""EngineStats keeps bounded windows of steps, requests and step details, and exact totals over everything.

On the starting code `steps`, `requests` and `details` (a KV snapshot per step) grew by one record per
step and per request for as long as the engine ran.
"""

from __future__ import annotations

import random

import pytest

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.stats import EngineStats

EXACT = ("steps", "prefill_steps", "decode_steps", "requests", "generated_tokens", "padded_tokens", "preemptions",
         "on_demand_steps")


def _workload(seed: int = 0):
    rng = random.Random(seed)
    return [([1] + [rng.randrange(4, 40) for _ in range(rng.randint(0, 12))],
             SamplingParams(temperature=0, max_tokens=rng.randint(1, 10), ignore_eos=True)) for _ in range(30)]


def _serve(llm: LLM, workload) -> list[dict]:
    """Serve ``workload`` a few requests at a time; every step row as it was recorded (read right after its step)."""
    engine, rows, seen = llm.llm_engine, [], -1
    for start in range(0, len(workload), 4):
        for n, (prompt, params) in enumerate(workload[start:start + 4]):
            engine.add_request(f"{start}-{n}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
            if engine.stats.steps and engine.stats.steps[-1].step != seen:
                seen = engine.stats.steps[-1].step
                rows.append(engine.stats.steps[-1])
    return rows


def test_windows_are_bounded_by_default():
    stats = LLM("tiny-granite", max_model_len=32).stats
    assert stats.max_steps and stats.max_requests and stats.max_details and stats.max_device_traces


def test_small_windows_keep_the_latest_records_and_totals_stay_exact():
    options = dict(max_model_len=32, block_size=4, max_num_seqs=4, num_kv_blocks=12)
    full = LLM("tiny-granite", **options)
    full.stats.max_steps = full.stats.max_requests = full.stats.max_details = None
    _serve(full, _workload())
    windowed = LLM("tiny-granite", **options)
    windowed.stats.max_steps, windowed.stats.max_requests, windowed.stats.max_details = 7, 5, 3
    rows = _serve(windowed, _workload())
    stats = windowed.stats

    assert len(full.stats.steps) == len(rows) > 20                   # the run is far longer than the windows
    assert len(stats.steps) == 7 and stats.steps == rows[-7:]        # the latest steps, in order
    assert [s.step for s in stats.steps] == list(range(len(rows) - 7, len(rows)))   # numbered over the whole run
    assert [r.request_id for r in stats.requests] == [r.request_id for r in full.stats.requests[-5:]]
    assert sorted(stats.details) == [s.step for s in rows[-3:]] and all(d.kv for d in stats.details.values())

    summary, reference = stats.summary(), full.stats.summary()
    assert {k: summary[k] for k in EXACT} == {k: reference[k] for k in EXACT}
    assert summary["requests"] == 30 and reference["preemptions"] > 0
    assert summary["host_s"] == sum(r.host_ms for r in rows) / 1e3  # every step's time, dropped ones included
    assert stats.totals.num_tokens == sum(r.num_tokens for r in rows) == full.stats.totals.num_tokens
    assert stats.table().count("\n") == 7 and len(stats.to_trace().events) == 7

    saved = EngineStats.from_json(stats.to_json())                    # a replay reports the run's totals
    assert saved.summary() == summary and saved.steps == stats.steps


def test_a_window_of_none_keeps_everything_and_reset_starts_over():
    llm = LLM("tiny-granite", max_model_len=32, block_size=4)
    llm.stats.max_steps = None
    rows = _serve(llm, _workload(1)[:8])
    assert llm.stats.steps == rows
    llm.stats.reset()
    assert llm.stats.summary()["steps"] == 0 and llm.stats.next_step == 0
    llm.generate([[1, 5]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert [s.step for s in llm.stats.steps] == [0, 1] and llm.stats.summary()["requests"] == 1


@pytest.mark.parametrize("window", [1, 2])
def test_lowering_a_window_later_applies_at_the_next_record(window):
    llm = LLM("tiny-granite", max_model_len=32, block_size=4)
    _serve(llm, _workload(2)[:4])
    before = llm.stats.summary()
    llm.stats.max_steps = llm.stats.max_requests = window
    llm.generate([[1, 5]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(llm.stats.steps) == window and len(llm.stats.requests) == window
    assert llm.stats.summary()["requests"] == before["requests"] + 1
