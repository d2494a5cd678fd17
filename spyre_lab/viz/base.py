"""View: the plumbing every spyre_lab view shares (static figure, widget, captions, aggregation notes, JSON input).

A view holds a little state (the values of its controls) and one method, :meth:`View.build`, that draws
the current state as a plotly ``Figure``. Everything else follows from that:

* ``view.figure`` is the static figure of the current state (HTML export, ``fig.show()``, reports);
* ``view.widget`` is one row of ipywidgets controls above a caption and the figure (:class:`LiveFigure`, drawn
  by plotly's JupyterLab renderer inside an ``ipywidgets.Output``); a control change sets the state and redraws
  (views may override :meth:`View.on_change` for cheaper partial updates);
* displaying the view in Jupyter shows the widget;
* ``View.from_json(path)`` builds the view from a saved trace (``Trace.to_chrome_trace``) or program
  (``Program.save_json``) file, so a learner can look at a run they did not make.

Big inputs aggregate above a documented size and say so on the figure (:func:`aggregation_note`), never
silently. Colors come from :mod:`spyre_lab.viz.style` only.
"""

from __future__ import annotations

import contextlib
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
from spyre_lab.heap import freeze_startup_heap
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
    freeze_heap_when_shown = True
    """Freeze the heap once the widget is up (:func:`spyre_lab.heap.freeze_startup_heap`): the kernel's torch,
    plotly and compiled programs then stay out of the full collections that would otherwise land on a control
    change (0.1-0.7 s each under a WhatIf card change). Set False to leave the collector alone."""

    def __init__(self) -> None:
        self._fig_widget: LiveFigure | None = None
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

    def below_figure(self) -> list[W.Widget]:
        """Widgets shown under the figure (none by default; a view that adds some keeps them current itself)."""
        return []

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
    def fig_widget(self) -> LiveFigure:
        """The figure the live :attr:`widget` shows (a plotly Figure; its ``data`` and ``layout`` are what the browser
        draws)."""
        self.widget  # noqa: B018
        assert self._fig_widget is not None
        return self._fig_widget

    @property
    def widget(self) -> W.VBox:
        """Controls in one row, a one-line caption, then the figure."""
        if self._box is None:
            controls = self.make_controls()
            self._fig_widget = LiveFigure(widget_safe(self.build()))
            self._caption_widget = W.HTML(self._caption_html())
            rows: list[W.Widget] = []
            if controls:
                rows.append(W.HBox(controls, layout=W.Layout(flex_flow="row wrap", align_items="center")))
            rows += [self._caption_widget, self._fig_widget.output, *self.below_figure()]
            self._box = W.VBox(rows)
            self._box.add_class(VIEW_CLASS)
            if self.freeze_heap_when_shown:
                freeze_startup_heap()
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
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = repr(self)   # short and stable (a VBox repr would print every child's state)
        return bundle

    def __repr__(self) -> str:
        return f"{type(self).__name__}: {self.caption}"

    @classmethod
    def from_json(cls, source: str | Path | dict[str, Any], **kwargs: Any) -> View:
        """The view of a saved trace (``Trace.to_chrome_trace``) or program (``Program.save_json``) file."""
        return cls(load_json_source(source), **kwargs)  # type: ignore[call-arg]


PLOTLY_MIME = "application/vnd.plotly.v1+json"
VIEW_CLASS = "spyre-lab-view"
FIGURE_CLASS = "spyre-lab-figure"


class LiveFigure(go.Figure):
    """The figure a view's widget shows, and the one route by which the browser gets it.

    A view draws into an ``ipywidgets.Output`` (:attr:`output`) holding one ``application/vnd.plotly.v1+json``
    output, which JupyterLab draws with plotly's mime renderer. Every change to this figure (a property set, a
    trace added, the end of a :meth:`batch_update`) replaces that output with the whole new figure, so what the
    browser draws is always this figure, and ``view.fig_widget.data`` / ``.layout`` read what it shows.

    Why not plotly's ``go.FigureWidget``: in plotly 7 it is an anywidget, and each one ships plotly.js (5 MB) as its
    own ES module, which the browser imports per model. anywidget's front end gives that set-up a fixed 2 s
    (``AbortSignal.timeout(2000)`` in its ``Runtime``); when a loaded machine misses it, the model's ``ready``
    promise rejects and every later message from the kernel is dropped (``_handle_comm_msg`` awaits ``ready``), so
    the plot keeps its first drawing while the caption, an ordinary widget, follows the controls. An ``Output`` is a
    core ipywidgets model: no module to load, no deadline, its messages applied in order however slow the browser.
    """

    def __init__(self, figure: go.Figure) -> None:
        self._output: W.Output | None = None
        self._held = 0
        super().__init__(figure)
        height = self.layout.height or 420
        self._output = W.Output(layout=W.Layout(min_height=f"{int(height)}px"))   # no jump while it redraws
        self._output.add_class(FIGURE_CLASS)
        self._send()

    @property
    def output(self) -> W.Output:
        """The widget the browser draws this figure in (a child of the view's widget)."""
        assert self._output is not None
        return self._output

    def mimebundle(self) -> dict[str, Any]:
        """The output the browser shows: the figure as plotly JSON (what ``fig.show()`` stores in a notebook)."""
        import plotly.io as pio

        title = self.layout.title.text or "figure"
        return {PLOTLY_MIME: json.loads(pio.to_json(self, validate=False)), "text/plain": f"<figure: {title}>"}

    @contextlib.contextmanager
    def batch_update(self):  # type: ignore[override]
        """Apply every change inside the block, then send the figure once."""
        self._held += 1
        try:
            with super().batch_update():
                yield
        finally:
            self._held -= 1
            self._send()

    @property
    def data(self):  # type: ignore[override]
        return go.Figure.data.fget(self)

    @data.setter
    def data(self, value: Any) -> None:
        # plotly's setter reports deleted traces before it has finished reordering: send once, when it is done
        self._held += 1
        try:
            go.Figure.data.fset(self, value)
        finally:
            self._held -= 1
            self._send()

    def _send(self, *_: Any, **__: Any) -> None:
        if self._output is None or self._held:
            return
        self._output.outputs = ({"output_type": "display_data", "data": self.mimebundle(), "metadata": {}},)

    # plotly calls these on every change of a figure (no-ops for a plain Figure, messages for a FigureWidget)
    _send_addTraces_msg = _send_moveTraces_msg = _send_deleteTraces_msg = _send
    _send_restyle_msg = _send_relayout_msg = _send_update_msg = _send_animate_msg = _send


def widget_safe(fig: go.Figure) -> go.Figure:
    """``fig`` with its arrays as plain lists, NaN as null: the figure as the live widget holds and sends it.

    Static figures keep numpy arrays (plotly writes them as compact base64). The live figure holds lists, so that
    what a view's ``fig_widget`` reads (tuples, ``None`` for a gap) is what JSON carries to the browser: a NaN
    (a line gap, a padding cell) is not valid JSON, and null draws the same gap.
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


def sync_figure(target: go.Figure, fig: go.Figure) -> None:
    """Make a live figure (:class:`LiveFigure`) show ``fig``, sent once: traces updated in place where the types
    line up (a longer or shorter list drops or appends only the difference), replaced only when the types differ.

    A trace updated in place loses every property the new trace does not set (a failed-requests trace's hover
    ``text`` must not stay on the replica trace that takes its place)."""
    with target.batch_update():
        common = min(len(target.data), len(fig.data))
        if all(a.type == b.type for a, b in zip(target.data[:common], fig.data[:common])):
            if len(target.data) > common:
                target.data = target.data[:common]
            for old, new in zip(target.data, fig.data):
                fresh = new.to_plotly_json()
                stale = {key: None for key in old.to_plotly_json() if key not in fresh and key != "uid"}
                old.update({**stale, **fresh}, overwrite=True)
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
