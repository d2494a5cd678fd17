"""FusionView: the LoopIR graph before and after fusion, and what each kernel costs; one checkbox per rule.

Top: the LoopIR graph as lowering left it (one node per op, every edge a trip through DRAM if nothing
were fused), each node already colored by the kernel it lands in. Middle: the same nodes grouped into
kernels in launch order, a box per kernel named with the fusion rule that formed it; edges inside a box
stay in LX, edges between boxes go through DRAM. Bottom: the kernel table (DRAM bytes served, modeled
time, bottleneck). Unticking a rule recompiles the graph with ``CompileOptions.without(rule)`` (the
program cache keeps every variant) and redraws all three.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from plotly.utils import PlotlyJSONEncoder

from spyre_lab.viz.base import View, note_annotation
from spyre_lab.viz.records import KernelRecord, kernel_records
from spyre_lab.viz.sources import as_recompilable, fusion_rules

if TYPE_CHECKING:
    from spyre_lab.compiler.options import CompileOptions
from spyre_lab.viz.style import NEUTRAL, UNIT_COLORS, kernel_color

DENSE_NODES = 30
"""Above this many LoopIR nodes the before-fusion graph drops its labels (hover names each node)."""
LABEL_FIT_WIDTH = 700
"""Figure width (px; the stored static pictures are 700 px wide, a live plot in JupyterLab about that or wider) the
after-fusion labels are fitted to: a label that would run into the next kernel's node is shortened (``resti…``) or
left out, and a rule label that would touch its neighbour moves to a second row or is left out. Hover names every
node and kernel in full; a wider figure only gains room."""
LABEL_FONT = 9
CHAR_PX = 0.6
"""Width estimate of one label character, as a fraction of the font size (Helvetica / Arial average)."""
MARKER_PX = 12
_MARGIN = dict(l=20, r=20, t=70, b=20)
_X_PAD = (0.6, 0.7)
"""The after-fusion x axis runs from ``-0.6`` to ``kernels - 1 + 0.7``: the boxes and the last labels fit."""
TextPanel = Callable[[Any], str]
"""A text panel under FusionView's figure: the current Program (or saved program dict) -> plain text."""
_EDGE_LX = NEUTRAL["edge_lx"]
_EDGE_DRAM = NEUTRAL["edge_dram"]


class FusionView(View):
    """LoopIR before and after fusion plus the kernel table, with a checkbox per fusion rule.

    ``source``: a compiled ``Program``, a module compiled with ``torch.compile(backend="spyre")`` (called
    once), a function or ``nn.Module`` with ``example_inputs``, or a saved program JSON (kernels and table
    only: the LoopIR graph is not saved). Recompiling needs the function: given with ``fn=`` or found with
    the program (compiled graphs and programs from ``compile_graph`` keep it).

    ``text_panels`` adds tabs of text under the figure, each ``title -> function(program) -> str`` and redrawn on
    every rule change (a place for another view of the same kernels, such as their IR as text).
    """

    figure_height = 900

    def __init__(self, source: Any, example_inputs: Sequence[Any] | None = None, fn: Callable | None = None,
                 mode: str | None = None, text_panels: Mapping[str, TextPanel] | None = None) -> None:
        super().__init__()
        self.text_panels = dict(text_panels or {})
        self._panel_widgets: list[W.HTML] = []
        found = as_recompilable(source, example_inputs, fn)
        self.saved: dict[str, Any] | None = found.saved
        self._fn, self._inputs = found.fn, found.inputs
        program = found.program
        self.base_options: CompileOptions | None = None if program is None else program.options
        self.rules = set(self.base_options.fusion) if self.base_options else set(fusion_rules())
        self.mode = mode or (self.base_options.timing if self.base_options else "analytic")
        self._programs: dict[frozenset[str], Any] = {}
        if program is not None:
            self._programs[frozenset(program.options.fusion)] = program

    # --- state -------------------------------------------------------------------------------------
    @property
    def can_recompile(self) -> bool:
        return self.saved is None and self._fn is not None and self._inputs is not None

    @property
    def program(self) -> Any:
        """The Program for the ticked rules (compiled on first use, then from the program cache)."""
        if self.saved is not None:
            return self.saved
        key = frozenset(self.rules)
        if key not in self._programs:
            from spyre_lab.compiler.backend import compile_graph

            if not self.can_recompile:
                raise RuntimeError("FusionView cannot recompile this program: pass fn= and example_inputs=")
            assert self.base_options is not None
            self._programs[key] = compile_graph(self._fn, list(self._inputs),
                                                self.base_options.replace(fusion=key))
        return self._programs[key]

    def records(self) -> list[KernelRecord]:
        return kernel_records(self.program, None if self.saved else self.mode)

    @property
    def caption(self) -> str:  # type: ignore[override]
        recs = self.records()
        dev = sum(r.time_us or 0.0 for r in recs if not r.host)
        rules = ", ".join(sorted(self.rules)) or "none"
        return (f"{len(recs)} kernels for {self._nodes_count()} LoopIR nodes with fusion rules [{rules}]: "
                f"{dev:.1f} µs modeled ({self.mode}); color = the kernel each node lands in.")

    def _nodes_count(self) -> int:
        if self.saved is not None:
            return sum(len(e.get("ops", ())) for e in self.saved["launches"])
        return sum(len(_lowered_nodes(k)) for k in self.program.kernels)

    def make_controls(self) -> list[W.Widget]:
        boxes = []
        for rule in fusion_rules():
            box = W.Checkbox(value=rule in self.rules, description=rule, indent=False,
                             layout=W.Layout(width="auto", margin="0 12px 0 0"), disabled=not self.can_recompile)
            self._controls[rule] = box
            box.observe(lambda change, rule=rule: self._toggle(rule, change["new"]), names="value")
            boxes.append(box)
        return boxes

    def _toggle(self, rule: str, on: bool) -> None:
        (self.rules.add if on else self.rules.discard)(rule)
        self.refresh()

    # --- text panels under the figure (e.g. each kernel's IR as text) -------------------------------
    def panel_texts(self) -> dict[str, str]:
        """Each text panel's text for the current rules' program (title -> text)."""
        return {title: panel(self.program) for title, panel in self.text_panels.items()}

    def below_figure(self) -> list[W.Widget]:
        if not self.text_panels:
            return []
        self._panel_widgets = [W.HTML(_pre(text)) for text in self.panel_texts().values()]
        return [W.Tab(children=self._panel_widgets, titles=tuple(self.text_panels))]

    def refresh(self) -> None:
        super().refresh()
        for widget, text in zip(self._panel_widgets, self.panel_texts().values()):
            widget.value = _pre(text)

    # --- drawing -----------------------------------------------------------------------------------
    def build(self) -> go.Figure:
        recs = self.records()
        height = 640 + 24 * (len(recs) + 2)          # the table grows with the kernels, the graphs do not
        layout, table_domain = _skeleton(height, round(24 * (len(recs) + 2) / height, 3))
        data: list[dict] = []
        shapes: list[dict] = []
        notes = list(layout["annotations"])
        if self.saved is None:
            self._draw_graphs(data, shapes, notes)
        else:
            notes.append(note_annotation("saved program: the LoopIR graph is not saved, so only the kernels are "
                                         "drawn; pass the Program to see its nodes") | dict(y=0.97))
            self._draw_saved_kernels(data, notes, recs)
        data.append(_table(recs) | {"domain": table_domain})
        total = sum(r.time_us or 0.0 for r in recs if not r.host)
        every = set(fusion_rules())
        rules = "all rules" if set(self.rules) == every else (
            f"without {', '.join(sorted(every - self.rules))}" if self.rules else "no fusion")
        name = self.saved["name"] if self.saved else self.program.name
        notes.append(dict(text="box labels: " + ", ".join(f"{v} = {k}" for k, v in _SHORT.items() if k != "fallback"),
                          xref="paper", yref="y2 domain", x=0.0, y=-0.02, yanchor="top", xanchor="left",
                          showarrow=False, font=dict(size=10, color=NEUTRAL["muted"]), name="legend"))
        kernels = len(recs) if self.saved is not None else self.program.num_kernels
        layout["xaxis2"] = {**layout.get("xaxis2", {}), "range": [-_X_PAD[0], kernels - 1 + _X_PAD[1]]}
        layout = {**layout, "shapes": shapes, "annotations": notes, "height": height,
                  "title": dict(text=f"Fusion of {html.escape(str(name))} ({rules}): {len(recs)} kernels, "
                                     f"{total:.1f} µs modeled — {self.mode} timing", x=0.01, xanchor="left",
                                font=dict(size=15))}
        return go.Figure(dict(data=data, layout=layout), _validate=False)

    def _draw_graphs(self, data: list[dict], shapes: list[dict], notes: list[dict]) -> None:
        program = self.program
        kernel_of: dict[str, str] = {}
        rule_of: dict[str, str] = {}
        nodes = []
        for launch, k in zip(program.launches, program.kernels):
            for n in _lowered_nodes(k):
                kernel_of[n.name] = launch.name
                rule_of[n.name] = k.rule
                nodes.append(n)
        producer = {n.output: n for n in nodes}
        edges = [(producer[b].name, n.name) for n in nodes for b in dict.fromkeys(n.inputs) if b in producer]
        # before: layered by longest path from the graph inputs
        depth: dict[str, int] = {}
        for n in nodes:                              # kernels come in dependency order
            depth[n.name] = 1 + max((depth[producer[b].name] for b in n.inputs if b in producer), default=-1)
        layer_count: dict[int, int] = {}
        before: dict[str, tuple[float, float]] = {}
        for n in nodes:
            d = depth[n.name]
            before[n.name] = (d, layer_count.get(d, 0))
            layer_count[d] = layer_count.get(d, 0) + 1
        # after: kernels left to right, their nodes stacked
        after: dict[str, tuple[float, float]] = {}
        for i, k in enumerate(program.kernels):
            for j, n in enumerate(_lowered_nodes(k)):
                after[n.name] = (i, j)
        names = {n.name: n for n in nodes}
        for axes, pos in ((("x", "y"), before), (("x2", "y2"), after)):
            row_after = axes[0] == "x2"
            lx_x: list[Any] = []
            lx_y: list[Any] = []
            dram_x: list[Any] = []
            dram_y: list[Any] = []
            for a, b in edges:
                same = kernel_of[a] == kernel_of[b]
                xs, ys = (lx_x, lx_y) if same and row_after else (dram_x, dram_y)
                xs += [pos[a][0], pos[b][0], None]
                ys += [pos[a][1], pos[b][1], None]
            data.append(dict(type="scatter", x=dram_x, y=dram_y, mode="lines", hoverinfo="skip", name="through DRAM",
                             xaxis=axes[0], yaxis=axes[1],
                             line=dict(color=_EDGE_DRAM, width=1, dash="dot" if row_after else "solid")))
            if lx_x:
                data.append(dict(type="scatter", x=lx_x, y=lx_y, mode="lines", hoverinfo="skip", name="stays in LX",
                                 xaxis=axes[0], yaxis=axes[1], line=dict(color=_EDGE_LX, width=2)))
            order = list(names)
            if row_after:
                fitted = fit_node_labels({n: after[n] for n in order}, {n: names[n].op for n in order},
                                         len(program.kernels))
                text: list[str] | None = [fitted[n] for n in order]
            else:
                text = [names[n].op for n in order] if len(order) <= DENSE_NODES else None
            data.append(dict(
                type="scatter", x=[pos[n][0] for n in order], y=[pos[n][1] for n in order],
                mode="markers+text" if text is not None else "markers",
                xaxis=axes[0], yaxis=axes[1], text=text, cliponaxis=not row_after,
                textposition="middle right", textfont=dict(size=LABEL_FONT),
                marker=dict(size=12, color=[kernel_color(kernel_of[n]) for n in order],
                            symbol=["square" if names[n].kind == "MatMul" else "circle" for n in order],
                            line=dict(color=NEUTRAL["text"], width=0.5)),
                hovertext=[f"<b>{html.escape(names[n].op)}</b> {html.escape(names[n].kind)} "
                           f"{dict(names[n].dims)}<br>kernel {html.escape(kernel_of[n])} ({rule_of[n]})"
                           for n in order], hoverinfo="text", name="kernels" if row_after else "nodes",
                meta={"row": "after" if row_after else "before"}))
        for i, (launch, k) in enumerate(zip(program.launches, program.kernels)):
            color = kernel_color(launch.name)
            shapes.append(dict(type="rect", x0=i - 0.35, x1=i + 0.45, y0=-0.5, y1=len(_lowered_nodes(k)) - 0.5,
                               xref="x2", yref="y2", line=dict(color=color, width=1.5), fillcolor=color, opacity=0.15,
                               layer="below", name=f"kernel {launch.name}"))
        notes += rule_labels([(launch.name, k.rule) for launch, k in zip(program.launches, program.kernels)])
        data.append(dict(type="scatter", x=[0], y=[-1.4], mode="markers", marker=dict(opacity=0), hoverinfo="skip",
                         xaxis="x2", yaxis="y2", showlegend=False))

    def _draw_saved_kernels(self, data: list[dict], notes: list[dict], recs: list[KernelRecord]) -> None:
        xs, ys, text, colors, hover = [], [], [], [], []
        for r in recs:
            for j, op in enumerate(r.ops):
                xs.append(r.index)
                ys.append(j)
                text.append(op)
                colors.append(UNIT_COLORS["host"] if r.host else kernel_color(r.name))
                hover.append(f"{html.escape(r.name)} ({r.rule})")
        notes += rule_labels([(r.name, r.rule) for r in recs])
        fitted = fit_node_labels({i: (x, y) for i, (x, y) in enumerate(zip(xs, ys))}, dict(enumerate(text)), len(recs))
        data.append(dict(type="scatter", x=xs, y=ys, mode="markers+text", text=[fitted[i] for i in range(len(xs))],
                         textposition="middle right", xaxis="x2", yaxis="y2", textfont=dict(size=LABEL_FONT),
                         cliponaxis=False, marker=dict(size=MARKER_PX, color=colors),
                         hovertext=[f"<b>{html.escape(op)}</b><br>{h}" for op, h in zip(text, hover)],
                         hoverinfo="text", meta={"row": "after"}))


@functools.lru_cache(maxsize=16)
def _skeleton_cached(height: int, table: float) -> str:
    graphs = (1 - table) / 2
    fig = make_subplots(rows=3, cols=1, row_heights=[graphs, graphs, table], vertical_spacing=0.06,
                        specs=[[{"type": "xy"}], [{"type": "xy"}], [{"type": "table"}]],
                        subplot_titles=("LoopIR before fusion: one node per op (color: the kernel it lands in)",
                                        "after fusion: kernels in launch order (box = kernel, label = rule)",
                                        "kernels (modeled)"))
    fig.add_trace(go.Table(), row=3, col=1)
    fig.update_layout(template="plotly_white", height=height, showlegend=False, margin=_MARGIN,
                      hovermode="closest")
    for row in (1, 2):
        fig.update_xaxes(visible=False, row=row, col=1)
        fig.update_yaxes(visible=False, autorange="reversed", row=row, col=1)
    return json.dumps(fig.to_plotly_json(), cls=PlotlyJSONEncoder)


def _skeleton(height: int, table: float) -> tuple[dict, dict]:
    """The three-row layout (graph, graph, table), built once with make_subplots and then reused as plain data."""
    doc = json.loads(_skeleton_cached(height, table))
    return doc["layout"], doc["data"][0]["domain"]


def _pre(text: str) -> str:
    return f"<pre style='font-size:11px;max-height:320px;overflow:auto'>{html.escape(text)}</pre>"


def _lowered_nodes(kernel: Any) -> list:
    """The LoopIR nodes a kernel holds: a fused attention node stands for the nodes it replaced (its ``members``)."""
    from spyre_lab.compiler.tiling_attention import Attention

    return [m for n in kernel.nodes for m in (n.members if isinstance(n, Attention) and n.members else [n])]


_SHORT = {"reduction_fusion": "red", "matmul_epilogue": "epi", "pointwise_chain": "pw", "restickify": "rst",
          "single": "—", "softmax": "smax", "mlp": "mlp", "fallback": "host",
          "attention": "attn"}


def _short_rule(rule: str) -> str:
    """The rule as a label that fits above a one-node box (the table and the hover name it in full)."""
    return _SHORT.get(rule, rule[:4])


def column_px(columns: int, width: int = LABEL_FIT_WIDTH) -> float:
    """Pixels between two kernels of the after-fusion row in a figure ``width`` px wide."""
    return (width - _MARGIN["l"] - _MARGIN["r"]) / (columns - 1 + _X_PAD[0] + _X_PAD[1])


def text_px(text: str, size: int = LABEL_FONT) -> float:
    """Estimated rendered width of ``text`` (plain characters; an ellipsis counts as one)."""
    return len(text) * size * CHAR_PX


def _shorten(text: str, room: float) -> str:
    """``text`` if it fits in ``room`` px, else its longest prefix + "…" that does (two characters or more), or ""."""
    if text_px(text) <= room:
        return text
    for keep in range(len(text) - 1, 1, -1):
        if text_px(text[:keep] + "…") <= room:
            return text[:keep] + "…"
    return ""


def fit_node_labels(pos: dict[Any, tuple[float, float]], labels: dict[Any, str], columns: int) -> dict[Any, str]:
    """Each after-fusion node label shortened to the room before the next node on its row (or the figure's edge).

    A label sits right of its marker; nodes of one kernel stack in a column, so only a later kernel with a node on
    the same row can be in the way. Kernels side by side (a run of restickifies) leave a column's width each.
    """
    u = column_px(columns)
    rows: dict[float, list[float]] = {}
    for x, y in pos.values():
        rows.setdefault(y, []).append(x)
    edge = (columns - 1 + _X_PAD[1]) * u + _MARGIN["r"]            # px from column 0 to the figure's right edge
    out = {}
    for key, (x, y) in pos.items():
        nxt = min((c for c in rows[y] if c > x), default=None)
        right = (nxt * u - MARKER_PX / 2) if nxt is not None else edge
        room = right - (x * u + MARKER_PX / 2) - 5                   # plotly's gap after the marker, a little air
        out[key] = _shorten(labels[key], room)
    return out


def rule_labels(kernels: list[tuple[str, str]]) -> list[dict]:
    """The short rule above each kernel's box: one row while they fit, else two staggered rows; a label that would
    still touch its neighbour is hidden (its hover text, the node hover and the table name the rule)."""
    u = column_px(len(kernels))
    texts = [_short_rule(rule) for _, rule in kernels]
    gap = 3.0

    def clash(step: int) -> bool:
        return any((text_px(texts[i]) + text_px(texts[i + step])) / 2 + gap > step * u
                   for i in range(len(texts) - step))

    rows = 1 if not clash(1) else 2
    last_right: dict[int, float] = {}
    notes = []
    for i, ((name, rule), text) in enumerate(zip(kernels, texts)):
        row = i % rows
        center, half = (i + 0.05) * u, text_px(text) / 2
        visible = center - half >= last_right.get(row, -1e9) + gap
        if visible:
            last_right[row] = center + half
        notes.append(dict(x=i + 0.05, y=-0.55, xref="x2", yref="y2", text=text, showarrow=False, xanchor="center",
                          yanchor="bottom", yshift=12 * row, font=dict(size=LABEL_FONT, color=NEUTRAL["text"]),
                          name="rule", visible=visible, hovertext=f"{name}: {rule}"))
    return notes


def _table(recs: list[KernelRecord]) -> dict:
    total_t = sum(r.time_us or 0.0 for r in recs if not r.host)
    cells = [
        [f"k{r.index}" for r in recs] + ["total"],
        [r.rule for r in recs] + [""],
        [" → ".join(r.ops)[:60] for r in recs] + [""],
        [f"{r.dram_bytes / 1e3:,.1f}" if not r.host else "host" for r in recs]
        + [f"{sum(r.dram_bytes for r in recs) / 1e3:,.1f}"],
        [f"{r.time_us:.2f}" if r.time_us is not None else "—" for r in recs] + [f"{total_t:.2f}"],
        [r.bottleneck for r in recs] + [""],
    ]
    # no-break spaces: a table laid out before it is on screen (a notebook output) wraps spaced text to nothing
    cells = [[str(v).replace(" ", "\u00a0") for v in col] for col in cells]
    fill = [[kernel_color(r.name) if not r.host else UNIT_COLORS["host"] for r in recs] + [NEUTRAL["white"]]]
    fill += [[NEUTRAL["white"]] * (len(recs) + 1)] * 5
    return dict(
        type="table", header=dict(values=["kernel", "rule", "ops", "DRAM\u00a0kB", "modeled\u00a0µs", "bottleneck"],
                    fill=dict(color=NEUTRAL["header"]), align="left", font=dict(size=11)),
        cells=dict(values=cells, fill=dict(color=fill), align="left", font=dict(size=10), height=20),
        columnwidth=[40, 90, 260, 70, 70, 80])
