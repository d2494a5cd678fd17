"""DecodeTimeline on real engine runs: lanes, kernel counts and colors, batch and padding, slider, two runs."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from warning_checks import only_warnings

from spyre_lab.device.trace import Trace
from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.stats import EngineStats
from spyre_lab.viz import style
from spyre_lab.viz import timeline as timeline_module
from spyre_lab.viz.step_lanes import layer_of_kernels
from spyre_lab.viz.timeline import DecodeTimeline

torch.set_num_threads(1)
PROMPTS = ["count from 5 to 12:", "3 + 4 ="]
PARAMS = SamplingParams(temperature=0, max_tokens=3)
EXPECTED_WARNINGS = (r"spyre: aten\.embedding runs on the host CPU",)   # the embedding gather, as in torch-spyre


@pytest.fixture(scope="module")
def spyre_runs():
    """One tiny-granite LLM on the spyre platform, served once per runtime dispatch mode."""
    from spyre_lab.engine.platforms.spyre import SpyrePlatform
    from spyre_lab.runtime.launch import RuntimeOptions, set_default_options

    with only_warnings(*EXPECTED_WARNINGS):
        llm = LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=[64], batch_buckets=[1, 2]),
                  max_model_len=64, max_num_seqs=2)
        llm.warmup(show_progress=False)
        runs = {}
        for mode in ("aot_patch", "rebuild"):
            llm.stats.reset()
            previous = set_default_options(RuntimeOptions(dispatch=mode))
            try:
                llm.generate(PROMPTS, PARAMS, use_tqdm=False)
            finally:
                set_default_options(previous)
            runs[mode] = EngineStats.from_json(llm.stats.to_json())
    return llm, runs


def _step_row_bars(fig, col_axis="x4"):
    return [t for t in fig.data if t.type == "bar" and t.orientation == "h" and t.xaxis == col_axis and t.x
            and t.x[0] is not None]


def test_step_row_has_host_lanes_and_one_lane_per_layer(spyre_runs):
    llm, runs = spyre_runs
    view = DecodeTimeline(runs["aot_patch"])
    fig = view.figure
    lanes = [t.name for t in _step_row_bars(fig)]
    layers = llm.llm_engine.model_config.num_hidden_layers
    assert lanes[:3] == ["host", "program correction", "PCIe"]
    assert lanes[3:] == ["embed"] + [f"L{i}" for i in range(layers)]
    # every stream event of the step is one bar, colored by its kernel
    detail = runs["aot_patch"].details[view.step]
    kernels = sorted((e for e in detail.device_trace if e.lane.startswith("stream")), key=lambda e: e.start_us)
    bars = [(name, color) for t in _step_row_bars(fig)[3:] for name, color in
            zip((c[0] for c in t.customdata), t.marker.color)]
    assert len(bars) == len(kernels) > 0
    assert all(color == style.kernel_color(name) for name, color in bars)
    assert view.step == min(s.step for s in runs["aot_patch"].steps if s.kind == "decode")


def test_batch_row_is_real_tokens_plus_bucket_padding(spyre_runs):
    _, runs = spyre_runs
    stats = runs["aot_patch"]
    fig = DecodeTimeline(stats).figure
    batch = [t for t in fig.data if t.type == "bar" and t.xaxis == "x" and t.y]
    totals = {}
    for trace in batch:
        for step, tokens in zip(trace.x, trace.y):
            totals[step] = totals.get(step, 0) + tokens
    for row in stats.steps:
        bucket = row.token_bucket if row.kind == "prefill" else row.batch_bucket
        assert totals[row.step] == bucket, row
        assert row.padded_tokens > 0 or bucket == row.num_tokens
    requests = {t.name for t in batch} - {"bucket padding"}
    assert requests == {f"request {r.request_id}" for r in stats.requests}


def test_rebuild_dispatch_is_longer_and_shows_graph_rebuilds(spyre_runs):
    _, runs = spyre_runs
    view = DecodeTimeline({"aot_patch": runs["aot_patch"], "rebuild": runs["rebuild"]})
    fig = view.figure
    spans = {}
    for mode, stats in runs.items():
        detail = stats.details[view.step]
        spans[mode] = detail.device_trace.duration_us
    assert spans["rebuild"] > spans["aot_patch"]
    # the second column's host lane holds the rebuild events in their own color, the first has none
    host_a = next(t for t in _step_row_bars(fig, "x7") if t.name == "host")
    host_b = next(t for t in _step_row_bars(fig, "x8") if t.name == "host")
    assert style.REBUILD_COLOR in host_b.marker.color and style.REBUILD_COLOR not in host_a.marker.color
    # both step rows share one time range, so lengths compare by eye
    assert fig.layout.xaxis7.range == fig.layout.xaxis8.range
    assert fig.layout.xaxis7.range[1] >= spans["rebuild"]


def test_slider_moves_the_step_row(spyre_runs):
    _, runs = spyre_runs
    view = DecodeTimeline(runs["aot_patch"])
    first = view.step
    before = [t.name for t in view.fig_widget.data if t.type == "bar" and t.orientation == "h"]
    prefill = min(s.step for s in runs["aot_patch"].steps if s.kind == "prefill")
    view.controls["step"].value = prefill
    assert view.step == prefill != first
    title = next(a.text for a in view.fig_widget.layout.annotations if a.text.startswith(f"step {prefill}"))
    assert "prefill" in title
    assert before and f"step {prefill}" in view.caption
    # the in-place update of the live figure draws exactly what a full redraw of that step draws
    redrawn = view.figure
    live = [(t.name, t.x, t.base, tuple(t.marker.color)) for t in view.fig_widget.data if t.orientation == "h"]
    full = [(t.name, t.x, t.base, tuple(t.marker.color)) for t in redrawn.data if t.orientation == "h"]
    assert live == full
    assert all(shape.x0 == prefill for shape in view.fig_widget.layout.shapes)


def test_saved_stats_and_device_trace_replay_the_same_figure(spyre_runs, tmp_path):
    _, runs = spyre_runs
    stats = runs["aot_patch"]
    live = DecodeTimeline(stats).figure
    path = stats.save_json(tmp_path / "stats.json")
    saved = DecodeTimeline(str(path)).figure
    trace_path = tmp_path / "engine_trace.json"
    stats.to_trace(device=True).to_chrome_trace(trace_path)
    from_trace = DecodeTimeline(str(trace_path))
    bars = lambda fig: sum(len(t.x) for t in _step_row_bars(fig))
    assert bars(live) == bars(saved) == bars(from_trace.figure) > 0
    assert isinstance(Trace.from_chrome_trace(trace_path), Trace)


def test_layer_lanes_start_at_each_kv_write():
    t = Trace()
    for i, name in enumerate(["k0_embed", "aten::index_copy", "aten::index_copy", "k0_softmax", "k1_mlp",
                              "aten::index_copy", "aten::index_copy", "k2_head"]):
        t.add("stream0", name, i, 1)
    assert layer_of_kernels(list(t)) == [0, 1, 1, 1, 1, 2, 2, 2]


@pytest.fixture(scope="module")
def cpu_llm():
    llm = LLM("tiny-granite", platform="cpu", max_model_len=64, max_num_seqs=4)
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return llm


def test_cpu_platform_says_it_has_no_device_model(cpu_llm):
    fig = DecodeTimeline(cpu_llm).figure
    texts = [a.text for a in fig.layout.annotations]
    assert any("no device model" in t for t in texts)
    phases = {t.name for t in fig.data if t.type == "bar" and t.xaxis == "x3"}
    assert {f"host: {p}" for p in style.HOST_PHASE_COLORS} <= phases


def test_many_requests_aggregate_with_a_note(cpu_llm, monkeypatch):
    monkeypatch.setattr(timeline_module, "MAX_REQUEST_SERIES", 1)
    fig = DecodeTimeline(cpu_llm).figure
    names = {t.name for t in fig.data if t.type == "bar" and t.xaxis == "x"}
    assert names == {"real tokens", "bucket padding"}
    assert any("drawn as one series" in a.text for a in fig.layout.annotations)


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="no served steps"):
        DecodeTimeline(EngineStats())
    with pytest.raises(TypeError, match="LLM, EngineStats"):
        DecodeTimeline(42)
    with pytest.raises(ValueError, match="not an EngineStats JSON"):
        DecodeTimeline({"steps": []})


def test_device_row_splits_each_step_into_card_work_and_waiting_for_the_host(spyre_runs):
    """The device row is the step's modeled span: the card's kernels (solid, in the step's kind color) under the
    time the card waits for the host (hatched); when every step costs the same, the row and the caption say why."""
    _, runs = spyre_runs
    stats = runs["aot_patch"]
    view = DecodeTimeline(stats)
    fig = view.figure
    device = [t for t in fig.data if t.type == "bar" and t.yaxis == "y2"]
    solid = {x: y for t in device if t.name in ("prefill", "decode") for x, y in zip(t.x, t.y)}
    waits = {x: y for t in device if t.name == "card waits for the host" for x, y in zip(t.x, t.y)}
    assert waits and waits.keys() == solid.keys()
    for s in stats.steps:
        if s.kind.startswith("warmup"):
            continue
        trace = stats.details[s.step].device_trace
        card_ms = sum(e.dur_us for e in trace.events if e.lane.startswith("stream")) / 1e3
        assert solid[s.step] == pytest.approx(card_ms)
        assert solid[s.step] + waits[s.step] == pytest.approx(s.device_ms_modeled)
    assert all(waits[x] > solid[x] for x in solid)                # tiny-granite: the card mostly waits


def test_steps_that_cost_the_same_get_the_host_bound_reason(spyre_runs):
    """When every served step costs the same and the host bounds them, the row and the caption say why. On the
    measured machine tiny-granite's steps are host-bound but differ a little (a prefill step enqueues a few more
    launches than a decode step), so the run's own rows are made equal here; the reason still reads its traces."""
    from spyre_lab.viz.timeline import same_cost_reason

    _, runs = spyre_runs
    view = DecodeTimeline(runs["aot_patch"])
    run = view.runs[0]
    served = [r["device_ms_modeled"] for r in run.served]
    has_note = [a for a in view.figure.layout.annotations if a.name == "same cost"]
    assert bool(has_note) == (max(served) - min(served) < 5e-4 * max(served))
    equal = [dict(r, device_ms_modeled=run.served[0]["device_ms_modeled"]) for r in run.served]
    note = same_cost_reason(run, equal)
    trace = runs["aot_patch"].details[view.step].device_trace
    enqueues = sum(e.lane == "host" and e.name.startswith("enqueue") for e in trace.events)
    counts = note.split(" host enqueues")[0].rsplit(",<br>", 1)[-1].split("/")
    assert "host-bound" in note and str(enqueues) in counts and "host_launch_us" in note


def test_no_same_cost_note_when_steps_differ(spyre_runs):
    """Two dispatch modes side by side still explain each run; a run whose steps differ gets no such note."""
    from spyre_lab.viz.sources import Run
    from spyre_lab.viz.timeline import same_cost_reason

    _, runs = spyre_runs
    rows = DecodeTimeline(runs["aot_patch"]).runs[0].served
    changed = [dict(r) for r in rows]
    changed[0]["device_ms_modeled"] *= 2
    assert same_cost_reason(Run("run", changed), changed) == ""


def test_mixed_steps_get_their_own_bars_and_color():
    """A request that arrives while another decodes shares its step (kind "mixed"): the device row draws it."""
    llm = LLM("tiny-granite", platform="cpu", max_model_len=64, max_num_seqs=4)
    engine, greedy = llm.llm_engine, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request("a", [1, 5, 6, 7], greedy)
    engine.step()
    engine.add_request("b", [1, 9, 10], greedy)
    while engine.has_unfinished_requests():
        engine.step()
    mixed = [r["step"] for r in llm.stats.to_rows() if r["kind"] == "mixed"]
    assert mixed
    fig = DecodeTimeline(llm).figure
    bars = {t.name: t for t in fig.data if t.type == "bar" and t.xaxis == "x2"}
    assert list(bars["mixed"].x) == mixed and bars["mixed"].marker.color == style.STEP_KIND_COLORS["mixed"]
