"""The weightless engine step: the real spyre-platform path, timed; depth extension; re-timing a recorded step."""

import dataclasses

import pytest
from warning_checks import SPYRE_ENGINE_WARNINGS, only_warnings

from spyre_lab.device.config import SPYRE
from spyre_lab.studies.granite8b import GRANITE_3_3_8B, StepConfig, StepTiming, build_model, time_steps
from spyre_lab.studies.retime import retime_extended

SMALL = dataclasses.replace(GRANITE_3_3_8B, vocab_size=1031, hidden_size=256, intermediate_size=512,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=4)
"""Granite-shaped (GQA, tied embeddings, the multipliers, a prime vocabulary) but small, so tests stay quick."""

SMALL_BUCKETS = [("prefill", 64), ("decode", 1)]


def test_meta_model_allocates_no_weight_bytes():
    import torch

    from spyre_lab.engine.platforms.spyre import SpyrePlatform

    platform = SpyrePlatform(prefill_buckets=[64], batch_buckets=[1])
    before = torch.spyre.memory_allocated()
    model = build_model(dataclasses.replace(SMALL, num_hidden_layers=1), platform)
    weights = [p for p in model.parameters()]
    assert all(p.device.type == "spyre" for p in weights)
    assert torch.spyre.memory_allocated() > before                 # DRAM is reserved for every weight ...
    from spyre_lab.runtime.tensor import buffer_of

    assert all(buffer_of(p)._data is None for p in weights)          # ... but no byte of it was ever written
    assert model.lm_head.weight is model.model.embed_tokens.weight   # tied again after to_empty


ALL_OFF = StepConfig(compile_blocks=False, transpose_weights=False, dispatch="rebuild", overlap=False)


@pytest.fixture(scope="module")
def on_probe():
    with only_warnings(*SPYRE_ENGINE_WARNINGS):        # the spyre platform's one-time host-fallback notices
        return time_steps(StepConfig(), SMALL_BUCKETS, depth="probe", config=SMALL)


@pytest.fixture(scope="module")
def off_probe():
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        return time_steps(ALL_OFF, SMALL_BUCKETS, depth="probe", config=SMALL)


def test_probe_extension_matches_running_every_layer(on_probe):
    probe = on_probe
    full = time_steps(StepConfig(), SMALL_BUCKETS, depth="full", config=SMALL)
    for bucket in SMALL_BUCKETS:
        assert probe[bucket].extended_from == (2, 3) and full[bucket].extended_from == ()
        assert probe[bucket].step_us == pytest.approx(full[bucket].step_us, rel=1e-9)
        assert probe[bucket].device_us == pytest.approx(full[bucket].device_us, rel=1e-9)
        assert probe[bucket].launches == full[bucket].launches
        assert probe[bucket].host_us == pytest.approx(full[bucket].host_us, rel=0.05)


def test_every_mechanism_off_is_slower_and_host_bound(on_probe, off_probe):
    on, off = on_probe, off_probe
    for bucket in SMALL_BUCKETS:
        assert off[bucket].step_us > on[bucket].step_us
        assert off[bucket].launches > on[bucket].launches
        assert off[bucket].host_us > off[bucket].device_us          # single-op launches: the host is the bottleneck


def test_retime_at_the_recording_config_gives_back_the_recorded_step(off_probe):
    for t in off_probe.values():
        step, host, device = retime_extended(t.log, SPYRE, SPYRE)
        assert step == pytest.approx(t.step_us, rel=1e-9)
        assert host == pytest.approx(t.host_us, rel=1e-9)
        assert device == pytest.approx(t.device_us, rel=1e-9)
        dearer = retime_extended(t.log, SPYRE, SPYRE.replace(host_rebuild_per_node_us=80.0))[0]
        assert dearer > step                                         # serialised rebuilds sit on the critical path


def test_extend_needs_a_deeper_second_probe():
    t = StepTiming(1.0, 1.0, 1.0, 1, depth=3)
    with pytest.raises(ValueError, match="two depths"):
        StepTiming.extend(t, t, 40)


def test_granite_8b_decode_step_is_timed_end_to_end():
    # the real 8B shapes: every kernel plans (the 769-stick lm_head included), so the step has a time
    t = time_steps(StepConfig(), [("decode", 1)])[("decode", 1)]
    assert t.depth == GRANITE_3_3_8B.num_hidden_layers
    # 16 GB of fp16 weights cross DRAM once per decode step: the step cannot beat that roofline
    weight_bytes = 2 * (GRANITE_3_3_8B.vocab_size * 4096 + 40 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12800))
    assert t.device_us > weight_bytes / SPYRE.dram_bandwidth * 1e6
    assert t.step_us >= t.device_us
