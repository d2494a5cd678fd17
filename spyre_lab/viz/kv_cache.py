"""KVCacheView: the paged KV cache replayed step by step: blocks, block tables, and what happened to requests.

Three panels, all from the KV snapshots the engine records each step (``llm.stats.details[n].kv``):

* **blocks**: every physical block, colored by the request holding it; a block two requests share (a reused
  prefix) says how many hold it; a free block that still holds a hashed, full block is *cached* (a new request
  with the same prefix takes it back without recomputing it), the rest are *free*;
* **block tables**: per running request, its logical blocks -> physical block ids; the first blocks found by
  prefix caching are marked;
* **over time**: used / cached / free blocks per step, with arrivals, preemptions and finishes marked.

The step slider replays the run. ``KVCacheView(llm)``, ``KVCacheView(llm.stats)`` or a saved stats JSON file.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spyre_lab.viz import style
from spyre_lab.viz.base import View, base_layout, note_annotation
from spyre_lab.viz.sources import as_stats

if TYPE_CHECKING:
    from spyre_lab.engine.stats import KVSnapshot, StepDetail

#: above this many blocks the block grid shows the first MAX_GRID_BLOCKS (and says so)
MAX_GRID_BLOCKS = 1024
#: above this many running requests the block-table panel shows the first MAX_TABLE_ROWS (and says so)
MAX_TABLE_ROWS = 24


class KVCacheView(View):
    """Paged KV cache per step: block states, block tables per request, and block counts over the run."""

    figure_height = 760

    def __init__(self, source: Any, step: int | None = None) -> None:
        super().__init__()
        stats = as_stats(source)
        self.details: dict[int, StepDetail] = {n: d for n, d in sorted(stats.details.items()) if d.kv is not None}
        if not self.details:
            raise ValueError("no KV snapshots recorded: serve some requests first (llm.generate(...)); warmup steps "
                             "have none")
        self.steps = list(self.details)
        self.step = step if step is not None else self._default_step()
        if self.step not in self.details:
            raise ValueError(f"step {self.step} has no KV snapshot; steps with one: {self.steps[0]}..{self.steps[-1]}")

    def _default_step(self) -> int:
        """The most telling step: the first with a preemption, else the first that reused a cached prefix, else
        the step with the most blocks in use."""
        for n, d in self.details.items():
            if d.preempted:
                return n
        for n, d in self.details.items():
            if any(d.kv.cached_tokens.get(r, 0) for r in d.arrived):
                return n
        return max(self.details, key=lambda n: self.details[n].kv.counts()["used"])

    @property
    def snapshot(self) -> KVSnapshot:
        return self.details[self.step].kv

    @property
    def caption(self) -> str:  # type: ignore[override]
        d = self.details[self.step]
        counts = d.kv.counts()
        events = "; ".join(f"{what}: {', '.join(ids)}" for what, ids in
                           (("arrived", d.arrived), ("preempted", d.preempted), ("finished", d.finished)) if ids)
        return (f"KV cache at step {self.step}: {counts['used']} used, {counts['cached']} cached (free but reusable), "
                f"{counts['free']} free of {d.kv.num_blocks} blocks of {d.kv.block_size} tokens"
                + (f" — {events}" if events else ""))

    def make_controls(self) -> list[W.Widget]:
        slider = W.SelectionSlider(options=self.steps, value=self.step, description="step",
                                   continuous_update=False, layout=W.Layout(width="420px"))
        return [self.bind("step", slider)]

    # ---- the figure ----------------------------------------------------------------------------------
    def build(self) -> go.Figure:
        fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], column_widths=[0.45, 0.55],
                            row_heights=[0.62, 0.38], vertical_spacing=0.14, horizontal_spacing=0.08,
                            subplot_titles=(f"blocks at step {self.step}", "block tables (logical -> physical block)",
                                            "blocks over the run"))
        notes = self._grid(fig) + self._tables(fig) + self._history(fig)
        layout = base_layout("KVCacheView — paged KV cache, replayed step by step", height=self.figure_height)
        layout.update(legend=dict(orientation="h", y=-0.08, x=0, xanchor="left"))
        fig.update_layout(**layout)
        for note in notes:
            fig.add_annotation(note_annotation(note))
        return fig

    def _grid(self, fig: go.Figure) -> list[str]:
        kv = self.snapshot
        shown = min(kv.num_blocks, MAX_GRID_BLOCKS)
        width = max(1, math.ceil(math.sqrt(shown * 1.6)))
        holders: dict[int, list[str]] = {}
        for request_id, table in kv.tables.items():
            for block_id in table:
                holders.setdefault(block_id, []).append(request_id)
        colors, xs, ys, texts, hovers = [], [], [], [], []
        for block_id in range(shown):
            state = kv.state(block_id)
            owners = holders.get(block_id, [])
            color = style.request_color(owners[0]) if state == "used" and owners else style.KV_STATE_COLORS[state]
            refs = kv.ref_counts[block_id]
            xs.append(block_id % width)
            ys.append(block_id // width)
            colors.append(color)
            texts.append(f"{block_id} ×{refs}" if refs > 1 else str(block_id))
            who = f"held by request {', '.join(owners)}" if owners else state
            hovers.append(f"block {block_id}: {state}, ref count {refs}, {who}")
        font = dict(size=10 if width < 12 else 8, color="#222")
        fig.add_scatter(x=xs, y=ys, mode="markers+text", text=texts, textfont=font,
                        marker=dict(symbol="square", size=max(9, min(52, 400 // width)), color=colors,
                                    line=dict(color="#888", width=0.5)),
                        hovertext=hovers, hoverinfo="text", showlegend=False, name="blocks", row=1, col=1)
        for state in ("used", "cached", "free"):
            label = "used block (its request's color)" if state == "used" else f"{state} block"
            fig.add_scatter(x=[None], y=[None], mode="markers", name=label,
                            marker=dict(symbol="square", size=12, color=style.KV_STATE_COLORS[state]),
                            legendgroup=state, row=1, col=1)
        fig.update_xaxes(visible=False, range=[-0.7, width - 0.3], row=1, col=1)
        fig.update_yaxes(visible=False, autorange="reversed", row=1, col=1)
        if shown < kv.num_blocks:
            return [f"aggregated: first {shown:,} of {kv.num_blocks:,} blocks drawn"]
        return []

    def _tables(self, fig: go.Figure) -> list[str]:
        kv = self.snapshot
        items = list(kv.tables.items())[:MAX_TABLE_ROWS]
        xs, ys, colors, texts, hovers, lines = [], [], [], [], [], []
        for request_id, table in items:
            hits = kv.cached_tokens.get(request_id, 0) // kv.block_size
            for index, block_id in enumerate(table):
                xs.append(index)
                ys.append(f"request {request_id}")
                colors.append(style.request_color(request_id))
                texts.append(str(block_id))
                reused = index < hits
                lines.append(style.KV_STATE_COLORS["cached"] if reused else "#777")
                hovers.append(f"request {request_id}, logical block {index} -> physical block {block_id}"
                              + (" (prefix cache hit)" if reused else ""))
        fig.add_scatter(x=xs, y=ys, mode="markers+text", text=texts, textfont=dict(size=10, color="#222"),
                        marker=dict(symbol="square", size=30, color=colors,
                                    line=dict(color=lines, width=[4 if c != "#777" else 0.5 for c in lines])),
                        hovertext=hovers, hoverinfo="text", showlegend=False, name="tables", row=1, col=2)
        fig.add_scatter(x=[None], y=[None], mode="markers", name="prefix cache hit",
                        marker=dict(symbol="square-open", size=12, color=style.KV_STATE_COLORS["cached"],
                                    line=dict(width=3)), row=1, col=2)
        widest = max((len(table) for _, table in items), default=1)
        fig.update_xaxes(title_text="logical block", dtick=1, range=[-0.6, max(widest, 10) - 0.4], row=1, col=2)
        order = [f"request {r}" for r, _ in items]
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(order)), row=1, col=2)
        if not items:
            fig.add_annotation(text="no request holds blocks at this step", showarrow=False, xref="x2 domain",
                               yref="y2 domain", x=0.5, y=0.5, font=dict(color="#888"))
        if len(kv.tables) > len(items):
            return [f"aggregated: block tables of the first {len(items)} of {len(kv.tables)} requests drawn"]
        return []

    def _history(self, fig: go.Figure) -> list[str]:
        steps = self.steps
        counts = [self.details[n].kv.counts() for n in steps]
        for state in ("used", "cached", "free"):
            fig.add_scatter(x=steps, y=[c[state] for c in counts], mode="lines", stackgroup="blocks",
                            line=dict(width=0.5, color=style.KV_STATE_COLORS[state] if state != "free" else "#CCCCCC"),
                            fillcolor=style.KV_STATE_COLORS[state], name=f"{state} blocks", legendgroup=state,
                            showlegend=False, hovertemplate=f"step %{{x}}: %{{y}} {state}<extra></extra>",
                            row=2, col=1)
        top = self.snapshot.num_blocks
        for what, symbol, color in (("arrived", "triangle-down", "#2CA02C"), ("preempted", "x", "#D62728"),
                                    ("finished", "circle", "#444444")):
            xs = [n for n in steps if getattr(self.details[n], what)]
            if not xs:
                continue
            fig.add_scatter(x=xs, y=[top * 1.06] * len(xs), mode="markers", name=what,
                            marker=dict(symbol=symbol, size=9, color=color),
                            hovertext=[f"step {n}: {what} {', '.join(getattr(self.details[n], what))}" for n in xs],
                            hoverinfo="text", row=2, col=1)
        fig.add_vline(x=self.step, line=dict(color="#444", width=1, dash="dot"), row=2, col=1)
        fig.update_xaxes(title_text="engine step", row=2, col=1)
        fig.update_yaxes(title_text="blocks", range=[0, top * 1.12], row=2, col=1)
        return []
