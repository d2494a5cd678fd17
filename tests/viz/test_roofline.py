"""Roofline: ceilings from SpyreConfig, one marker per kernel in its kernel color, controls that move the markers."""

import json

import numpy as np
import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.viz import Roofline
from spyre_lab.viz.roofline import sfu_peak_flops
from spyre_lab.viz.style import kernel_color


@pytest.fixture(scope="module")
def program():
    def f(x, w, b):
        return torch.relu(x @ w + b).softmax(-1)

    return compile_graph(f, [torch.randn(256, 512, dtype=torch.float16), torch.randn(512, 256, dtype=torch.float16),
                             torch.randn(256, dtype=torch.float16)])


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
    assert list(markers) == [launch.name for launch in device]
    for launch in device:
        sim = launch.simulate("analytic")
        m = markers[launch.name]
        assert m.marker.color == kernel_color(launch.name)
        assert m.x[0] == pytest.approx(sim.flops / sim.dram_bytes)
        assert m.y[0] == pytest.approx(sim.flops / sim.time_us / 1e6)
        roof = min(cfg.peak_flops, cfg.dram_bandwidth * m.x[0]) / 1e12
        assert m.y[0] <= roof * 1.001                      # nothing beats the card's roof
    assert "analytic timing" in fig.layout.title.text


def test_controls_move_the_markers(program):
    view = Roofline(program)
    fw = view.fig_widget
    before = {t.meta["kernel"]: t.y[0] for t in fw.data if t.meta}
    view.controls["include_launch"].value = False
    after = {t.meta["kernel"]: t.y[0] for t in fw.data if t.meta}
    assert all(after[k] > before[k] for k in before)       # without the launch, the same FLOPs take less time
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
