"""Roofline: every kernel of a program on the modeled card's roofline (ceilings from ``SpyreConfig``).

x is arithmetic intensity (FLOP per byte DRAM serves; a broadcast load counts once per group), y is
the FLOP/s the kernel reaches in its modeled time. The ceilings are the card's, computed from the
config the program was compiled for: PT peak (``cfg.peak_flops``), SFU vector peak (one FLOP per
element per lane), and DRAM bandwidth times intensity. A kernel far under both roofs is bound by
something else: the launch overhead (toggle it off to see), the ring, or a core's DMA engine.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from spyre_lab.device.config import SpyreConfig
from spyre_lab.viz.base import View, base_layout, cached_subplots, note_annotation, toggle
from spyre_lab.viz.labels import FIT_WIDTH, Box, place_labels
from spyre_lab.viz.records import KernelRecord, kernel_records
from spyre_lab.viz.sources import device_config, is_program, program_name
from spyre_lab.viz.style import NEUTRAL, UNIT_COLORS, kernel_color

_SYMBOL = {"memory": "circle", "compute": "diamond", "communication": "square"}
LABEL_FONT = 10
RING_PX = 10
"""Markers at one point are drawn as concentric rings, each this many px wider than the one on top of it."""
SAME_POINT_PX = 3.0
"""Markers whose centres are closer than this (at ``FIT_WIDTH``) count as one point."""
LEGEND_NAME_CHARS = 34
_MARGIN = dict(l=70, t=80, b=50)


def sfu_peak_flops(cfg: SpyreConfig) -> float:
    """Vector FLOP/s of the whole card: every SFU lane on every core, one element per cycle."""
    return cfg.sfu_elems_per_cycle_per_core * cfg.cores * cfg.clock_hz


class Roofline(View):
    """Each kernel of a Program (or a saved program JSON) on the modeled device's roofline."""

    figure_height = 480

    def __init__(self, program: Any, mode: str | None = None, include_launch: bool = True) -> None:
        super().__init__()
        if not is_program(program):
            raise TypeError(f"Roofline takes a Program or a saved program JSON, got {type(program).__name__}; "
                            "compile with spyre_lab.compiler.backend.compile_graph(fn, inputs)")
        self.program = program
        self.saved = isinstance(program, dict)
        self.cfg = device_config(program)
        self.name = program_name(program)
        default = (kernel_records(program)[0].mode if self.saved and program["launches"] else None) or "analytic"
        if not self.saved:
            default = program.options.timing
        self.mode = mode or default
        self.include_launch = include_launch
        self._records: dict[str, list[KernelRecord]] = {}

    def records(self) -> list[KernelRecord]:
        """The kernels' modeled numbers in the current mode (drop one level: a table of these)."""
        key = "saved" if self.saved else self.mode
        if key not in self._records:
            self._records[key] = kernel_records(self.program, None if self.saved else self.mode)
        return self._records[key]

    @property
    def caption(self) -> str:  # type: ignore[override]
        rings = " Kernels at one point are drawn as concentric rings." if self._same_points() else ""
        return (f"Each marker is one kernel of {self.name} (labelled k0, k1, ... in kernel order): FLOP per DRAM byte "
                f"(x) against the FLOP/s it reaches in {self.mode}-modeled time (y), under the card's PT, SFU and DRAM "
                f"ceilings.{rings}")

    def make_controls(self) -> list[W.Widget]:
        mode = toggle(["analytic", "event"], self.mode, "timing")
        mode.disabled = self.saved
        launch = W.Checkbox(value=self.include_launch, description="count launch overhead", indent=False)
        return [self.bind("mode", mode), self.bind("include_launch", launch)]

    def point(self, r: KernelRecord) -> tuple[float, float] | None:
        """(FLOP/byte, FLOP/s) of a kernel, or None when it cannot sit on a log roofline."""
        if r.host or not r.time_us or not r.flops or not r.dram_bytes:
            return None
        t = r.time_us if self.include_launch else max(r.time_us - r.launch_us, 1e-9)
        return r.flops / r.dram_bytes, r.flops / (t * 1e-6)

    def x_range(self) -> tuple[float, float]:
        """The intensity axis: whole decades around every placed kernel and the ridge point."""
        cfg = self.cfg
        xs = [p[0] for r in self.records() if (p := self.point(r)) is not None] or [1.0]
        x_lo = 10 ** math.floor(math.log10(min(min(xs), cfg.ridge_flop_per_byte) / 4))
        x_hi = 10 ** math.ceil(math.log10(max(max(xs), cfg.ridge_flop_per_byte) * 4))
        return x_lo, x_hi

    def trace_dicts(self) -> list[dict[str, Any]]:
        """The ceilings (PT, SFU, DRAM) then one marker per placed kernel, as plain scatter dicts (WhatIf reuses
        them in its own subplot without plotly validating each on every control change)."""
        cfg = self.cfg
        recs = self.records()
        placed = [(r, p) for r in recs if (p := self.point(r)) is not None]
        total = sum(r.time_us or 0.0 for r in recs if not r.host)
        x_lo, x_hi = self.x_range()
        grid = np.logspace(math.log10(x_lo), math.log10(x_hi), 200)
        dram = cfg.dram_bandwidth * grid
        sfu = sfu_peak_flops(cfg)
        traces: list[dict[str, Any]] = [
            dict(type="scatter", x=grid, y=np.minimum(dram, cfg.peak_flops) / 1e12, mode="lines",
                 line=dict(color=UNIT_COLORS["pt"], width=2), name=f"PT peak {cfg.peak_flops / 1e12:.1f} TFLOP/s",
                 hoverinfo="skip"),
            dict(type="scatter", x=grid, y=np.minimum(dram, sfu) / 1e12, mode="lines",
                 line=dict(color=UNIT_COLORS["sfu"], width=2, dash="dash"),
                 name=f"SFU peak {sfu / 1e12:.2f} TFLOP/s (estimate)", hoverinfo="skip"),
            dict(type="scatter", x=grid, y=dram / 1e12, mode="lines",
                 line=dict(color=UNIT_COLORS["load"], width=1, dash="dot"),
                 name=f"DRAM {cfg.dram_bandwidth / 1e9:.1f} GB/s", hoverinfo="skip"),
        ]
        sizes = self.marker_sizes()
        order = sorted(range(len(placed)), key=lambda i: -sizes[i])      # big first: a small marker stays on top
        for i in order:
            r, (x, y) = placed[i]
            share = (r.time_us or 0.0) / total if total else 0.0
            name = r.name if len(r.name) <= LEGEND_NAME_CHARS else r.name[:LEGEND_NAME_CHARS - 1] + "…"
            traces.append(dict(
                type="scatter", x=[x], y=[y / 1e12], mode="markers", text=[f"k{r.index}"], name=name,
                meta={"kernel": r.name}, legendrank=1000 + i,
                marker=dict(color=kernel_color(r.name), size=sizes[i],
                            symbol=_SYMBOL.get(r.bottleneck, "circle"), line=dict(color=NEUTRAL["white"], width=1)),
                hovertext=[f"<b>{html.escape(r.name)}</b> ({r.rule})<br>{' → '.join(r.ops)}<br>"
                           f"{x:.2f} FLOP/B, {y / 1e12:.3f} TFLOP/s<br>{r.time_us:.2f} µs modeled "
                           f"({share:.0%} of device time), {r.bottleneck}-bound"],
                hoverinfo="text", showlegend=len(placed) <= 24))
        return traces

    def placed(self) -> list[tuple[KernelRecord, tuple[float, float]]]:
        """The kernels that sit on the log roofline, with their (FLOP/byte, FLOP/s), in kernel order."""
        return [(r, p) for r in self.records() if (p := self.point(r)) is not None]

    def axis_ranges(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """(x, y) axis ranges in log10 units, as the figure sets them."""
        x_lo, x_hi = self.x_range()
        return (math.log10(x_lo), math.log10(x_hi)), self.y_range()

    def y_range(self) -> tuple[float, float]:
        """The TFLOP/s axis (log10 units): whole decades under the lowest kernel, room for labels above the roof."""
        ys = [p[1] / 1e12 for _, p in self.placed()] or [self.cfg.peak_flops / 1e12]
        top = max(max(ys), self.cfg.peak_flops / 1e12)
        return math.floor(math.log10(min(ys) / 3)), math.log10(top * 6)

    def plot_area(self, width: int = FIT_WIDTH) -> Box:
        """The plotting area in figure pixels at ``width``: the margins, the legend's column on the right."""
        return Box(_MARGIN["l"], _MARGIN["t"], width - self.legend_px(), self.figure_height - _MARGIN["b"])

    def legend_px(self) -> int:
        """The right margin that holds the legend: its longest name at the legend's font, plus the swatch."""
        names = [t["name"] for t in self._ceiling_names()] + [
            r.name if len(r.name) <= LEGEND_NAME_CHARS else r.name[:LEGEND_NAME_CHARS] for r, _ in self.placed()]
        return int(48 + max(len(n) for n in names) * LABEL_FONT * 0.6)

    def _ceiling_names(self) -> list[dict[str, str]]:
        cfg = self.cfg
        return [{"name": f"PT peak {cfg.peak_flops / 1e12:.1f} TFLOP/s"},
                {"name": f"SFU peak {sfu_peak_flops(cfg) / 1e12:.2f} TFLOP/s (estimate)"},
                {"name": f"DRAM {cfg.dram_bandwidth / 1e9:.1f} GB/s"}]

    def pixels(self, area: Box | None = None, ranges: tuple[tuple[float, float], tuple[float, float]] | None = None
               ) -> list[tuple[float, float]]:
        """Each placed kernel's centre in figure pixels (y grows downwards) in ``area`` (default: this view's
        plot area at ``FIT_WIDTH``) under the axis ``ranges`` (log10 units; default: this view's)."""
        area = area or self.plot_area()
        (x0, x1), (y0, y1) = ranges or self.axis_ranges()
        out = []
        for _, (x, y) in self.placed():
            px = area.x0 + (math.log10(x) - x0) / (x1 - x0) * (area.x1 - area.x0)
            py = area.y0 + (y1 - math.log10(y / 1e12)) / (y1 - y0) * (area.y1 - area.y0)
            out.append((px, py))
        return out

    def ridge_box(self) -> Box:
        """Where the ridge label sits (top of the plot, right of the ridge line): labels keep out of it."""
        area = self.plot_area()
        x0, x1 = (math.log10(v) for v in self.x_range())
        px = area.x0 + (math.log10(self.cfg.ridge_flop_per_byte) - x0) / (x1 - x0) * (area.x1 - area.x0)
        text = f"ridge {self.cfg.ridge_flop_per_byte:.0f} FLOP/B"
        return Box(px, area.y0, px + len(text) * LABEL_FONT * 0.6 + 4, area.y0 + LABEL_FONT * 1.25 + 4)

    def _same_points(self) -> bool:
        pixels = self.pixels()
        return any(math.dist(a, b) < SAME_POINT_PX for i, a in enumerate(pixels) for b in pixels[i + 1:])

    def marker_sizes(self, area: Box | None = None,
                     ranges: tuple[tuple[float, float], tuple[float, float]] | None = None) -> list[float]:
        """Marker diameters (px): 10 + 30 x sqrt(share of device time), and kernels at one point drawn as concentric
        rings (the earlier one larger by ``RING_PX``) so none hides another."""
        recs = self.records()
        total = sum(r.time_us or 0.0 for r in recs if not r.host)
        sizes = [10 + 30 * math.sqrt((r.time_us or 0.0) / total if total else 0.0) for r, _ in self.placed()]
        pixels = self.pixels(area, ranges)
        groups: list[list[int]] = []
        for i, (x, y) in enumerate(pixels):
            group = next((g for g in groups if math.dist(pixels[g[0]], (x, y)) < SAME_POINT_PX), None)
            if group is None:
                groups.append([i])
            else:
                group.append(i)
        for group in groups:
            if len(group) > 1:
                inner = max(sizes[i] for i in group)
                for rank, i in enumerate(reversed(group)):
                    sizes[i] = inner + RING_PX * rank
        return sizes

    def label_annotations(self, area: Box | None = None, axes: tuple[str, str] = ("x", "y"),
                          obstacles: Sequence[Box] = (),
                          ranges: tuple[tuple[float, float], tuple[float, float]] | None = None
                          ) -> list[dict[str, Any]]:
        """``k<i>`` beside each placed kernel on a leader line, placed so no two labels overlap (in ``area``, by
        default this view's plot area at ``FIT_WIDTH``; ``axes`` are the subplot's axis references, ``ranges``
        its log10 axis ranges)."""
        area = area or self.plot_area()
        placed, pixels, sizes = self.placed(), self.pixels(area, ranges), self.marker_sizes(area, ranges)
        texts = [f"k{r.index}" for r, _ in placed]
        offsets = place_labels(pixels, [s / 2 for s in sizes], texts, area, LABEL_FONT, obstacles)
        return [dict(x=math.log10(x), y=math.log10(y / 1e12), xref=axes[0], yref=axes[1], text=text, ax=dx, ay=dy,
                     showarrow=True, arrowhead=0, arrowwidth=1, arrowcolor=kernel_color(r.name), standoff=size / 2,
                     font=dict(size=LABEL_FONT, color=NEUTRAL["text"]), name="kernel label",
                     hovertext=html.escape(r.name))
                for (r, (x, y)), text, (dx, dy), size in zip(placed, texts, offsets, sizes)]

    def build(self) -> go.Figure:
        """The figure as plain dicts, unvalidated (a control change redraws it; plotly's validators would cost
        most of the redraw)."""
        cfg = self.cfg
        recs = self.records()
        x_lo, x_hi = self.x_range()
        notes = []
        skipped = [r for r in recs if self.point(r) is None]
        if skipped:
            host = sum(r.host for r in skipped)
            no_flops = len(skipped) - host
            parts = ([f"{no_flops} kernel(s) with no FLOPs or no time (copies, restickify, unplanned)"]
                     if no_flops else []) + ([f"{host} host fallback(s)"] if host else [])
            notes.append("not placed: " + "; ".join(parts))
        launch_word = "" if self.include_launch else ", launch overhead excluded"
        layout = base_layout(f"Roofline of {html.escape(self.name)} on {html.escape(cfg.name)} — {self.mode} timing "
                             f"(modeled{launch_word})", height=self.figure_height)
        ridge = f"ridge {cfg.ridge_flop_per_byte:.0f} FLOP/B"
        annotations = [dict(x=math.log10(cfg.ridge_flop_per_byte), xref="x", y=1.0, yref="y domain", yanchor="top",
                            xanchor="left", text=ridge, showarrow=False,
                            font=dict(size=LABEL_FONT, color=NEUTRAL["muted"]), name="ridge"),
                       *self.label_annotations(obstacles=[self.ridge_box()]),
                       *(note_annotation(text) | dict(y=1.0 + 0.04 * i) for i, text in enumerate(notes))]
        frame, _ = cached_subplots(rows=1, cols=1, template="plotly_white", height=self.figure_height)
        layout = {**frame, **{k: v for k, v in layout.items() if k != "template"}}   # the template as data
        layout.update(
            legend=dict(orientation="v", x=1.0, xanchor="left", y=1.0, font=dict(size=LABEL_FONT)),
            margin=dict(_MARGIN, r=self.legend_px()),
            xaxis=frame.get("xaxis", {}) | dict(type="log", range=[math.log10(x_lo), math.log10(x_hi)],
                                                title=dict(text="arithmetic intensity (FLOP per DRAM byte)")),
            yaxis=frame.get("yaxis", {}) | dict(type="log", title=dict(text="modeled TFLOP/s"),
                                                range=list(self.y_range())),
            shapes=[dict(type="line", x0=cfg.ridge_flop_per_byte, x1=cfg.ridge_flop_per_byte, xref="x", y0=0, y1=1,
                         yref="y domain", line=dict(color=NEUTRAL["rule"], width=1, dash="dot"), name="ridge")],
            annotations=annotations)
        data = [t | {"x": list(t["x"]), "y": list(t["y"])} for t in self.trace_dicts()]
        return go.Figure(dict(data=data, layout=layout), _validate=False)
