"""Fidelity: how far the modeled card is from the real one, kernel by kernel, on both named machines.

Each marker is one reference kernel of the fidelity study (``spyre_lab.studies.fidelity``, ``spyre-lab fidelity``):
its reference time on x (measured on the card, or predicted by torch-spyre's hardware-fitted cost model) against
the time the analytic simulator models for the same plan on y, log-log. On the diagonal the model agrees; the
shaded band around it is the category's RMS error of torch-spyre's own model against hardware, the closeness a
fitted model reaches. The toggle shows the ``measured`` machine, the ``datasheet`` one, or both, joined per kernel
so the eye sees how far calibration moved it.

The view draws the study's result dict (``fidelity()``, or the ``spyre-lab fidelity --json`` file) and computes
nothing of its own: the study lives above the views, so its result is passed in, computed once.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from spyre_lab.viz.base import View, base_layout, cached_subplots, toggle
from spyre_lab.viz.style import NEUTRAL, kernel_color

SCHEMA = "spyre_lab.fidelity/1"
MACHINES = ("measured", "datasheet")
CHOICES = (*MACHINES, "both")
SYMBOLS = {"measured": "circle", "datasheet": "diamond-open"}
REFERENCE_KIND = {"measured": "measured on the card",
                  "fitted": "predicted by torch-spyre's fitted cost model"}
PAD = 1.6
"""The axes run this factor beyond the smallest and largest time either machine shows (fixed across the toggle)."""
BAND_REACH = 1.3
"""A category's band spans its reference times widened by this factor each side."""
BAND_ALPHA = 0.14


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def load_result(source: dict[str, Any] | str | Path) -> dict[str, Any]:
    """The fidelity study's result: the dict itself, or a file written by ``spyre-lab fidelity --json``."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}; write one with `spyre-lab fidelity --json > {path}`")
        source = json.loads(path.read_text())
    if not isinstance(source, dict) or source.get("schema") != SCHEMA:
        got = source.get("schema") if isinstance(source, dict) else type(source).__name__
        raise ValueError(f"Fidelity draws the fidelity study's result (schema {SCHEMA}), got {got!r}; pass "
                         "spyre_lab.studies.fidelity.fidelity() or the file `spyre-lab fidelity --json` writes")
    return source


class Fidelity(View):
    """Modeled against reference time per kernel, coloured by category, on the measured and datasheet machines."""

    figure_height = 520

    def __init__(self, result: dict[str, Any] | str | Path, machine: str = "both") -> None:
        super().__init__()
        if machine not in CHOICES:
            raise ValueError(f"machine must be one of {list(CHOICES)}, got {machine!r}")
        self.result = load_result(result)
        self.machine = machine
        self.categories = list(self.result["categories"])

    @classmethod
    def from_json(cls, source: str | Path | dict[str, Any], **kwargs: Any) -> Fidelity:
        """The view of a saved ``spyre-lab fidelity --json`` file."""
        return cls(source, **kwargs)

    # --- the data the figure draws (drop one level: a table of these) -------------------------
    @property
    def machines(self) -> list[str]:
        """The machines the current state shows."""
        return list(MACHINES) if self.machine == "both" else [self.machine]

    def category_color(self, category: str) -> str:
        """A category's color: the kernel palette in the study's category order."""
        return kernel_color(self.categories.index(category))

    def points(self, machine: str) -> list[tuple[dict[str, Any], float, float]]:
        """(study row, reference us, modeled us on ``machine``) for every point, in the study's order."""
        return [(r, r["reference_us"], r["modeled_us"][machine]) for r in self.result["points"]]

    def table(self) -> list[dict[str, Any]]:
        """One row per point: what it is, its reference, and the modeled time and error on each machine."""
        return [{"point": r["label"], "category": r["category"], "reference": r["kind"],
                 "reference_us": r["reference_us"],
                 **{f"{m}_us": r["modeled_us"][m] for m in MACHINES},
                 **{f"{m}_error_pct": r["error_pct"][m] for m in MACHINES}} for r in self.result["points"]]

    def axis_range(self) -> tuple[float, float]:
        """The one log10 range both axes use: every reference and modeled time on both machines, padded."""
        values = [v for m in MACHINES for _, x, y in self.points(m) for v in (x, y)]
        return math.log10(min(values) / PAD), math.log10(max(values) * PAD)

    # --- the figure ---------------------------------------------------------------------------
    @property
    def caption(self) -> str:  # type: ignore[override]
        shown = " and ".join(f"{m} ({'filled' if m == 'measured' else 'open'})" for m in self.machines)
        return (f"Each marker is one reference kernel: its reference time (x: measured on the card, or torch-spyre's "
                f"fitted cost model) against its analytic modeled time (y) on the {shown} machine. On the diagonal "
                "the model agrees; each shaded band is the category's RMS error of torch-spyre's model against "
                "hardware. Hover a marker for its source and error.")

    def make_controls(self) -> list[W.Widget]:
        return [self.bind("machine", toggle(CHOICES, self.machine, "machine"))]

    def on_change(self, name: str) -> None:
        """Replace the traces, sent once. The toggle changes which traces exist (the connector comes and goes, the
        markers change machine), and an update in place would leave a removed trace's properties on the one taking
        its slot: after "measured" then "both", the connector kept a category's legend group and marker meta."""
        if self._fig_widget is None:
            return
        with self._fig_widget.batch_update():
            self._fig_widget.data = ()
            self.refresh()

    def band_traces(self) -> list[dict[str, Any]]:
        """Per category, the band ``reference x (1 ± RMS)`` over the category's reference times."""
        traces = []
        for cat, c in self.result["categories"].items():
            band = c.get("band_pct")
            if band is None:
                continue
            refs = [r["reference_us"] for r in self.result["points"] if r["category"] == cat]
            lo, hi = min(refs) / BAND_REACH, max(refs) * BAND_REACH
            f = band / 100
            traces.append(dict(
                type="scatter", x=[lo, hi, hi, lo, lo], y=[lo * (1 + f), hi * (1 + f), hi * (1 - f), lo * (1 - f),
                                                           lo * (1 + f)],
                mode="lines", fill="toself", fillcolor=_rgba(self.category_color(cat), BAND_ALPHA),
                line=dict(width=0), legendgroup=cat, showlegend=False, name=f"{cat} band ±{band:.1f}%",
                meta={"category": cat, "band_pct": band}, hoveron="fills", hoverinfo="text",
                text=f"{html.escape(cat)}: torch-spyre's model is within {band:.1f}% RMS of hardware"))
        return traces

    def marker_traces(self) -> list[dict[str, Any]]:
        """One trace per (machine, category): markers at (reference, modeled), the hover naming each point."""
        traces = []
        for machine in self.machines:
            for cat in self.categories:
                mine = [(r, x, y) for r, x, y in self.points(machine) if r["category"] == cat]
                color = self.category_color(cat)
                traces.append(dict(
                    type="scatter", x=[x for _, x, _ in mine], y=[y for _, _, y in mine], mode="markers",
                    name=f"{cat} · {machine}", legendgroup=cat,
                    meta={"machine": machine, "category": cat, "keys": [r["key"] for r, _, _ in mine]},
                    marker=dict(symbol=SYMBOLS[machine], size=11, color=color,
                                line=dict(color=NEUTRAL["white"] if machine == "measured" else color, width=1.5)),
                    hovertext=[self.hover(r, machine) for r, _, _ in mine], hoverinfo="text"))
        return traces

    def hover(self, row: dict[str, Any], machine: str) -> str:
        """What a marker says: the kernel, where its reference comes from, both times and the error."""
        return (f"<b>{html.escape(row['label'])}</b> ({html.escape(row['category'])})<br>"
                f"reference {row['reference_us']:.2f} µs, {REFERENCE_KIND.get(row['kind'], row['kind'])}<br>"
                f"modeled {row['modeled_us'][machine]:.2f} µs on {machine}: error "
                f"{row['error_pct'][machine]:+.1f}%<br><i>{html.escape(row['source'])}</i>")

    def connector_trace(self) -> dict[str, Any]:
        """With both machines shown, a thin line joins each kernel's two modeled times (same x)."""
        xs: list[float | None] = []
        ys: list[float | None] = []
        for r in self.result["points"]:
            xs += [r["reference_us"], r["reference_us"], None]
            ys += [r["modeled_us"]["measured"], r["modeled_us"]["datasheet"], None]
        return dict(type="scatter", x=xs, y=ys, mode="lines", line=dict(color=NEUTRAL["rule"], width=1),
                    name="one kernel on both machines", hoverinfo="skip", showlegend=True)

    def build(self) -> go.Figure:
        """The diagonal, the category bands, then the markers of the machines shown (plain dicts)."""
        lo, hi = self.axis_range()
        ends = [10 ** lo, 10 ** hi]
        traces: list[dict[str, Any]] = [
            dict(type="scatter", x=ends, y=ends, mode="lines", line=dict(color=NEUTRAL["muted"], width=1, dash="dash"),
                 name="modeled = reference", hoverinfo="skip"),
            *self.band_traces()]
        if self.machine == "both":
            traces.append(self.connector_trace())
        traces += self.marker_traces()
        which = "measured + datasheet" if self.machine == "both" else f"{self.machine} machine"
        layout = base_layout(f"Fidelity: modeled vs reference time per kernel, {which} (analytic)",
                             height=self.figure_height)
        frame, _ = cached_subplots(rows=1, cols=1, template="plotly_white", height=self.figure_height)
        layout = {**frame, **{k: v for k, v in layout.items() if k != "template"}}   # the template as data
        axis = dict(type="log", range=[lo, hi], showgrid=True, constrain="domain")
        layout.update(
            legend=dict(orientation="v", x=1.02, xanchor="left", y=1.0, font=dict(size=10)),
            margin=dict(l=70, r=230, t=70, b=55),
            xaxis=frame.get("xaxis", {}) | axis | dict(
                title=dict(text="reference time (µs): measured, or torch-spyre's fitted model")),
            yaxis=frame.get("yaxis", {}) | axis | dict(title=dict(text="modeled time (µs)"), scaleanchor="x",
                                                       scaleratio=1))
        return go.Figure(dict(data=traces, layout=layout), _validate=False)
