"""Attention's share of the weightless 8B-shaped engine step, read off each step's trace, rule on and off."""

import dataclasses
import importlib

import pytest
from warning_checks import SPYRE_ENGINE_WARNINGS, only_warnings

from spyre_lab.studies.granite8b import GRANITE_3_3_8B, StepConfig, time_steps

R = importlib.import_module("spyre_lab.studies.reproduce")   # the module (the package exports its function)
SMALL = dataclasses.replace(GRANITE_3_3_8B, vocab_size=1031, hidden_size=256, intermediate_size=512,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=4)
BUCKETS = [("prefill", 64), ("decode", 2)]


@pytest.fixture(scope="module")
def rule_on():
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        return time_steps(StepConfig(), BUCKETS, depth="probe", config=SMALL)


@pytest.fixture(scope="module")
def rule_off():
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        return time_steps(R.ATTENTION_OFF, BUCKETS, depth="probe", config=SMALL)


def test_the_rule_off_stage_is_the_waterfall_stage_before_the_kernel():
    from spyre_lab.studies import claims as C

    stages = [step for _, step in C.WATERFALL]
    assert stages[-1] == StepConfig() and stages[-2] == R.ATTENTION_OFF


def test_compile_options_without_the_rule_switch_the_kernel_off_too():
    from spyre_lab.compiler.options import CompileOptions

    fusion = sorted(CompileOptions().without("attention").fusion)
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        (t,) = time_steps(StepConfig(), BUCKETS[1:], depth=2, config=SMALL,
                          compile_options={"fusion": fusion}).values()
    assert t.attention_launches >= 10 * 2                          # two layers of eager attention ops


def test_one_attention_launch_per_layer_with_the_rule_on(rule_on, rule_off):
    for bucket in BUCKETS:
        on, off = rule_on[bucket], rule_off[bucket]
        assert on.attention_launches == SMALL.num_hidden_layers           # extended from 2 and 3 layers to 4
        assert off.attention_launches >= 10 * SMALL.num_hidden_layers     # the eager ops, ~11 a layer
        assert 0 < on.attention_us < on.device_us and 0 < off.attention_us < off.device_us
        assert 0 < on.attention_share < off.attention_share < 1
        assert on.launches < off.launches
        # the rest of the step is the same compiled pieces either way
        assert on.device_us - on.attention_us == pytest.approx(off.device_us - off.attention_us, rel=0.02)


def test_reproduce_reports_the_share_both_ways(rule_on, rule_off):
    rows = [R._attention_row(kind, size, rule, t) for kind, size in BUCKETS
            for rule, t in (("on", rule_on[kind, size]), ("off", rule_off[kind, size]))]
    result = {"model": dataclasses.asdict(SMALL), "claims": [], "sweep": None, "wall_s": {"engine_steps": 1.0},
              "engine": {"method": "probe", "steps": [R._step_row(k, s, rule_on[k, s]) for k, s in BUCKETS],
                         "attention": rows}}
    markdown = R.to_markdown(result)
    assert "### Attention's share of the step" in markdown
    for r in rows:
        assert f"| {r['attention_rule']} | " in markdown and f"{r['share']:.1%}" in markdown
    text = R.to_text(result)
    assert text.count("attention rule on") == text.count("attention rule off") == len(BUCKETS)
