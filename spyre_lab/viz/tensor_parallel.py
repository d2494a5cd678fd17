"""TensorParallelView: one step per TP size, split into the card's compute and the group's collectives.

Draws the rows of :func:`spyre_lab.studies.tensor_parallel.tensor_parallel_table` (or any list of its ``TPRow``):
for the bucket chosen above the figure, one stacked bar per TP size, the rank's compute (its real spyre-platform
programs, in the step kind's color) under the group's collectives (in the card-to-card link's color), with each
bar's collective share and speed-up over TP 1 on top. The ranks are symmetric, so one bar stands for every card of
its group. All times are modeled; the collectives rest on the card-to-card link *estimate* in force when the rows
were made, which the caption names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from spyre_lab.distributed.links import card_link
from spyre_lab.viz import style
from spyre_lab.viz.base import View, base_layout, toggle

LINK_HATCH = dict(shape="/", fgcolor=style.NEUTRAL["white"], size=7, solidity=0.35)
"""The collectives' segment is hatched: prefill's step-kind color is the link's, and a bar in one flat color would
hide where the card's compute ends and the collectives begin."""


def _bucket(row: Any) -> str:
    return f"{row.kind} {row.size}"


class TensorParallelView(View):
    """Per TP size, one rank's modeled compute and the group's modeled collectives for one bucket."""

    figure_height = 440

    def __init__(self, rows: Sequence[Any], bucket: str | None = None) -> None:
        super().__init__()
        self.rows = list(rows)
        if not self.rows:
            raise ValueError("TensorParallelView needs rows: pass tensor_parallel_table(...)")
        self.buckets = list(dict.fromkeys(_bucket(r) for r in self.rows))
        self.bucket = bucket or next((b for b in self.buckets if b.startswith("decode")), self.buckets[0])
        if self.bucket not in self.buckets:
            raise ValueError(f"no bucket {self.bucket!r} in these rows; they have {self.buckets}")
        self.link = card_link().describe()

    def picked(self) -> list[Any]:
        """The rows of the chosen bucket, by TP size."""
        return sorted((r for r in self.rows if _bucket(r) == self.bucket), key=lambda r: r.tp)

    @property
    def caption(self) -> str:  # type: ignore[override]
        rows = self.picked()
        best = min(rows, key=lambda r: r.step_us)
        return (f"{self.bucket}: one step per TP size (modeled ms), one rank's compute under the group's "
                f"collectives; fastest at TP {best.tp}. Collectives over {self.link}.")

    def make_controls(self) -> list[W.Widget]:
        return [self.bind("bucket", toggle(self.buckets, self.bucket, "bucket"))]

    def build(self) -> go.Figure:
        rows = self.picked()
        x = [f"TP {r.tp}" for r in rows]
        base = next((r.step_us for r in rows if r.tp == 1), None)
        kind = self.bucket.split()[0]
        fig = go.Figure(layout=base_layout(f"{self.bucket}: compute vs collectives per card (modeled)",
                                           height=self.figure_height))
        fig.add_bar(x=x, y=[r.compute_us / 1e3 for r in rows], name="card computes (one rank's programs)",
                    marker_color=style.STEP_KIND_COLORS.get(kind, style.UNIT_COLORS["pt"]),
                    hovertemplate="%{x}: compute %{y:.2f} ms (modeled)<extra></extra>")
        fig.add_bar(x=x, y=[r.collective_us / 1e3 for r in rows], name="collectives (card-to-card link, estimate)",
                    marker_color=style.UNIT_COLORS["link"], marker_pattern=LINK_HATCH,
                    customdata=[[r.collectives, r.collective_latency_us / 1e3] for r in rows],
                    hovertemplate="%{x}: %{customdata[0]} collectives, %{y:.2f} ms (modeled), "
                                  "%{customdata[1]:.2f} ms of it message latency<extra></extra>")
        for label, r in zip(x, rows):
            speedup = f", {base / r.step_us:.2f}x faster" if base else ""
            fig.add_annotation(x=label, y=r.step_us / 1e3, text=f"{r.collective_share:.1%} collectives{speedup}",
                               showarrow=False, yanchor="bottom", font=dict(size=11), name="share")
        fig.update_layout(barmode="stack", yaxis_title="step (modeled ms)", xaxis_title="cards (tensor parallel)",
                          legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0))
        return fig
