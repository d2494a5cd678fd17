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
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from spyre_lab.device.config import SpyreConfig
from spyre_lab.viz.base import View, base_layout, note_annotation, toggle
from spyre_lab.viz.records import KernelRecord, device_config, is_program, kernel_records, program_name
from spyre_lab.viz.style import NEUTRAL, UNIT_COLORS, kernel_color

_SYMBOL = {"memory": "circle", "compute": "diamond", "communication": "square"}


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
        return (f"Each marker is one kernel of {self.name}: FLOP per DRAM byte (x) against the FLOP/s it reaches "
                f"in {self.mode}-modeled time (y), under the card's PT, SFU and DRAM ceilings.")

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
        for r, (x, y) in placed:
            share = (r.time_us or 0.0) / total if total else 0.0
            traces.append(dict(
                type="scatter", x=[x], y=[y / 1e12], mode="markers+text", text=[f"k{r.index}"],
                textposition="top center", textfont=dict(size=10), name=r.name, meta={"kernel": r.name},
                marker=dict(color=kernel_color(r.name), size=10 + 30 * math.sqrt(share),
                            symbol=_SYMBOL.get(r.bottleneck, "circle"), line=dict(color=NEUTRAL["text"], width=0.5)),
                hovertext=[f"<b>{html.escape(r.name)}</b> ({r.rule})<br>{' → '.join(r.ops)}<br>"
                           f"{x:.2f} FLOP/B, {y / 1e12:.3f} TFLOP/s<br>{r.time_us:.2f} µs modeled "
                           f"({share:.0%} of device time), {r.bottleneck}-bound"],
                hoverinfo="text", showlegend=len(placed) <= 24))
        return traces

    def build(self) -> go.Figure:
        cfg = self.cfg
        recs = self.records()
        fig = go.Figure()
        x_lo, x_hi = self.x_range()
        for trace in self.trace_dicts():
            fig.add_trace(go.Scatter(trace))
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
        layout["legend"] = dict(orientation="v", x=1.02, y=1.0, font=dict(size=10))
        layout["margin"] = dict(l=70, r=20, t=80, b=50)
        fig.update_layout(**layout)
        fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per DRAM byte)", range=[
            math.log10(x_lo), math.log10(x_hi)])
        fig.update_yaxes(type="log", title_text="modeled TFLOP/s")
        fig.add_vline(x=cfg.ridge_flop_per_byte, line=dict(color=NEUTRAL["rule"], width=1, dash="dot"),
                      annotation_text=f"ridge {cfg.ridge_flop_per_byte:.0f} FLOP/B", annotation_font_size=10)
        for i, text in enumerate(notes):
            fig.add_annotation(note_annotation(text) | dict(y=1.0 + 0.04 * i))
        return fig
