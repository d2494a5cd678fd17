"""Guard-free dispatch (`platforms.dispatch`): a warmed bucket runs Dynamo's code for it without its guards.

What must hold: each bucket's first call goes through Dynamo (it compiles) and every later call of a warmed
bucket does not; the direct call gives bit for bit the hidden states the Dynamo call gives on the same inputs;
and a whole run is the same with ``skip_guards`` on and off: tokens, step kinds and modeled step times.
"""

from __future__ import annotations

import pytest
import torch
from warning_checks import SPYRE_ENGINE_WARNINGS, only_warnings

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.platforms.spyre import SpyrePlatform

PROMPTS = ["count from 5 to 12:", "3 + 4 =", "letters from c to h:"]


def run(skip_guards: bool) -> tuple[LLM, list[list[int]]]:
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        # buckets no other test's compile counts rely on (compiled programs are cached process-wide)
        platform = SpyrePlatform(prefill_buckets=[24], batch_buckets=[1, 3], skip_guards=skip_guards)
        llm = LLM("tiny-granite", platform=platform, max_model_len=24, max_num_seqs=3, block_size=4,
                  num_kv_blocks=16)
        llm.warmup(show_progress=False)
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def runs() -> dict[bool, tuple[LLM, list[list[int]]]]:
    return {flag: run(flag) for flag in (True, False)}


@pytest.fixture(scope="module")
def after_the_run(runs) -> tuple[list, dict[str, int], dict[bool, list[dict]]]:
    """The guard-free run's buckets and dispatch counts, and both runs' step rows, as the runs left them: taken
    before any test uses the engines again (test_direct_call_equals_dynamo_call adds a call and steps of its own)."""
    dispatch = runs[True][0].llm_engine.platform.dispatch
    return list(dispatch.buckets), dict(dispatch.calls), {flag: llm.stats.to_rows() for flag, (llm, _) in runs.items()}


def test_warmed_buckets_skip_dynamo(runs, after_the_run) -> None:
    buckets, calls, rows = after_the_run
    served = sum(1 for r in rows[True] if not r["kind"].startswith("warmup"))
    assert buckets == [("decode", 1), ("decode", 3), ("prefill", 24)]
    assert calls == {"dynamo": 3, "direct": served}                # the three warmup compiles, then none
    assert runs[False][0].llm_engine.platform.dispatch is None


def test_same_run_with_and_without_guards(runs, after_the_run) -> None:
    (_, tokens_on), (_, tokens_off) = runs[True], runs[False]
    assert tokens_on == tokens_off
    rows_on, rows_off = after_the_run[2][True], after_the_run[2][False]
    assert [r["kind"] for r in rows_on] == [r["kind"] for r in rows_off]
    # modeled times: equal up to the rounding of where on the process's modeled clock each step ran
    assert [r["device_ms_modeled"] for r in rows_on] == pytest.approx([r["device_ms_modeled"] for r in rows_off],
                                                                      rel=1e-12)


@torch.inference_mode()
def test_direct_call_equals_dynamo_call(runs, after_the_run) -> None:
    llm, _ = runs[True]
    engine = llm.llm_engine
    platform, runner = engine.platform, engine.runner
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        engine.add_request("x", PROMPTS[0], SamplingParams(temperature=0, max_tokens=4))
        engine.step()                                                  # prefill: the request now decodes
    scheduled = engine.scheduler.schedule()                           # a decode step: the slot for its next token
    inputs = runner.prepare_decode(scheduled.seqs)
    args = (inputs.input_ids, inputs.positions, inputs.meta)
    with platform.device_timer("decode", 1, 1):
        before = dict(platform.dispatch.calls)
        direct = platform.run_model(engine.model, *args).cpu()
        through_dynamo = engine.model(*args).cpu()
    assert platform.dispatch.calls["direct"] == before["direct"] + 1
    assert torch.equal(direct, through_dynamo)
    engine.abort_request("x")
    list(engine.run_to_completion())
