"""Roofline: ceilings from SpyreConfig, one marker per kernel in its kernel color, controls that move the markers."""

import itertools
import json

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.device.config import DATASHEET, MEASURED
from spyre_lab.viz import Roofline
from spyre_lab.viz.roofline import sfu_peak_flops
from spyre_lab.viz.style import kernel_color


def _roofline_graph(x, w, b):
    return torch.relu(x @ w + b).softmax(-1)


def _inputs():
    return [torch.randn(256, 512, dtype=torch.float16), torch.randn(512, 256, dtype=torch.float16),
            torch.randn(256, dtype=torch.float16)]


@pytest.fixture(scope="module")
def program():
    return compile_graph(_roofline_graph, _inputs())


def _markers(fig):
    return {t.meta["kernel"]: t for t in fig.data if t.meta and "kernel" in t.meta}


def test_ceilings_and_markers(program):
    view = Roofline(program)
    fig = view.figure
    cfg = program.cfg
    pt, sfu, dram = fig.data[:3]
    assert max(pt.y) == pytest.approx(cfg.peak_flops / 1e12)
    assert max(sfu.y) == pytest.approx(sfu_peak_flops(cfg) / 1e12)
    assert np.allclose(np.asarray(dram.y) / np.asarray(dram.x), cfg.dram_bandwidth / 1e12)
    markers = _markers(fig)
    device = [launch for launch in program.device_launches if launch.simulate("analytic").flops]
    assert sorted(markers) == sorted(launch.name for launch in device)
    legend = sorted(markers.values(), key=lambda t: t.legendrank)
    assert [t.meta["kernel"] for t in legend] == [launch.name for launch in device]    # legend in kernel order
    for launch in device:
        sim = launch.simulate("analytic")
        m = markers[launch.name]
        assert m.marker.color == kernel_color(launch.name)
        assert m.x[0] == pytest.approx(sim.flops / sim.dram_bytes)
        assert m.y[0] == pytest.approx(sim.flops / sim.time_us / 1e6)
        roof = min(cfg.peak_flops, cfg.dram_bandwidth * m.x[0]) / 1e12
        assert m.y[0] <= roof * 1.001                      # nothing beats the card's roof
    assert "analytic timing" in fig.layout.title.text
    go.Figure(fig.to_plotly_json())                       # built unvalidated; plotly's validators agree


def test_controls_move_the_markers():
    program = compile_graph(_roofline_graph, _inputs(), cfg=MEASURED)
    assert program.cfg.kernel_launch_cycles == 0  # the measured card has no fixed device cost per kernel
    view = Roofline(program)
    fw = view.fig_widget
    before = {t.meta["kernel"]: t.y[0] for t in fw.data if t.meta}
    view.controls["include_launch"].value = False
    after = {t.meta["kernel"]: t.y[0] for t in fw.data if t.meta}
    assert after == pytest.approx(before)
    datasheet_view = Roofline(compile_graph(_roofline_graph, _inputs(), cfg=DATASHEET))
    with_launch = {t.meta["kernel"]: t.y[0] for t in datasheet_view.fig_widget.data if t.meta}
    datasheet_view.controls["include_launch"].value = False
    without = {t.meta["kernel"]: t.y[0] for t in datasheet_view.fig_widget.data if t.meta}
    assert all(without[k] > with_launch[k] for k in with_launch)  # without its 4 us launch, the same FLOPs: less time
    view.controls["include_launch"].value = False
    assert "launch overhead excluded" in fw.layout.title.text
    view.controls["mode"].value = "event"
    event = {t.meta["kernel"]: t.y[0] for t in fw.data if t.meta}
    assert "event timing" in fw.layout.title.text and event != after


def test_saved_program(tmp_path, program):
    path = tmp_path / "program.json"
    program.save_json(str(path))
    saved = Roofline.from_json(path)
    live = Roofline(program)
    a, b = _markers(saved.figure), _markers(live.figure)
    assert list(a) == list(b)
    assert all(a[k].x[0] == pytest.approx(b[k].x[0]) and a[k].y[0] == pytest.approx(b[k].y[0]) for k in a)
    assert saved.controls["mode"].disabled
    assert saved.cfg == program.cfg
    with pytest.raises(TypeError, match="Program"):
        Roofline(json.loads(path.read_text())["launches"])


@pytest.fixture(scope="module")
def unfused_softmax():
    """Five one-op kernels of a softmax on one core: amax and sum, sub and div sit at the same points."""
    from spyre_lab import SPYRE
    from spyre_lab.compiler.options import CompileOptions

    x = torch.randn(256, 1024, dtype=torch.float16)
    return compile_graph(lambda t: torch.softmax(t, dim=-1), [x], CompileOptions(fusion=frozenset()),
                         cfg=SPYRE.replace(cores=1))


def _figure_pixels(fig, x, y, width):
    """A data point (log axes) in figure pixels at ``width``, from the figure's own ranges and margins."""
    m = fig.layout.margin
    (x0, x1), (y0, y1) = fig.layout.xaxis.range, fig.layout.yaxis.range
    w, h = width - m.l - m.r, fig.layout.height - m.t - m.b
    return m.l + (np.log10(x) - x0) / (x1 - x0) * w, m.t + (y1 - np.log10(y)) / (y1 - y0) * h


@pytest.mark.parametrize("mode", ["analytic", "event"])
def test_kernel_labels_never_overlap_and_every_kernel_is_visible(unfused_softmax, mode):
    """At 700 px no two kernel labels overlap, none covers a marker, each kernel has its own label, and kernels at
    one point are concentric rings (the one drawn later is smaller), so five kernels look like five."""
    from spyre_lab.viz.labels import text_box

    view = Roofline(unfused_softmax, mode=mode)
    fig = view.figure
    markers = [t for t in fig.data if t.meta and "kernel" in t.meta]
    assert len(markers) == 5
    centres = {t.meta["kernel"]: _figure_pixels(fig, t.x[0], t.y[0], 700) for t in markers}
    same = [(a, b) for a, b in itertools.combinations(centres, 2) if np.hypot(*np.subtract(centres[a], centres[b])) < 3]
    assert same                                                    # the case this is about: coincident kernels
    draw = [t.meta["kernel"] for t in markers]
    size = {t.meta["kernel"]: t.marker.size for t in markers}
    for a, b in same:
        first, later = sorted((a, b), key=draw.index)
        assert size[first] >= size[later] + 8                      # the later one sits inside as a ring
    labels = [a for a in fig.layout.annotations if a.name == "kernel label"]
    assert sorted(a.text for a in labels) == sorted(f"k{i}" for i in range(5))
    boxes = []
    for a in labels:
        px, py = _figure_pixels(fig, 10 ** a.x, 10 ** a.y, 700)
        boxes.append(text_box(px + a.ax, py + a.ay, a.text, a.font.size))
    for b1, b2 in itertools.combinations(boxes, 2):
        assert b1.overlaps(b2) == 0, (b1, b2)
    for box in boxes:
        for name, (cx, cy) in centres.items():
            r = size[name] / 2
            assert not (box.x0 < cx + r and box.x1 > cx - r and box.y0 < cy + r and box.y1 > cy - r), name
    m = fig.layout.margin
    assert all(b.x0 >= m.l and b.x1 <= 700 - m.r and b.y0 >= m.t for b in boxes)   # inside the plot area
