"""DecodeTimeline: what every engine step did, on the host and on the modeled card, for one run or two side by side.

Four rows per run, steps on the x axis of the first three:

1. **batch**: real tokens fed per request, and the padding a static-shape bucket added;
2. **modeled device time** per step (prefill, decode, or mixed: both in one pass): the span of its modeled events;
3. **measured host time** per step, split into the engine's phases (schedule, prepare inputs, forward, sample);
4. **one step** (the slider picks it) on the modeled clock: the host thread (enqueue, rebuild, waits), program
   correction (host callbacks), PCIe, and the card's kernels, one lane per layer, each kernel in its own color.

Everything comes from ``llm.stats`` (``EngineStats.details``, recorded by the engine each step), a saved
``EngineStats.save_json`` file, or a trace from ``stats.to_trace(device=True)``. Two runs (``rebuild`` vs
``aot_patch`` dispatch, ``cpu`` vs ``spyre`` platform) share axes so their lengths compare directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spyre_lab.device.trace import card_of_lane
from spyre_lab.viz import style
from spyre_lab.viz.base import View, base_layout, note_annotation
from spyre_lab.viz.sources import Run, as_run, symmetric_cards

if TYPE_CHECKING:
    from spyre_lab.engine.stats import StepDetail

from spyre_lab.viz.step_lanes import collective_lane, step_lanes
from spyre_lab.viz.timeline_cards import flow_spec

#: above this many requests in a run, the batch row draws real tokens as one series instead of one per request
MAX_REQUEST_SERIES = 16
# ---- the view --------------------------------------------------------------------------------------------
class DecodeTimeline(View):
    """Per engine step: batch and padding, modeled device time, measured host phases, and one step's lanes.

    ``DecodeTimeline(llm)``, ``DecodeTimeline(llm.stats)``, ``DecodeTimeline("stats.json")``, or two runs side by
    side: ``DecodeTimeline({"rebuild": stats_a, "aot_patch": stats_b})``. The step slider picks the step drawn in
    the bottom row (the same step number in every run).
    """

    figure_height = 980

    def __init__(self, runs: Any, step: int | None = None, include_warmup: bool = False) -> None:
        super().__init__()
        if isinstance(runs, Mapping) and not ("steps" in runs or "traceEvents" in runs):
            self.runs = [as_run(src, str(label)) for label, src in runs.items()]
        elif isinstance(runs, (list, tuple)):
            self.runs = [as_run(src, f"run {i}") for i, src in enumerate(runs)]
        else:
            self.runs = [as_run(runs, "run")]
        if not self.runs:
            raise ValueError("DecodeTimeline needs at least one run")
        if len(self.runs) > 3:
            raise ValueError(f"DecodeTimeline shows up to 3 runs side by side, got {len(self.runs)}")
        self.include_warmup = include_warmup
        self._step_slots: dict[int, list[int]] = {}
        self._reasons: dict[tuple[int, bool], str] = {}
        self._mirrored: list[int] = []
        self._recorded: list[int] = []  # cards whose collectives the step's trace holds as recorded by their rank
        served = [r for run in self.runs for r in (run.rows if include_warmup else run.served)]
        if not served:
            raise ValueError("the run has no served steps yet; call llm.generate(...) first")
        self.steps = sorted({r["step"] for r in served})
        self.step = step if step is not None else self._default_step()
        if self.step not in self.steps:
            raise ValueError(f"step {self.step} is not a served step of this run; steps are {self.steps[0]}.."
                             f"{self.steps[-1]}")

    @property
    def caption(self) -> str:  # type: ignore[override]
        labels = " vs ".join(r.label for r in self.runs)
        why = "; ".join(f"{r.label}: " * (len(self.runs) > 1) + text.replace("<br>", " ") for r in self.runs
                        if (text := self._same_cost(r)))
        return (f"Engine steps ({labels}): tokens fed and bucket padding, modeled device ms, measured host ms by "
                f"phase; bottom: step {self.step} on the modeled clock (µs), kernels by layer."
                + (f" Why the steps cost the same: {why}." if why else "") + self._cards_note())

    def _cards_note(self) -> str:
        """What the per-card collective lanes are drawn from (recorded, or mirrored from a symmetric rank)."""
        if not self._mirrored:
            if len(self._recorded) < 2:
                return ""
            return (" Collectives: one lane per card, lines join each collective to its peers; each card's lane is "
                    "its own rank's recording (every card has its own modeled clock: the ranks' steps are aligned at "
                    "their first event).")
        cards = ", ".join(str(c) for c in self._mirrored)
        which = f"cards {cards} are" if len(self._mirrored) > 1 else f"card {cards} is"
        return (f" Collectives: one lane per card, lines join each collective to its peers; {which} drawn "
                "from the recorded rank's timing (tensor-parallel ranks are symmetric).")

    def _default_step(self) -> int:
        """The first decode step that has device events (the per-token cost), else the first step."""
        for s in self.steps:
            for run in self.runs:
                row = next((r for r in run.rows if r["step"] == s), None)
                detail = run.details.get(s)
                if row and row["kind"] == "decode" and detail is not None and detail.device_trace is not None:
                    return s
        decode = [r["step"] for run in self.runs for r in run.served if r["kind"] == "decode"]
        return min(decode) if decode else self.steps[0]

    # ---- controls ------------------------------------------------------------------------------------
    def make_controls(self) -> list[W.Widget]:
        slider = W.SelectionSlider(options=self.steps, value=self.step, description="step",
                                   continuous_update=False, layout=W.Layout(width="420px"))
        return [self.bind("step", slider)]

    # ---- the figure ----------------------------------------------------------------------------------
    def build(self) -> go.Figure:
        self._step_slots = {}
        n = len(self.runs)
        titles = []
        for row_title in ("tokens fed per step (real, by request; padding)",
                          "device time per step (modeled ms): card computing, waiting for the host",
                          "host time per step by phase (measured wall ms)", None):
            for run in self.runs:
                if row_title is None:
                    row_title_run = f"step {self.step} (modeled µs): {self._step_summary(run)}"
                else:
                    row_title_run = row_title
                titles.append(f"{run.label}: {row_title_run}" if n > 1 else row_title_run)
        fig = make_subplots(rows=4, cols=n, subplot_titles=titles, vertical_spacing=0.075, horizontal_spacing=0.08,
                            row_heights=[0.19, 0.16, 0.16, 0.49], shared_xaxes=False)
        notes = []
        span = 0.0
        for c, run in enumerate(self.runs, start=1):
            rows = run.rows if self.include_warmup else run.served
            notes += self._batch_row(fig, run, rows, c)
            self._device_row(fig, run, rows, c)
            self._host_row(fig, run, rows, c)
            span = max(span, self._step_row(fig, run, c))
            for r in (1, 2, 3):
                fig.add_vline(x=self.step, line=dict(color="#444", width=1, dash="dot"), row=r, col=c)
                fig.update_xaxes(range=[rows[0]["step"] - 0.6, rows[-1]["step"] + 0.6], row=r, col=c)
            fig.update_xaxes(title_text=style.MODELED_TIME_AXIS, row=4, col=c)
            fig.update_yaxes(title_text="tokens", row=1, col=c)
            fig.update_yaxes(title_text="modeled ms", row=2, col=c)
            fig.update_yaxes(title_text="wall ms", row=3, col=c)
        for c in range(1, n + 1):
            if span > 0:
                fig.update_xaxes(range=[0, span * 1.02], row=4, col=c)
            for r, key in ((2, "device"), (3, "host")):
                top = self._row_top(key)
                room = 1.75 if r == 2 and any(self._same_cost(run) for run in self.runs) else 1.05   # the note
                if top > 0:
                    fig.update_yaxes(range=[0, top * room], row=r, col=c)
        for label, color in (("host: enqueue / launch", style.UNIT_COLORS["host"]),
                             ("host: rebuild graph", style.REBUILD_COLOR),
                             ("host: waits for the card", style.UNIT_COLORS["idle"]),
                             ("PCIe", style.UNIT_COLORS["pcie"])):
            fig.add_bar(x=[None], y=[None], name=label, marker_color=color, legendgroup=f"lane-{label}",
                        row=4, col=1)
        mode = " vs ".join(f"{r.label}" for r in self.runs)
        layout = base_layout(f"DecodeTimeline — engine steps and one step's modeled lanes ({mode})",
                             height=self.figure_height)
        layout.update(barmode="stack", bargap=0.15, legend=dict(orientation="h", y=-0.06, x=0, xanchor="left"))
        fig.update_layout(**layout)
        for note in notes:
            fig.add_annotation(note_annotation(note))
        return fig

    def _batch_row(self, fig: go.Figure, run: Run, rows: list[dict], col: int) -> list[str]:
        steps = [r["step"] for r in rows]
        requests: dict[str, dict[int, int]] = {}
        for r in rows:
            detail = run.details.get(r["step"])
            if detail is None:
                continue
            for request_id, tokens in detail.batch:
                requests.setdefault(str(request_id), {})[r["step"]] = tokens
        show_legend = col == 1
        notes = []
        if len(requests) > MAX_REQUEST_SERIES or not requests:
            if requests:
                notes.append(f"{run.label}: {len(requests)} requests drawn as one series (over "
                             f"{MAX_REQUEST_SERIES}); hover a bar for its batch")
            fig.add_bar(x=steps, y=[r["num_tokens"] for r in rows], name="real tokens",
                        marker_color=style.STEP_KIND_COLORS["prefill"], legendgroup="real", showlegend=show_legend,
                        hovertemplate="step %{x}: %{y} real tokens<extra></extra>", row=1, col=col)
        else:
            for request_id, per_step in requests.items():
                fig.add_bar(x=steps, y=[per_step.get(s, 0) for s in steps], name=f"request {request_id}",
                            marker_color=style.request_color(request_id), legendgroup=f"req{request_id}",
                            showlegend=show_legend,
                            hovertemplate=f"step %{{x}}: request {request_id} fed %{{y}} tokens<extra></extra>",
                            row=1, col=col)
        fig.add_bar(x=steps, y=[r["padded_tokens"] for r in rows], name="bucket padding",
                    marker=dict(color=style.STEP_KIND_COLORS["padding"], pattern=dict(shape="/")),
                    legendgroup="padding", showlegend=show_legend,
                    customdata=[[_bucket_text(r)] for r in rows],
                    hovertemplate="step %{x}: %{y} padding tokens (%{customdata[0]})<extra></extra>", row=1, col=col)
        return notes

    def _device_row(self, fig: go.Figure, run: Run, rows: list[dict], col: int) -> None:
        """Per step, the card's kernel time (in the step's kind color) stacked under the rest of the step's modeled
        span, when the card waits for the host to enqueue (hatched): a host-bound step is mostly hatch."""
        kinds = [str(r["kind"]).removeprefix("warmup-") for r in rows]
        values = [r["device_ms_modeled"] for r in rows]
        work = {r["step"]: step_work(run.details.get(r["step"])) for r in rows}
        for kind in ("prefill", "decode", "mixed"):
            picked = [(r, v) for r, v, k in zip(rows, values, kinds) if k == kind]
            if not picked:
                continue
            xs = [r["step"] for r, _ in picked]
            busy = [work[x].card_ms if work[x] and v is not None else v for x, (_, v) in zip(xs, picked)]
            fig.add_bar(x=xs, y=[0 if v is None else v for v in busy], name=kind, legendgroup=kind,
                        marker_color=style.STEP_KIND_COLORS[kind], showlegend=col == 1,
                        customdata=[["n/a (no device model)" if v is None else f"{v:.3f} ms"] for _, v in picked],
                        hovertemplate=f"step %{{x}} ({kind}): %{{customdata[0]}} modeled"
                                      + ("; the card computes %{y:.3f} ms of it" if any(work.values()) else "")
                                      + "<extra></extra>", row=2, col=col)
        waits = [(r["step"], v - work[r["step"]].card_ms) for r, v in zip(rows, values)
                 if v is not None and work[r["step"]]]
        if waits:
            fig.add_bar(x=[x for x, _ in waits], y=[w for _, w in waits], name="card waits for the host",
                        legendgroup="card-waits", showlegend=col == 1,
                        marker=dict(color=style.UNIT_COLORS["idle"], line=dict(color=style.UNIT_COLORS["host"],
                                                                                width=0.5),
                                    pattern=dict(shape="/", fgcolor=style.UNIT_COLORS["host"], size=5)),
                        hovertemplate="step %{x}: the card waits %{y:.3f} ms for the host's enqueues"
                                      "<extra></extra>", meta={"row": "device waits"}, row=2, col=col)
        why = self._same_cost(run)
        if why:
            fig.add_annotation(text=why, showarrow=False, name="same cost", align="left",
                               xref=f"{_axis('x', 2, col, len(self.runs))} domain", x=0.0, xanchor="left",
                               yref=f"{_axis('y', 2, col, len(self.runs))} domain", y=1.0, yanchor="top",
                               font=dict(size=10, color=style.NEUTRAL["text"]), bgcolor="rgba(255,255,255,0.8)")
        if all(v is None for v in values):
            fig.add_annotation(text="no device model on this platform (device time n/a)", showarrow=False,
                               xref=f"{_axis('x', 2, col, len(self.runs))} domain", x=0.5,
                               yref=f"{_axis('y', 2, col, len(self.runs))} domain", y=0.5, font=dict(color="#888"))

    def _host_row(self, fig: go.Figure, run: Run, rows: list[dict], col: int) -> None:
        steps = [r["step"] for r in rows]
        have = [run.details.get(s) for s in steps]
        if not any(have):
            fig.add_bar(x=steps, y=[r["host_ms"] for r in rows], name="host (total)",
                        marker_color=style.UNIT_COLORS["host"], showlegend=col == 1, row=3, col=col)
            return
        for phase, color in style.HOST_PHASE_COLORS.items():
            ys = [d.phases_ms.get(phase, 0.0) if d else 0.0 for d in have]
            fig.add_bar(x=steps, y=ys, name=f"host: {phase}", marker_color=color, legendgroup=f"phase-{phase}",
                        showlegend=col == 1, hovertemplate=f"step %{{x}}: {phase} %{{y:.2f}} ms (measured)"
                                                           "<extra></extra>", row=3, col=col)

    def _step_bars(self, run: Run) -> tuple[list[dict[str, Any]], list[str], float] | None:
        """The step row of one run as plain bar specs (lane order top to bottom, span), or None without events."""
        detail = run.details.get(self.step)
        if detail is None or detail.device_trace is None or not len(detail.device_trace):
            return None
        trace, self._mirrored = symmetric_cards(detail.device_trace)
        self._recorded = sorted({c for e in detail.device_trace.events if (c := card_of_lane(e.lane)) is not None})
        lanes, order = step_lanes(trace)
        bars = []
        for name in order:
            events = lanes[name]
            bars.append(dict(
                x=[e.dur_us for e, _ in events], y=[name] * len(events), base=[e.start_us for e, _ in events],
                marker=dict(color=[c for _, c in events], line=dict(width=0)), name=name,
                customdata=[[e.name, e.args.get("kind", ""), e.args.get("rule", "")] for e, _ in events],
                hovertemplate="%{customdata[0]}<br>%{base:.2f} µs + %{x:.2f} µs (modeled)<br>"
                              "%{customdata[1]} %{customdata[2]}<extra>" + name + "</extra>"))
        flows = flow_spec(trace, collective_lane)
        return bars + ([flows] if flows else []), order, detail.device_trace.duration_us

    def _step_row(self, fig: go.Figure, run: Run, col: int) -> float:
        drawn = self._step_bars(run)
        if drawn is None:
            row = next((r for r in run.rows if r["step"] == self.step), None)
            reason = "no device model on this platform" if row and row.get("device_ms_modeled") is None else \
                "no modeled events recorded for this step"
            fig.add_bar(x=[0], y=["device"], base=[0], orientation="h", showlegend=False, marker_color="white",
                        hoverinfo="skip", row=4, col=col)
            fig.add_annotation(text=f"step {self.step}: {reason}", showarrow=False, font=dict(color="#888"),
                               xref=f"{_axis('x', 4, col, len(self.runs))} domain", x=0.5,
                               yref=f"{_axis('y', 4, col, len(self.runs))} domain", y=0.5)
            return 0.0
        bars, order, span = drawn
        self._step_slots.setdefault(col, [])
        for bar in bars:
            self._step_slots[col].append(len(fig.data))
            if bar.get("type") == "scatter":
                fig.add_trace(go.Scatter(_without_type(bar)), row=4, col=col)
            else:
                fig.add_bar(**bar, orientation="h", showlegend=False, row=4, col=col)
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(order)), row=4, col=col)
        return span

    def on_change(self, name: str) -> None:
        """A new step: update the step rows and cursors of the live figure in place (a full redraw when the
        lanes differ, e.g. a run without events at this step)."""
        target = self._fig_widget
        if name != "step" or target is None or not self._step_slots:
            return self.refresh()
        drawn = [self._step_bars(run) for run in self.runs]
        slots = [self._step_slots.get(c, []) for c in range(1, len(self.runs) + 1)]
        same = all(d is not None and [b["name"] for b in d[0]] == [target.data[i].name for i in s]
                   for d, s in zip(drawn, slots))
        if not same:
            return self.refresh()
        n = len(self.runs)
        span = max(d[2] for d in drawn)  # type: ignore[index]
        with target.batch_update():
            for c, (d, s) in enumerate(zip(drawn, slots), start=1):
                bars, order, _ = d  # type: ignore[misc]
                for index, bar in zip(s, bars):
                    target.data[index].update(_without_type(bar))
                axis = _axis("y", 4, c, n).replace("y", "yaxis")
                target.layout[axis].categoryarray = list(reversed(order))
                target.layout[_axis("x", 4, c, n).replace("x", "xaxis")].range = [0, span * 1.02]
                title = f"step {self.step} (modeled µs): {self._step_summary(self.runs[c - 1])}"
                target.layout.annotations[3 * n + c - 1].text = f"{self.runs[c - 1].label}: {title}" if n > 1 else title
            for shape in target.layout.shapes:
                shape.x0 = shape.x1 = self.step
        if self._caption_widget is not None:
            self._caption_widget.value = self._caption_html()
        return None

    def _same_cost(self, run: Run) -> str:
        """:func:`same_cost_reason` for a run, computed once (every served step's trace is read)."""
        key = (id(run), self.include_warmup)
        if key not in self._reasons:
            self._reasons[key] = same_cost_reason(run, run.rows if self.include_warmup else run.served)
        return self._reasons[key]

    def _step_summary(self, run: Run) -> str:
        row = next((r for r in run.rows if r["step"] == self.step), None)
        detail = run.details.get(self.step)
        if row is None:
            return "not in this run"
        batch = ", ".join(f"r{rid}:{n}" for rid, n in detail.batch) if detail else f"{row['num_seqs']} seqs"
        span = detail.device_trace.duration_us if detail and detail.device_trace is not None else None
        return f"{row['kind']} [{batch}]" + (f", span {span:,.0f} µs" if span else "")

    def _row_top(self, key: str) -> float:
        """The largest stacked value of a row over every run, so side-by-side runs share one scale."""
        top = 0.0
        for run in self.runs:
            for r in run.rows if self.include_warmup else run.served:
                if key == "device":
                    top = max(top, r["device_ms_modeled"] or 0.0)
                else:
                    detail = run.details.get(r["step"])
                    top = max(top, sum(detail.phases_ms.values()) if detail else r["host_ms"])
        return top


@dataclass(frozen=True)
class StepWork:
    """What one step's modeled span is made of: the host's enqueues and the card's kernels."""

    span_ms: float
    card_ms: float          # the card computing (kernels and device copies on the streams)
    enqueues: int           # JobPlan steps the host enqueued
    enqueue_us: float       # host time per enqueue (SpyreConfig.host_launch_us in the trace)
    host_ms: float          # host thread busy (enqueues, corrections, rebuilds; not its waits)
    launches: int           # events on the card's streams (kernels and device copies)


def step_work(detail: StepDetail | None) -> StepWork | None:
    """A step's work from its recorded trace (None without one)."""
    trace = detail.device_trace if detail is not None else None
    if trace is None or not len(trace):
        return None
    card = host = 0.0
    launches = 0
    enqueues: list[float] = []
    for e in trace.events:
        if e.lane.startswith("stream"):
            card += e.dur_us
            launches += 1
        elif e.lane == "host" and not e.args.get("waiting"):
            host += e.dur_us
            if e.name.startswith("enqueue"):
                enqueues.append(e.dur_us)
    per = sum(enqueues) / len(enqueues) if enqueues else 0.0
    return StepWork(trace.duration_us / 1e3, card / 1e3, len(enqueues), per, host / 1e3, launches)


def same_cost_reason(run: Run, rows: list[dict]) -> str:
    """When every served step has the same modeled time, why: a host-bound step costs its enqueues, and every
    bucket's program set launches the same number of kernels, so prefill and decode cost alike. Empty otherwise."""
    values = [r["device_ms_modeled"] for r in rows if r["device_ms_modeled"] is not None]
    if len(values) < 2 or max(values) - min(values) > 5e-4 * max(values):
        return ""
    work = [w for r in rows if (w := step_work(run.details.get(r["step"])))]
    if not work or any(w.host_ms < 0.8 * w.span_ms for w in work):
        return f"every step {values[0]:.3f} ms modeled"
    counts = sorted({w.enqueues for w in work})
    launches = sorted({w.launches for w in work})
    per = work[0].enqueue_us
    card = [w.card_ms for w in work]
    kinds = list(dict.fromkeys(str(r["kind"]) for r in rows))
    same = f"every step launches {launches[0]} programs on the card" if len(launches) == 1 else \
        f"steps launch {launches[0]}–{launches[-1]} programs"
    return (f"every {' and '.join(kinds)} step: {values[0]:.3f} ms modeled, host-bound: {same},<br>"
            f"{'/'.join(map(str, counts))} host enqueues x {per:.1f} µs (SpyreConfig.host_launch_us, an estimate) "
            f"= {counts[0] * per / 1e3:.3f} ms;<br>the card computes only {min(card):.3f}–{max(card):.3f} ms of it"
            " (solid bars), waiting for the host the rest (hatched)")


def _bucket_text(row: dict) -> str:
    if row.get("token_bucket"):
        return f"prefill bucket {row['token_bucket']}"
    if row.get("batch_bucket"):
        return f"batch bucket {row['batch_bucket']}"
    return "dynamic shapes: no bucket"


def _without_type(spec: dict[str, Any]) -> dict[str, Any]:
    """A trace spec without its ``type`` key (the step row's bars and its flow lines share one list)."""
    return {k: v for k, v in spec.items() if k != "type"}


def _axis(letter: str, row: int, col: int, cols: int) -> str:
    """Plotly's axis name of subplot (row, col) in a grid ``cols`` wide: x, x2, x3, ..."""
    index = (row - 1) * cols + col
    return letter if index == 1 else f"{letter}{index}"
