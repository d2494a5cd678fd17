"""LayoutView: host cells colored by where they land on the device, padding counted, one element followed."""

import json

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from spyre_lab.device.layout import StickLayout, stickify
from spyre_lab.viz import LayoutView
from spyre_lab.viz.layout import ELEMENT_LIMIT
from spyre_lab.viz.style import FOLLOW_COLOR, PADDING_COLOR


def _panel(fig, name):
    return next(t for t in fig.data if t.meta and t.meta.get("panel") == name)


@pytest.mark.parametrize("shape, order", [((5, 10, 150), None), ((5, 10, 150), (1, 0, 2)), ((300,), None),
                                          ((3, 70), (1, 0))])
def test_every_host_element_is_colored_by_its_device_stick(shape, order):
    view = LayoutView(shape, dim_order=order)
    lay = StickLayout.default(shape, torch.float16, order)
    fig = view.figure
    host = np.asarray(_panel(fig, "host").z, dtype=float).ravel()
    for flat in range(0, int(np.prod(shape)), 7):
        index = np.unravel_index(flat, shape)
        stick = lay.device_offset(lay.device_coords(index)) // lay.elems_per_stick
        assert host[flat] == stick
    pad = np.asarray(_panel(fig, "padding").z, dtype=float)
    assert np.count_nonzero(~np.isnan(pad)) == lay.device_numel - lay.host_numel
    assert _panel(fig, "padding").colorscale[0][1] == PADDING_COLOR
    go.Figure(fig.to_plotly_json())


def test_followed_element_matches_stickify():
    torch.manual_seed(0)
    t = torch.randn(6, 100, dtype=torch.float16)
    view = LayoutView(t, element=164)                                  # row 1, col 64: second stick of row 1
    f = view.follow()
    lay = StickLayout.default(t.shape, t.dtype)
    assert f["index"] == (1, 64) and f["coords"] == lay.device_coords((1, 64))
    assert f["device_value"] == stickify(t, lay)[f["coords"]].item() == t[1, 64].item()
    fig = view.figure
    dev = _panel(fig, "follow device")
    assert (dev.x[0], dev.y[0]) == (f["lane"], f["stick"]) and dev.marker.color == FOLLOW_COLOR
    assert (_panel(fig, "follow host").x[0], _panel(fig, "follow host").y[0]) == (64, 1)
    assert f"byte {f['byte']:,}" in next(a.text for a in fig.layout.annotations if a.name == "follow")
    assert view.controls["dtype"].disabled                            # a tensor's dtype is its own


def test_controls_change_the_layout():
    view = LayoutView((5, 10, 150))
    fw = view.fig_widget
    assert np.asarray(_panel(fw, "device").z).shape[1] == 64
    view.controls["dtype"].value = "float32"
    assert np.asarray(_panel(fw, "device").z).shape[1] == 32           # a 128 B stick holds 32 fp32 values
    view.controls["dim_order"].value = "1,0,2"
    assert view.layout.device_size == (5, 5, 10, 32)
    assert "dim_order (1,0,2)" in fw.layout.title.text
    before = (_panel(fw, "follow device").x[0], _panel(fw, "follow device").y[0])
    view.controls["element"].value = 77
    assert (_panel(fw, "follow device").x[0], _panel(fw, "follow device").y[0]) != before
    assert view.follow()["index"] == (0, 0, 77)


def test_big_tensor_aggregates_to_sticks_visibly():
    view = LayoutView((4096, 4096))
    fig = view.figure
    assert ELEMENT_LIMIT < 4096 * 4096
    notes = [a.text for a in fig.layout.annotations if a.name == "note"]
    assert any(n.startswith("aggregated: each cell is one stick") for n in notes)
    assert len(fig.to_json()) < 2_000_000
    with pytest.raises(TypeError, match="tensor or a shape"):
        LayoutView("4096x4096")


def _strict(value):
    """JSON as the widget channel carries it: no NaN / Infinity (arrays as lists)."""
    return json.dumps(value, allow_nan=False, default=lambda o: o.tolist() if hasattr(o, "tolist") else repr(o))


@pytest.mark.parametrize("shape", [(5, 10, 150), (4096, 4096)])
def test_the_widget_sends_gaps_as_null_never_nan(shape):
    view = LayoutView(shape)
    static = view.figure
    assert np.isnan(np.asarray(_panel(static, "padding").z, dtype=float)).any()     # the gaps are there to send
    fw = view.fig_widget
    _strict(fw.output.get_state())                                                # the first display
    _strict([t.to_plotly_json() for t in fw.data])
    sent = []
    fw.output._send = lambda msg, buffers=None: sent.append(msg)                  # every later message
    orders = view.controls["dim_order"].options
    view.controls["dtype"].value = "float32"
    view.controls["element"].value = 5
    view.controls["dim_order"].value = orders[-1]
    assert any("outputs" in m["state"] for m in sent)
    for m in sent:
        _strict(m)
    pad = np.asarray(_panel(fw, "padding").z, dtype=object)
    assert (pad == None).any() and not any(isinstance(v, float) and v != v for v in pad.ravel())  # noqa: E711
    assert view.figure.layout.title.text == fw.layout.title.text


def test_big_tensor_offers_only_orders_it_can_draw():
    view = LayoutView((4096, 4096))
    for order in view.controls["dim_order"].options:
        view.controls["dim_order"].value = order                  # every offered order draws
        assert "Stick layout" in view.fig_widget.layout.title.text
