"""The shared view plumbing: static figure, widget with controls, redraw on a control change, JSON input."""

import gc
import json
import weakref

import ipywidgets as W
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from spyre_lab.device.trace import Trace
from spyre_lab.viz.base import PLOTLY_MIME, LiveFigure, View, aggregation_note, load_json_source, sync_figure


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


def _shown(view: View) -> dict:
    """The figure the browser was last sent: the one output of the view's Output widget, as it goes over the wire."""
    (output,) = view.fig_widget.output.get_state()["outputs"]
    assert output["output_type"] == "display_data"
    json.dumps(output, allow_nan=False)   # valid JSON (a NaN would not be)
    return output["data"][PLOTLY_MIME]


def _as_sent(fig: go.Figure) -> dict:
    return json.loads(pio.to_json(fig, validate=False))


class _Partial(_Line):
    """A view that updates its live figure in place, as DataflowView and DecodeTimeline do."""

    def on_change(self, name):
        with self.fig_widget.batch_update():
            self.fig_widget.data[0].y = (0, self.slope)
            self.fig_widget.layout.title.text = f"slope {self.slope}"


@pytest.mark.parametrize("cls", [_Line, _Partial])
def test_every_change_sends_the_whole_figure_the_kernel_holds(cls):
    """Each control change replaces the browser's figure with the kernel's, whole: nothing the browser must have
    applied before (a dropped or late message) can leave the plot behind its controls."""
    view = cls()
    assert _shown(view) == _as_sent(view.fig_widget)
    for slope in (3, 5, 2):
        view.controls["slope"].value = slope
        sent = _shown(view)
        assert sent == _as_sent(view.fig_widget)
        assert sent["data"][0]["y"] == [0, slope] and sent["layout"]["title"]["text"] == f"slope {slope}"
    # changes made from code outside a batch reach the browser too
    view.fig_widget.layout.title.text = "by hand"
    assert _shown(view)["layout"]["title"]["text"] == "by hand"
    view.fig_widget.add_scatter(x=[0, 1], y=[1, 0])
    view.fig_widget.data = view.fig_widget.data[1:]
    assert [t["y"] for t in _shown(view)["data"]] == [[1, 0]]


def test_the_widget_is_made_of_core_widgets_only():
    """No model in a view's widget needs a front-end module loaded per model (plotly 7's FigureWidget is an anywidget
    whose 5 MB module must load within anywidget's fixed 2 s, or the plot stops following the kernel)."""
    from spyre_lab.viz import LayoutView

    view = LayoutView((8, 100))
    seen, todo = [], [view.widget]
    while todo:
        widget = todo.pop()
        seen.append(widget)
        for name in widget.keys:
            value = getattr(widget, name)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, W.Widget) and item not in seen:
                    todo.append(item)
    modules = {w._model_module for w in seen}
    assert modules <= {"@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output"}, modules
    assert not any(hasattr(w, "_esm") for w in seen)
    assert sum(isinstance(w, W.Output) for w in seen) == 1
    bundle = view._repr_mimebundle_()
    assert bundle["text/plain"] == repr(view) and "\n" not in bundle["text/plain"][:200]
    assert _shown(view)["data"][0]["type"] == "heatmap"


def test_a_trace_updated_in_place_keeps_nothing_of_the_trace_it_replaces():
    """Syncing a live figure reuses traces of the same type; what the new trace leaves unset must be unset, not
    the old trace's hover text, legend group or marker."""
    live = LiveFigure(go.Figure(go.Scatter(name="failed", x=[1], y=[0], text=["timed out"], legendgroup="errors",
                                           marker=dict(symbol="x", size=9))))
    sync_figure(live, go.Figure(go.Scatter(name="replica 0", x=[1, 2], y=[3, 4], marker=dict(color="red"))))
    trace = live.data[0]
    assert (trace.name, trace.x, trace.y) == ("replica 0", (1, 2), (3, 4))
    assert trace.text is None and trace.legendgroup is None
    assert trace.marker.symbol is None and trace.marker.size is None and trace.marker.color == "red"
    assert live.data[0].to_plotly_json().keys() - {"uid"} == {"type", "name", "x", "y", "marker"}


class _Cycle:
    """A reference cycle: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def _heap_left_as_found():
    yield
    gc.unfreeze()
    View.freeze_heap_when_shown = True


@pytest.mark.usefixtures("_heap_left_as_found")
def test_showing_a_view_freezes_the_heap_and_the_next_view_collects_cycles_it_had_frozen():
    """A control change must not pay a full collection over the kernel's long-lived heap (torch, plotly, compiled
    programs): the heap alive when a widget comes up is frozen, and the next widget collects before freezing."""
    gc.unfreeze()
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    _Line().widget  # noqa: B018
    assert gc.get_freeze_count() > 0
    del cycle
    gc.collect()
    assert alive() is not None                  # frozen: the collector does not look at it
    _Line().widget  # noqa: B018
    assert alive() is None                      # unfrozen, collected, then the new heap frozen


@pytest.mark.usefixtures("_heap_left_as_found")
def test_a_view_can_leave_the_collector_alone():
    gc.unfreeze()
    View.freeze_heap_when_shown = False
    _Line().widget  # noqa: B018
    assert gc.get_freeze_count() == 0
