"""The shared view plumbing: static figure, widget with controls, redraw on a control change, JSON input."""

import json

import ipywidgets as W
import plotly.graph_objects as go
import pytest

from spyre_lab.device.trace import Trace
from spyre_lab.viz.base import View, aggregation_note, load_json_source


class _Line(View):
    caption = "a line whose slope is a slider"

    def __init__(self) -> None:
        super().__init__()
        self.slope = 1

    def make_controls(self):
        return [self.bind("slope", W.IntSlider(value=1, min=1, max=5))]

    def build(self) -> go.Figure:
        return go.Figure(go.Scatter(x=[0, 1], y=[0, self.slope]), layout=dict(title=f"slope {self.slope}"))


def test_figure_widget_and_control_redraw():
    view = _Line()
    assert isinstance(view.figure, go.Figure)
    assert isinstance(view.widget, W.VBox)
    assert view.fig_widget.data[0].y == (0, 1)
    view.controls["slope"].value = 3
    assert view.fig_widget.data[0].y == (0, 3)
    assert view.fig_widget.layout.title.text == "slope 3"
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_load_json_source(tmp_path):
    t = Trace()
    t.add("core0.load", "load a", 0.0, 1.0, buffer="a")
    path = tmp_path / "t.json"
    t.to_chrome_trace(path)
    back = load_json_source(path)
    assert isinstance(back, Trace) and len(back) == 1
    (tmp_path / "p.json").write_text(json.dumps({"launches": []}))
    assert load_json_source(tmp_path / "p.json") == {"launches": []}
    with pytest.raises(ValueError, match="neither a trace"):
        load_json_source({"x": 1})
    with pytest.raises(FileNotFoundError, match="save one"):
        load_json_source(tmp_path / "missing.json")


def test_aggregation_note_names_both_counts():
    note = aggregation_note(400, 200_000, "tile ops", "busy spans")
    assert note == "aggregated: 400 busy spans drawn for 200,000 tile ops"


def test_widget_gets_plain_lists_with_null_gaps():
    import numpy as np

    class _Gaps(View):
        def build(self) -> go.Figure:
            x = np.array([0.0, 1.0, np.nan, 2.0, 3.0], dtype=np.float32)
            return go.Figure(dict(data=[dict(type="scatter", x=x, y=np.arange(5, dtype=np.int16)),
                                        dict(type="heatmap", z=np.array([[1.0, np.nan]], dtype=np.float32))]),
                             _validate=False)

    view = _Gaps()
    line, heat = view.fig_widget.data
    assert line.x == (0.0, 1.0, None, 2.0, 3.0) and line.y == (0, 1, 2, 3, 4)
    assert [list(row) for row in heat.z] == [[1.0, None]]
    assert np.isnan(np.asarray(view.figure.data[0].x, dtype=float)[2])        # the static figure keeps numpy


def test_the_widget_opens_with_its_figure_in_the_first_message(monkeypatch):
    """The browser builds the plot from the comm's first state: it must hold the traces (a later update can arrive
    before a slow front end listens, and the plot stays empty)."""
    import comm

    from spyre_lab.viz import LayoutView

    opened = []
    create = comm.create_comm
    monkeypatch.setattr(comm, "create_comm", lambda **kw: opened.append(kw) or create(**kw))
    view = LayoutView((8, 100))
    view.widget  # noqa: B018
    (first,) = [o["data"]["state"] for o in opened if "_widget_data" in o["data"]["state"]]
    assert len(first["_widget_data"]) == len(view.figure.data) > 0
    assert first["_widget_layout"]["title"]["text"] == view.figure.layout.title.text
    assert view.fig_widget.comm is not None and view.fig_widget.data[0].type == "heatmap"
