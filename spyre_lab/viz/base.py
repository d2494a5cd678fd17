"""View: the plumbing every spyre_lab view shares (static figure, widget, captions, aggregation notes, JSON input).

A view holds a little state (the values of its controls) and one method, :meth:`View.build`, that draws
the current state as a plotly ``Figure``. Everything else follows from that:

* ``view.figure`` is the static figure of the current state (HTML export, ``fig.show()``, reports);
* ``view.widget`` is one row of ipywidgets controls above a caption and a ``go.FigureWidget``; a control
  change sets the state and redraws (views may override :meth:`View.on_change` for cheaper partial updates);
* displaying the view in Jupyter shows the widget;
* ``View.from_json(path)`` builds the view from a saved trace (``Trace.to_chrome_trace``) or program
  (``Program.save_json``) file, so a learner can look at a run they did not make.

Big inputs aggregate above a documented size and say so on the figure (:func:`aggregation_note`), never
silently. Colors come from :mod:`spyre_lab.viz.style` only.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from spyre_lab.device.trace import Trace
from spyre_lab.viz.style import NEUTRAL

FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12)
NOTE_FONT = dict(size=11, color=NEUTRAL["muted"])


def load_json_source(source: str | Path | dict[str, Any]) -> Trace | dict[str, Any]:
    """A saved trace file -> :class:`Trace`; a saved program file -> its JSON dict (``Program.to_json``)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}; save one with trace.to_chrome_trace(path) or "
                                    "program.save_json(path)")
        doc = json.loads(path.read_text())
    elif isinstance(source, dict):
        doc = source
    else:
        raise TypeError(f"from_json takes a path or a dict, got {type(source).__name__}")
    if "traceEvents" in doc:
        return Trace.from_chrome_trace(doc)
    if "launches" in doc:
        return doc
    raise ValueError("this JSON is neither a trace (no 'traceEvents'; write one with Trace.to_chrome_trace) nor a "
                     "program (no 'launches'; write one with Program.save_json)")


def aggregation_note(shown: int, total: int, what: str, how: str) -> str:
    """The visible line a view prints when it draws less than everything: never aggregate silently."""
    return f"aggregated: {shown:,} {how} drawn for {total:,} {what}"


def base_layout(title: str, note: str = "", height: int = 420) -> dict[str, Any]:
    """The layout every view starts from: title, a note line under it, a light template, fixed margins."""
    layout: dict[str, Any] = dict(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
        template="plotly_white", font=FONT, height=height, margin=dict(l=70, r=20, t=70, b=50),
        showlegend=True, legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
    )
    if note:
        layout["annotations"] = [note_annotation(note)]
    return layout


def note_annotation(text: str) -> dict[str, Any]:
    """An annotation just under the title (aggregation notes, mode notes)."""
    return dict(text=html.escape(text), xref="paper", yref="paper", x=0.0, y=1.0, yanchor="bottom",
                xanchor="left", showarrow=False, font=NOTE_FONT, name="note")


def add_layout_items(fig: go.Figure, shapes: Iterable[dict] = (), annotations: Iterable[dict] = ()) -> None:
    """Add many shapes and annotations in one assignment (``add_shape`` one by one is quadratic in plotly)."""
    shapes, annotations = list(shapes), list(annotations)
    if shapes:
        fig.layout.shapes = [*fig.layout.shapes, *shapes]
    if annotations:
        fig.layout.annotations = [*fig.layout.annotations, *annotations]


@functools.lru_cache(maxsize=32)
def _subplots_json(key: str) -> str:
    from plotly.subplots import make_subplots
    from plotly.utils import PlotlyJSONEncoder

    kwargs = json.loads(key)
    layout = {k: kwargs.pop(k) for k in ("template", "height", "margin") if k in kwargs}
    fig = make_subplots(**kwargs)
    fig.update_layout(**layout)
    axes = {}
    for r, row in enumerate(fig._grid_ref):
        for c, cell in enumerate(row):
            if cell:
                keys = cell[0].layout_keys
                axes[f"{r + 1},{c + 1}"] = [k.replace("axis", "") for k in keys] if len(keys) == 2 else []
    return json.dumps({"layout": fig.to_plotly_json()["layout"], "axes": axes}, cls=PlotlyJSONEncoder)


def cached_subplots(**kwargs: Any) -> tuple[dict[str, Any], dict[tuple[int, int], tuple[str, str]]]:
    """A ``make_subplots`` layout as plain data, built once per argument set (views redraw often).

    Returns the layout dict (``template``, ``height`` and ``margin`` applied) and, per (row, col), the
    trace axis references (``("x2", "y2")``). Views add plain-dict traces and build the figure with
    ``go.Figure(..., _validate=False)``: validating thousands of values on every control change is what
    makes plotly slow, and tests check the result against plotly's validators once.
    """
    doc = json.loads(_subplots_json(json.dumps(kwargs, sort_keys=True)))
    axes = {tuple(int(v) for v in k.split(",")): tuple(v) for k, v in doc["axes"].items() if v}
    return doc["layout"], axes  # type: ignore[return-value]


class View:
    """Base class: subclasses set ``caption`` (one line: what the learner is looking at) and implement ``build``."""

    caption: str = ""
    figure_height: int = 420

    def __init__(self) -> None:
        self._fig_widget: go.FigureWidget | None = None
        self._caption_widget: W.HTML | None = None
        self._box: W.VBox | None = None
        self._controls: dict[str, W.Widget] = {}

    # --- what subclasses provide --------------------------------------------------------------
    def build(self) -> go.Figure:
        """The figure of the current state."""
        raise NotImplementedError

    def make_controls(self) -> list[W.Widget]:
        """The controls (one row above the figure); bind each with :meth:`bind`."""
        return []

    def on_change(self, name: str) -> None:
        """A control named ``name`` changed the state: redraw (override for a cheaper partial update)."""
        self.refresh()

    # --- what every view gets -----------------------------------------------------------------
    @property
    def figure(self) -> go.Figure:
        """A static plotly Figure of the current state (for HTML export and reports)."""
        return self.build()

    @property
    def controls(self) -> dict[str, W.Widget]:
        """The widget's controls by name (built with the widget), to drive the view from code or tests."""
        self.widget  # noqa: B018  (builds the controls)
        return self._controls

    @property
    def fig_widget(self) -> go.FigureWidget:
        """The live FigureWidget inside :attr:`widget`."""
        self.widget  # noqa: B018
        assert self._fig_widget is not None
        return self._fig_widget

    @property
    def widget(self) -> W.VBox:
        """Controls in one row, a one-line caption, then the figure."""
        if self._box is None:
            controls = self.make_controls()
            self._fig_widget = LoadedFigureWidget(widget_safe(self.build()))
            self._caption_widget = W.HTML(self._caption_html())
            rows: list[W.Widget] = []
            if controls:
                rows.append(W.HBox(controls, layout=W.Layout(flex_flow="row wrap", align_items="center")))
            rows += [self._caption_widget, self._fig_widget]
            self._box = W.VBox(rows)
        return self._box

    def bind(self, name: str, control: W.Widget, attr: str | None = None,
             convert: Callable[[Any], Any] | None = None) -> W.Widget:
        """Register ``control`` under ``name``; its value sets ``self.<attr>`` and calls :meth:`on_change`."""
        attr = attr or name
        self._controls[name] = control

        def changed(change: dict[str, Any]) -> None:
            value = change["new"]
            setattr(self, attr, convert(value) if convert else value)
            self.on_change(name)

        control.observe(changed, names="value")
        return control

    def refresh(self) -> None:
        """Redraw the live widget from :meth:`build` (no-op before the widget exists)."""
        if self._fig_widget is None:
            return
        sync_figure(self._fig_widget, widget_safe(self.build()))
        if self._caption_widget is not None:
            self._caption_widget.value = self._caption_html()

    def _caption_html(self) -> str:
        return f"<span style='font-size:13px;color:#333'>{html.escape(self.caption)}</span>"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}: {self.caption}"

    @classmethod
    def from_json(cls, source: str | Path | dict[str, Any], **kwargs: Any) -> View:
        """The view of a saved trace (``Trace.to_chrome_trace``) or program (``Program.save_json``) file."""
        return cls(load_json_source(source), **kwargs)  # type: ignore[call-arg]


class LoadedFigureWidget(go.FigureWidget):
    """A FigureWidget whose comm opens with its figure already in the state the browser receives first.

    plotly's FigureWidget opens its comm inside the widget constructor, while its data and layout traits are still
    empty, and sends the figure in a second message; its own ``_repr_mimebundle_`` sends it again at display, but a
    FigureWidget inside a VBox is never displayed by itself. When the browser is slow to set up the new model
    (loading the widget module under load), that second message can come before the model listens, and the plot
    draws empty for good. Opening the comm once the figure is set makes the first message complete.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)       # Widget.__init__ calls open(), which waits (see below)
        self._figure_set = True
        self.open()

    def open(self) -> None:
        if getattr(self, "_figure_set", False):
            super().open()


def widget_safe(fig: go.Figure) -> go.Figure:
    """``fig`` with its arrays as plain lists, NaN as null: what a FigureWidget can send to the browser.

    Static figures keep numpy arrays (plotly writes them as compact base64). A FigureWidget sends arrays over
    the kernel's comm instead, where a NaN (a line gap, a padding cell) is not valid JSON and float32 / int16
    buffers are not decoded, and the plot stays empty; lists with null draw the same gaps.
    """
    doc = {"data": [_plain(trace) for trace in fig._data], "layout": fig._layout}   # raw dicts: numpy intact
    return go.Figure(doc, _validate=False)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            obj = value.astype(np.float64).astype(object)
            obj[np.isnan(value)] = None
            return obj.tolist()
        return value.tolist()
    if isinstance(value, float) and value != value:
        return None
    return value


def sync_figure(target: go.FigureWidget, fig: go.Figure) -> None:
    """Make a live FigureWidget show ``fig`` in one message: traces updated in place where the types line up (a
    longer or shorter list drops or appends only the difference), replaced only when the types differ."""
    with target.batch_update():
        common = min(len(target.data), len(fig.data))
        if all(a.type == b.type for a, b in zip(target.data[:common], fig.data[:common])):
            if len(target.data) > common:
                target.data = target.data[:common]
            for old, new in zip(target.data, fig.data):
                old.update(new.to_plotly_json(), overwrite=True)
            if len(fig.data) > common:
                target.add_traces(list(fig.data[common:]))
        else:
            target.data = ()
            if fig.data:
                target.add_traces(list(fig.data))
        target.layout = fig.layout


def dropdown(options: Iterable[Any], value: Any, description: str, width: str = "auto") -> W.Dropdown:
    """A compact dropdown with its description inline."""
    return W.Dropdown(options=list(options), value=value, description=description,
                      style={"description_width": "initial"}, layout=W.Layout(width=width))


def toggle(options: Iterable[str], value: str, description: str = "") -> W.ToggleButtons:
    """Compact toggle buttons (mode switches such as event / analytic)."""
    return W.ToggleButtons(options=list(options), value=value, description=description,
                           style={"description_width": "initial", "button_width": "auto"})
