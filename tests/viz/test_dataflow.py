"""DataflowView: lanes, event counts, slider steps, kernel colors, LX occupancy, and controls that redraw."""

import json

import numpy as np
import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.device.kernels import matmul_kernel
from spyre_lab.device.sim import simulate
from spyre_lab.viz import DataflowView
from spyre_lab.viz.dataflow import ALL, DETAIL_LIMIT
from spyre_lab.viz.style import UNIT_COLORS, kernel_color


@pytest.fixture(scope="module")
def small():
    kernel = matmul_kernel(256, 256, 512, 2, 2, 1)
    return kernel, simulate(kernel)


@pytest.fixture(scope="module")
def program():
    def f(x, w):
        return torch.softmax(x @ w, dim=-1) * 2.0

    x, w = torch.randn(128, 256, dtype=torch.float16), torch.randn(256, 128, dtype=torch.float16)
    return compile_graph(f, [x, w])


def _segments(trace):
    x = np.asarray(trace.x, dtype=float)
    return int(np.count_nonzero(~np.isnan(x)) // 2)


def test_lanes_counts_and_unit_colors(small):
    kernel, sim = small
    view = DataflowView(sim)
    fig = view.figure
    by_name = {t.name: t for t in fig.data}
    counts = {"load": 0, "PT": 0, "store": 0}
    for e in sim.trace:
        unit = e.lane.split(".")[1]
        counts[{"pt": "PT"}.get(unit, unit)] = counts.get({"pt": "PT"}.get(unit, unit), 0) + 1
    assert len(sim.trace) <= DETAIL_LIMIT
    for name, unit in (("load", "load"), ("PT", "pt"), ("store", "store")):
        assert by_name[name].line.color == UNIT_COLORS[unit]
        assert _segments(by_name[name]) == counts[name]          # one bar per tile op
    ticks = set(fig.layout.yaxis.ticktext)
    assert {f"core {c}" for c in kernel.active_cores} <= ticks
    assert "event timing" in fig.layout.title.text and "modeled µs" in fig.layout.title.text


def test_steps_follow_the_selected_core_and_trigger_is_the_last_dep(small):
    kernel, sim = small
    view = DataflowView(sim, core=1)
    ops = kernel.programs[1].ops
    assert len(view.steps()) == len(ops)
    assert view.controls["step"].max == len(ops) - 1
    ends = {e.args["idx"]: e.end_us for e in sim.trace if e.lane.startswith("core1.")}
    checked = 0
    for step in range(len(ops)):
        f = view.firing(step)
        e = f["event"]
        deps = ops[e.args["idx"]].deps
        if deps:
            assert f["trigger"].args["idx"] in deps
            assert f["trigger"].end_us == pytest.approx(max(ends[d] for d in deps))
            assert f["trigger"].end_us <= e.start_us + 1e-9
            checked += 1
    assert checked > 10


def test_lx_occupancy_peaks_at_the_simulated_peak(small):
    kernel, sim = small
    for core in kernel.active_cores:
        view = DataflowView(sim, core=core)
        _, occ = view.lx_occupancy()
        assert occ.max() == sim.lx_peak[core]
        assert occ[-1] == 0                                      # every buffer is released by the end
        # the default step sits at the LX peak: the resident tiles add up to it
        t = view.firing()["event"].start_us
        assert sum(e.args["buffer_bytes"] for e in view.resident(t)) == sim.lx_peak[core]


def test_controls_redraw_the_figure(small):
    _, sim = small
    view = DataflowView(sim)
    fw = view.fig_widget
    cursor = [s.x0 for s in fw.layout.shapes if s.name == "cursor"]
    bar = tuple(fw.data[-1].y)
    view.controls["step"].value = 3
    assert [s.x0 for s in fw.layout.shapes if s.name == "cursor"] != cursor
    assert tuple(fw.data[-1].y) != bar
    assert "step 3 of 0–" in view.caption
    band = next(s.y0 for s in fw.layout.shapes if s.name == "band")
    view.controls["core"].value = 2
    assert fw.data[-2].name == "LX core 2"
    assert next(s.y0 for s in fw.layout.shapes if s.name == "band") > band     # the highlight moved down
    assert len(view.steps()) == view.controls["step"].max + 1
    view.controls["mode"].value = "analytic"
    assert "analytic timing" in fw.layout.title.text
    assert view.controls["step"].disabled
    pt = next(t for t in fw.data if t.name == "PT")
    assert _segments(pt) == 4                                     # one span per active core in analytic mode


def test_program_kernels_keep_their_colors_and_zoom(program):
    view = DataflowView(program)
    names = [launch.name for launch in program.device_launches]
    counts = {n: sum(1 for e in launch.simulate("event").trace) for n, launch in zip(names, program.device_launches)}
    assert view.kernel == max(counts, key=counts.get)            # opens on the kernel with the most tile ops
    view.controls["kernel"].value = ALL
    strip = {t.meta["kernel"]: t.line.color for t in view.fig_widget.data if t.meta and "kernel" in t.meta}
    assert list(strip) == names
    assert all(strip[n] == kernel_color(n) for n in names)
    fw = view.fig_widget
    full = tuple(fw.layout.xaxis.range)
    view.controls["kernel"].value = names[-1]
    zoomed = tuple(fw.layout.xaxis.range)
    assert zoomed != full and zoomed[0] >= full[0] and zoomed[1] <= full[1] + 1e-9
    assert all(view.timeline().events[i].start_us >= zoomed[0] - 1e-9 for i in view.steps())


def test_from_saved_trace(tmp_path, small):
    _, sim = small
    path = tmp_path / "trace.json"
    sim.trace.to_chrome_trace(path)
    view = DataflowView.from_json(path, core=1)
    again = DataflowView(sim, core=1)
    assert len(view.steps()) == len(again.steps())
    assert np.array_equal(view.lx_occupancy()[1], again.lx_occupancy()[1])
    assert view.controls["mode"].disabled                      # a saved trace holds one mode
    with pytest.raises(ValueError, match="no tile programs"):
        DataflowView.from_json({"launches": []})


def test_big_trace_aggregates_visibly_under_2mb():
    kernel = matmul_kernel(4096, 4096, 4096, 4, 4, 2)
    sim = simulate(kernel)
    assert len(sim.trace) > 150_000
    view = DataflowView(sim)
    fig = view.figure
    size = len(fig.to_json())
    assert size < 2_000_000, size
    notes = [a.text for a in fig.layout.annotations if a.name == "note"]
    assert any("aggregated" in n and f"{len(sim.trace):,} events" in n for n in notes)
    assert len(view.steps()) == len(kernel.programs[0].ops)
    json.loads(fig.to_json())
    assert ALL in view.controls["kernel"].options


def test_triggers_stay_inside_their_kernel(program):
    view = DataflowView(program)                                  # op indices restart in every kernel
    for name in [launch.name for launch in program.device_launches]:
        view.kernel = name
        k = next(k for k in view.timeline().kernels if k.name == name)
        for step in range(len(view.steps())):
            f = view.firing(step)
            if f["trigger"] is not None:
                assert k.start <= f["trigger"].start_us and f["trigger"].end_us <= f["event"].start_us + 1e-9


def test_figures_pass_plotlys_validators(small, program):
    import plotly.graph_objects as go

    _, sim = small
    for view in (DataflowView(sim), DataflowView(sim, mode="analytic"), DataflowView(program, kernel=ALL)):
        go.Figure(view.figure.to_plotly_json())           # built without validation for speed


def test_runtime_recording_with_host_and_pcie_lanes():
    import spyre_lab

    x = torch.randn(256, 512, dtype=torch.float16).to("spyre")
    with spyre_lab.recording() as trace:
        (torch.softmax(x, dim=-1) * 2).cpu()
    view = DataflowView(trace)
    assert view.mode == "analytic"                               # the runtime simulated its kernels analytically
    names = {t.name for t in view.figure.data}
    assert {"host", "pcie"} <= names
    kernels = [e.name for e in trace.events if e.lane.startswith("stream")]
    assert view.controls["kernel"].options[1:] == tuple(kernels)
    assert "analytic timing" in view.figure.layout.title.text


def test_the_step_the_caption_names_is_the_slider_value(small):
    """The slider counts firings from 0; the caption and the in-figure cursor note use the slider's number."""
    _, sim = small
    view = DataflowView(sim)
    fw = view.fig_widget
    slider = view.controls["step"]
    assert slider.min == 0
    for value in (0, 3, slider.max):
        slider.value = value
        assert f"step {value} of 0–{slider.max}:" in view.caption
        cursor = next(a.text for a in fw.layout.annotations if a.name == "cursor")
        assert f"step {value} of 0–{slider.max}:" in cursor


def test_lx_panel_names_the_resident_peak_and_the_planned_footprint():
    """The plan's LX peak (LXPlan.peak, what ``lx_plan.explain()`` prints) and the simulated resident peak are
    different counts: the panel shows both numbers, each with what it counts, and a note says how they differ."""
    from spyre_lab import SPYRE

    x = torch.randn(128, 1024, dtype=torch.float16)
    kernel = compile_graph(lambda t: torch.softmax(t, dim=-1), [x], cfg=SPYRE.replace(cores=1)).launches[0]
    view = DataflowView(kernel, mode="event")
    fig = view.figure
    resident = int(view.lx_occupancy()[1].max())
    planned = kernel.lx_plan.peak
    assert planned != resident                   # the case the two labels exist for
    label = next(a.text for a in fig.layout.annotations if a.name == "lx")
    assert f"resident peak {resident:,} B" in label and "simulated" in label
    assert f"planned footprint {planned:,} B" in label and "LXPlan.peak" in label
    assert f"peak {planned:,} of" in kernel.lx_plan.explain()       # the number the plan prints is the one shown
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "highest LX address" in notes and "at one moment" in notes
    assert fig.layout.yaxis3.range[1] * 1024 >= planned                # both fit on the LX axis
