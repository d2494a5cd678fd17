"""DataflowView: cores x time, one lane per unit, with a cursor that steps through one core's firings.

What a learner should see is the dataflow rule at work: an op fires when its last operand lands, its
unit is free and LX has room. So the view draws every core's load / PT / SFU / store / ring lanes, and a
step slider (with a play button) moves a cursor over the selected core's firings; at each step it names
the op that fired, the arrival that triggered it (the dep that finished last, recorded by
``device/sim_event.py`` as ``trigger``), what waited, and which buffers sit in that core's LX, with the
core's LX occupancy over time underneath. A toggle switches between the event simulator (every tile op)
and the analytic model (one span per unit and core); a dropdown zooms into one kernel.

Big traces: above ``DETAIL_LIMIT`` events in the visible window a lane's events are merged into busy
spans (gaps shorter than a bucket are closed) until at most ``SPAN_BUDGET`` spans remain, and the figure
says so. A 4096^3 matmul (~200k tile ops) stays well under 2 MB of figure JSON.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from spyre_lab.device.config import SPYRE, SpyreConfig, get_config
from spyre_lab.device.trace import Trace, TraceEvent, lane_sort_key
from spyre_lab.viz.base import View, aggregation_note, cached_subplots, dropdown, note_annotation, toggle
from spyre_lab.viz.style import MODELED_TIME_AXIS, NEUTRAL, UNIT_COLORS, kernel_color, lane_unit

DETAIL_LIMIT = 2500
"""Above this many events in the visible window, lanes are drawn as merged busy spans (the figure says so)."""
SPAN_BUDGET = 12_000
"""Most busy spans drawn when aggregating (gaps are closed at growing widths until the count fits)."""
LX_POINTS = 3000
"""Most points of the LX occupancy curve; beyond, it is the max per time bucket (the figure says so)."""
ALL = "all kernels"

_CORE = re.compile(r"core(\d+)\.(\w+)")
_UNITS = ("load", "pt", "sfu", "store", "ring")
_UNIT_LABEL = {"load": "load", "pt": "PT", "sfu": "SFU", "store": "store", "ring": "ring"}


@dataclass
class _Kernel:
    name: str
    start: float
    end: float
    rule: str = ""
    launch_us: float = 0.0


@dataclass
class _Timeline:
    """One mode's trace, indexed for drawing: events by lane (numpy), by core (sorted), kernel spans."""

    trace: Trace
    mode: str
    lanes: list[str]
    starts: dict[str, np.ndarray]
    ends: dict[str, np.ndarray]
    index: dict[str, np.ndarray]                       # lane -> positions in ``events``
    events: list[TraceEvent]
    kernels: list[_Kernel]
    cores: list[int]
    detailed: bool                                     # tile-level events with idx / trigger args
    by_core: dict[int, list[int]] = field(default_factory=dict)   # core -> event positions sorted by start

    @classmethod
    def of(cls, trace: Trace, mode: str) -> _Timeline:
        events = [e for e in trace.events if not e.lane.startswith("stream")]
        kernel_events = sorted((e for e in trace.events if e.lane.startswith("stream")), key=lambda e: e.start_us)
        kernels = [_Kernel(e.name, e.start_us, e.end_us, str(e.args.get("rule", "")), float(e.args.get("launch_us", 0)))
                   for e in kernel_events]
        if not kernels and events:
            name = str(trace.meta.get("kernel") or trace.meta.get("program") or "kernel")
            launch = float(trace.meta.get("launch_us", 0.0))
            kernels = [_Kernel(name, min(e.start_us for e in events) - launch, max(e.end_us for e in events), "",
                               launch)]
        per_lane: dict[str, list[int]] = {}
        by_core: dict[int, list[int]] = {}
        detailed = False
        for i, e in enumerate(events):
            per_lane.setdefault(e.lane, []).append(i)
            m = _CORE.fullmatch(e.lane)
            if m:
                by_core.setdefault(int(m.group(1)), []).append(i)
                if not detailed and "idx" in e.args:
                    detailed = True
        lanes = sorted(per_lane, key=lane_sort_key)
        starts, ends, index = {}, {}, {}
        for lane in lanes:
            pos = np.asarray(per_lane[lane], dtype=np.int64)
            s = np.fromiter((events[i].start_us for i in per_lane[lane]), float, len(pos))
            d = np.fromiter((events[i].dur_us for i in per_lane[lane]), float, len(pos))
            order = np.argsort(s, kind="stable")
            starts[lane], ends[lane], index[lane] = s[order], (s + d)[order], pos[order]
        for pos in by_core.values():
            pos.sort(key=lambda i: (events[i].start_us, events[i].args.get("idx", 0)))
        return cls(trace, mode, lanes, starts, ends, index, events, kernels, sorted(by_core), detailed, by_core)


class DataflowView(View):
    """Cores x time with load / PT / SFU / store / ring lanes and a cursor stepping through one core's firings.

    ``source`` is a :class:`~spyre_lab.device.trace.Trace` (a simulator or runtime trace, or a saved one via
    :meth:`from_json`), a :class:`~spyre_lab.compiler.program.Program` (its device kernels laid end to end,
    both timing modes available), a ``KernelSpec``, a device ``TileProgram`` or a ``SimResult``.
    """

    figure_height = 640

    def __init__(self, source: Any, mode: str | None = None, core: int | None = None, kernel: str | None = None,
                 cfg: SpyreConfig | None = None) -> None:
        super().__init__()
        self._builders: dict[str, Any] = {}
        self._timelines: dict[str, _Timeline] = {}
        self._plans: dict[str, Any] = {}      # kernel name -> the compiler's LXPlan (when the source carries one)
        self.name, self.cfg, default_mode = self._adopt(source, cfg)
        self.mode = mode or default_mode
        if self.mode not in self._builders:
            raise ValueError(f"DataflowView: no {self.mode!r} timing for this source; available: "
                             f"{sorted(self._builders)} (a saved trace holds only the mode it was recorded in)")
        tl = self.timeline()
        if kernel is None:   # several kernels with tiles to step through: open on the one with the most tile ops
            busiest = max(tl.kernels, key=lambda k: _count(tl, k.start, k.end)) if tl.kernels else None
            kernel = busiest.name if busiest is not None and tl.detailed and len(tl.kernels) > 1 else ALL
        self.kernel = kernel
        if kernel != ALL and kernel not in [k.name for k in tl.kernels]:
            raise ValueError(f"DataflowView: no kernel {kernel!r}; kernels are {[k.name for k in tl.kernels]}")
        if core is None:
            core = tl.cores[0] if tl.cores else 0
        self.core = core
        self.step = self._default_step()
        self._muted = False

    # --- sources ---------------------------------------------------------------------------------
    def _adopt(self, source: Any, cfg: SpyreConfig | None) -> tuple[str, SpyreConfig, str]:
        from spyre_lab.compiler.program import Program
        from spyre_lab.device.isa import TileProgram
        from spyre_lab.device.sim import SimResult, simulate

        if isinstance(source, Trace):
            # a runtime recording names no mode: tile-level events (with op indices) mean event timing
            tiles = any("idx" in e.args for e in source.events if e.lane.startswith("core"))
            mode = str(source.meta.get("mode") or ("event" if tiles else "analytic"))
            self._builders[mode] = lambda: source
            name = str(source.meta.get("kernel") or source.meta.get("program") or "trace")
            conf = cfg or _config_named(source.meta.get("config"))
            return name, conf, mode
        if isinstance(source, SimResult):
            sim = source
            if sim.trace is None:
                raise ValueError("this SimResult has no trace; simulate with trace=True")
            self._builders[sim.mode] = lambda: sim.trace
            self._builders.setdefault("event" if sim.mode == "analytic" else "analytic",
                                      lambda: simulate(sim.kernel, sim.cfg, mode=_other(sim.mode)).trace)
            return sim.kernel.name, sim.cfg, sim.mode
        if isinstance(source, TileProgram):
            conf = cfg or SPYRE
            for m in ("event", "analytic"):
                self._builders[m] = lambda m=m: simulate(source, conf, mode=m).trace
            return source.name, conf, "event"
        if isinstance(source, Program):
            launches = [(launch, k) for launch, k in zip(source.launches, source.kernels)
                        if hasattr(launch, "simulate")]
            for m in ("event", "analytic"):
                self._builders[m] = lambda m=m: _program_trace(source.name, launches, m)
            self._plans = {launch.name: launch.lx_plan for launch, _ in launches
                           if getattr(launch, "lx_plan", None) is not None}
            return source.name, source.cfg, "event"
        if hasattr(source, "simulate") and hasattr(source, "tile_kernel"):   # a KernelSpec
            for m in ("event", "analytic"):
                self._builders[m] = lambda m=m: _program_trace(source.name, [(source, None)], m)
            if getattr(source, "lx_plan", None) is not None:
                self._plans = {source.name: source.lx_plan}
            return source.name, source.cfg, "event"
        if isinstance(source, dict) and "launches" in source:
            raise ValueError("a saved program JSON holds no tile programs to simulate; save the run's trace "
                             "(trace.to_chrome_trace(path)) and open that, or pass the Program itself")
        raise TypeError(f"DataflowView takes a Trace, Program, KernelSpec, TileProgram or SimResult, "
                        f"got {type(source).__name__}")

    def timeline(self, mode: str | None = None) -> _Timeline:
        mode = mode or self.mode
        if mode not in self._timelines:
            self._timelines[mode] = _Timeline.of(self._builders[mode](), mode)
        return self._timelines[mode]

    @property
    def trace(self) -> Trace:
        """The trace drawn in the current mode (drop one level: read its events as data)."""
        return self.timeline().trace

    # --- derived state ---------------------------------------------------------------------------
    def window(self) -> tuple[float, float]:
        tl = self.timeline()
        for k in tl.kernels:
            if k.name == self.kernel:      # the tiles, not the launch before them (the caption says so)
                first = k.start + k.launch_us
                return max(k.start, first - 0.03 * (k.end - first)), k.end
        if not tl.events:
            return 0.0, 1.0
        t0 = min(float(tl.starts[lane][0]) for lane in tl.lanes)
        t1 = max(float(tl.ends[lane].max()) for lane in tl.lanes)
        return t0, max(t1, t0 + 1e-9)

    def steps(self) -> list[int]:
        """Event positions of the selected core's firings inside the window, in firing order."""
        tl = self.timeline()
        if not tl.detailed:
            return []
        t0, t1 = self.window()
        return [i for i in tl.by_core.get(self.core, []) if t0 - 1e-9 <= tl.events[i].start_us <= t1 + 1e-9]

    def _default_step(self) -> int:
        """The firing nearest the selected core's LX peak: where most tiles sit in LX at once."""
        steps = self.steps()
        if not steps:
            return 0
        t, occ = self.lx_occupancy()
        if len(occ) == 0:
            return 0
        t_peak = t[int(np.argmax(occ))]
        starts = np.array([self.timeline().events[i].start_us for i in steps])
        return int(np.clip(np.searchsorted(starts, t_peak, side="right") - 1, 0, len(steps) - 1))

    def lx_occupancy(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, bytes) of the selected core's LX in use, as a step function over the window."""
        tl = self.timeline()
        claims = [(e.start_us, float(e.args["lx_held_us"]), int(e.args.get("buffer_bytes", 0)))
                  for e in (tl.events[i] for i in tl.by_core.get(self.core, [])) if "lx_held_us" in e.args]
        if not claims:
            return np.zeros(0), np.zeros(0)
        arr = np.round(np.array(claims, dtype=float), 6)   # saved traces keep 6 decimals of start and hold alike
        t = np.round(np.concatenate([arr[:, 0], arr[:, 0] + arr[:, 1]]), 6)
        delta = np.concatenate([arr[:, 2], -arr[:, 2]])
        order = np.lexsort((delta, t))       # at equal times, releases before claims
        return t[order], np.cumsum(delta[order])

    def planned_lx_peak(self) -> tuple[str, int] | None:
        """(kernel, bytes) of the compiler's planned LX footprint (``LXPlan.peak``) for the kernel in view: the
        selected kernel, or the largest plan among the kernels drawn; None when the source carries no plan."""
        if not self._plans:
            return None
        if self.kernel in self._plans:
            return self.kernel, int(self._plans[self.kernel].peak)
        t0, t1 = self.window()
        shown = [k.name for k in self.timeline().kernels if k.name in self._plans and k.end >= t0 and k.start <= t1]
        if not shown:
            return None
        name = max(shown, key=lambda n: self._plans[n].peak)
        return name, int(self._plans[name].peak)

    def lx_peak_text(self, resident_bytes: float) -> str:
        """The LX panel's label: the simulated resident peak and, beside it, the plan's footprint, each named by
        what it counts (the figure's notes say how they differ)."""
        text = f"resident peak {resident_bytes:,.0f} B ({resident_bytes / 1024:,.0f} KiB), simulated"
        planned = self.planned_lx_peak()
        if planned is not None:
            name, peak = planned
            which = "" if name == self.kernel or len(self._plans) == 1 else f" ({html.escape(name)})"
            text += f"<br>planned footprint{which} {peak:,} B ({peak / 1024:,.0f} KiB), LXPlan.peak"
        return text

    def lx_peak_note(self) -> str:
        """Why the two LX peaks differ: they count different things."""
        note = (f"LX resident peak: bytes of the buffers holding data at one moment on core {self.core} "
                f"({self.mode} simulation)")
        if self.planned_lx_peak() is not None:
            note += ("; planned footprint: the highest LX address the compiler's plan reserves, where each buffer "
                     "keeps its range for its whole lifetime, so holes between buffers count")
        return note + f"; LX per core {self.cfg.lx_bytes:,} B"

    def resident(self, t: float) -> list[TraceEvent]:
        """The selected core's LX buffers claimed at time ``t`` (the op that fires at ``t`` included)."""
        tl = self.timeline()
        out = []
        for i in tl.by_core.get(self.core, []):
            e = tl.events[i]
            if "lx_held_us" in e.args and e.start_us <= t + 1e-9 < e.start_us + float(e.args["lx_held_us"]):
                out.append(e)
        return out

    def firing(self, step: int | None = None) -> dict[str, Any] | None:
        """What fired at a step on the selected core and why then: the op, its trigger, and what it waited for."""
        steps = self.steps()
        if not steps:
            return None
        tl = self.timeline()
        step = min(max(self.step if step is None else step, 0), len(steps) - 1)
        e = tl.events[steps[step]]
        out: dict[str, Any] = {"event": e, "step": step, "steps": len(steps), "trigger": None, "waited": ""}
        trig_idx = e.args.get("trigger")
        if trig_idx is not None:
            k0, k1 = next(((k.start, k.end) for k in tl.kernels if k.start - 1e-9 <= e.start_us <= k.end + 1e-9),
                          (float("-inf"), float("inf")))          # op indices restart in every kernel
            trig = next((tl.events[i] for i in tl.by_core[self.core] if tl.events[i].args.get("idx") == trig_idx
                         and k0 - 1e-9 <= tl.events[i].start_us <= k1 + 1e-9), None)
            out["trigger"] = trig
            if trig is not None and e.start_us > trig.end_us + 1e-6:
                same_lane = [tl.events[i] for i in tl.by_core[self.core]
                             if tl.events[i].lane == e.lane and tl.events[i].end_us <= e.start_us + 1e-6
                             and tl.events[i] is not e]
                unit_free = max((x.end_us for x in same_lane), default=-1.0)
                if abs(unit_free - e.start_us) < 1e-6:
                    out["waited"] = f"its {_UNIT_LABEL.get(lane_unit(e.lane), 'unit')} unit was busy until then"
                else:
                    out["waited"] = "LX had no room for its buffer until one was released"
        return out

    # --- controls --------------------------------------------------------------------------------
    def make_controls(self) -> list[W.Widget]:
        tl = self.timeline()
        n = len(self.steps())
        play = W.Play(value=self.step, min=0, max=max(n - 1, 0), interval=350, description="play",
                      layout=W.Layout(width="auto"))
        slider = W.IntSlider(value=self.step, min=0, max=max(n - 1, 0), description="step",
                             continuous_update=True, readout=True, layout=W.Layout(width="320px"),
                             style={"description_width": "initial"}, disabled=n == 0)
        W.jslink((play, "value"), (slider, "value"))
        self._controls["play"] = play
        core = dropdown(tl.cores or [0], self.core, "core", "110px")
        kernel = dropdown([ALL, *[k.name for k in tl.kernels]], self.kernel, "kernel", "260px")
        mode = toggle(["event", "analytic"], self.mode)
        for v in mode.options:
            if v not in self._builders:
                mode.disabled = True
        return [play, self.bind("step", slider), self.bind("core", core), self.bind("kernel", kernel),
                self.bind("mode", mode)]

    def on_change(self, name: str) -> None:
        if self._muted:
            return
        if name == "step":
            self._update_cursor()
            return
        if name == "mode":
            tl = self.timeline()
            if self.kernel not in [k.name for k in tl.kernels]:
                self.kernel = ALL
            self._set_quietly("kernel", self.kernel)
            self._set_quietly("core", self.core, options=tl.cores or [0])
        self.step = self._default_step()
        n = len(self.steps())
        slider = self._controls.get("step")
        if slider is not None:
            self._muted = True
            try:
                slider.max = max(n - 1, 0)
                slider.value = self.step
                slider.disabled = n == 0
                self._controls["play"].max = max(n - 1, 0)
            finally:
                self._muted = False
        self.refresh()

    def _set_quietly(self, name: str, value: Any, options: list[Any] | None = None) -> None:
        control = self._controls.get(name)
        if control is None:
            return
        self._muted = True
        try:
            if options is not None:
                control.options = options
                if value not in options:
                    value = options[0]
                    setattr(self, name, value)
            control.value = value
        finally:
            self._muted = False

    def _update_cursor(self) -> None:
        if self._fig_widget is None:
            return
        shapes, annotations, bar = self._cursor_parts()
        fw = self._fig_widget
        with fw.batch_update():
            fixed_shapes = [s for s in fw.layout.shapes if s.name != "cursor"]
            fixed_notes = [a for a in fw.layout.annotations if a.name not in ("cursor", "arrow")]
            fw.layout.shapes = [*fixed_shapes, *shapes]
            fw.layout.annotations = [*fixed_notes, *annotations]
            fw.data[-1].update(bar, overwrite=True)
        if self._caption_widget is not None:
            self._caption_widget.value = self._caption_html()

    # --- drawing ---------------------------------------------------------------------------------
    @property
    def caption(self) -> str:  # type: ignore[override]
        f = self.firing()
        base = (f"Each row is one unit of one core (load, PT, SFU, store, ring) over modeled time; "
                f"{self.mode} timing.")
        if f is None:
            if self.mode == "analytic":
                return base + (" Analytic timing keeps one span per unit and core: switch to event to step "
                               "through tiles.")
            return base
        e = f["event"]
        line = (f"Core {self.core}, step {_step_words(f['step'], f['steps'])}: {e.name!r} fired at "
                f"{e.start_us:.2f} µs")
        if f["trigger"] is not None:
            line += f", when {f['trigger'].name!r} finished"
        if f["waited"]:
            line += f" (then {f['waited']})"
        return line + "."

    def build(self) -> go.Figure:
        tl = self.timeline()
        t0, t1 = self.window()
        rows = self._rows(tl)
        notes: list[str] = []
        data: list[dict] = []
        extra_notes: list[dict] = []
        visible = sum(int(((tl.ends[ln] > t0) & (tl.starts[ln] < t1)).sum()) for ln in tl.lanes)
        detailed = visible <= DETAIL_LIMIT
        gap = 0.0 if detailed else _choose_gap(tl, t0, t1)
        drawn = 0
        width = max(1.5, min(14.0, 0.55 * (self.figure_height * 0.62) / max(len(rows), 1)))
        for unit in (*_UNITS, "host", "pcie", "engine"):
            lanes = [ln for ln in rows if ln != "kernels" and lane_unit(ln) == unit]
            xs, ys, texts = [], [], []
            for lane in lanes:
                s, e, pos = _window(tl, lane, t0, t1)
                if not len(s):
                    continue
                if not detailed:
                    s, e = _merge(s, e, gap)
                drawn += len(s)
                xs.append(np.column_stack([s, e, np.full(len(s), np.nan)]).ravel())
                ys.append(np.full(3 * len(s), rows[lane], dtype=np.int16))
                if detailed:
                    for i, a, b in zip(pos, s, e):
                        txt = f"{html.escape(tl.events[i].name)}<br>{lane}: {a:.3f}–{b:.3f} µs"
                        texts += [txt, txt, ""]
            if not xs:
                continue
            trace = dict(type="scatter", x=np.concatenate(xs).astype(np.float32), y=np.concatenate(ys), mode="lines",
                         line=dict(color=UNIT_COLORS.get(unit, UNIT_COLORS["engine"]), width=width),
                         name=_UNIT_LABEL.get(unit, unit), legendgroup=unit, connectgaps=False, xaxis="x",
                         yaxis="y")
            if detailed:
                trace.update(hovertext=texts, hoverinfo="text")
            else:
                trace.update(hoverinfo="skip")
            data.append(trace)
        if not detailed:
            notes.append(aggregation_note(drawn, visible, "events", "busy spans") +
                         f" (gaps under {gap:.3g} µs closed; zoom into a kernel for tiles)")
        for k in tl.kernels:
            if k.end < t0 or k.start > t1:
                continue
            data.append(dict(type="scatter", x=[k.start, k.end], y=[rows["kernels"]] * 2, mode="lines",
                             line=dict(color=kernel_color(k.name), width=max(width, 8)), name=k.name,
                             showlegend=False, hovertext=f"{k.name} ({k.rule})" if k.rule else k.name,
                             hoverinfo="text", meta={"kernel": k.name}, xaxis="x", yaxis="y"))
        launches = [dict(type="rect", x0=k.start, x1=k.start + k.launch_us, xref="x", y0=0, y1=1, yref="y domain",
                         fillcolor=UNIT_COLORS["engine"], opacity=0.25, line=dict(width=0), layer="below",
                         name="launch")
                    for k in tl.kernels if k.launch_us > 0 and k.end >= t0 and k.start <= t1]
        launch_us = max((k.launch_us for k in tl.kernels), default=0.0)
        if launch_us and self.kernel == ALL:
            notes.append(f"grey: kernel launch, {launch_us:.1f} µs modeled before each kernel's first tile op "
                         "(SpyreConfig.kernel_launch_cycles)")
        elif launch_us:
            notes.append(f"zoomed to the tiles: the kernel's {launch_us:.1f} µs modeled launch precedes this window")
        # LX occupancy of the selected core
        lx_axis: dict[str, Any] = {"title": {"text": "KiB"}}
        t, occ = self.lx_occupancy()
        if len(t):
            keep = (t >= t0 - 1e-9) & (t <= t1 + 1e-9)
            t, occ = t[keep], occ[keep]
            if len(t) > LX_POINTS:
                t, occ, total = *_max_buckets(t, occ, LX_POINTS // 2), len(t)
                notes.append(aggregation_note(len(t), total, "LX changes", "bucket maxima"))
            data.append(dict(type="scatter", x=t.astype(np.float32), y=(occ / 1024).astype(np.float32), mode="lines",
                             line=dict(color=UNIT_COLORS["load"], shape="hv", width=1.5), fill="tozeroy",
                             name=f"LX core {self.core}", showlegend=False, xaxis="x3", yaxis="y3",
                             hovertemplate="%{y:.1f} KiB at %{x:.3f} µs<extra></extra>"))
            peak, cap = float(occ.max(initial=0)) / 1024, self.cfg.lx_bytes / 1024
            planned = self.planned_lx_peak()
            top = max(cap if peak > 0.5 * cap else peak, (planned[1] / 1024) if planned else 0.0) * 1.45 or 1.0
            lx_axis["range"] = [0, top]
            if peak > 0.5 * cap:
                launches.append(dict(type="line", x0=0, x1=1, xref="x3 domain", y0=cap, y1=cap, yref="y3",
                                     line=dict(color=NEUTRAL["rule"], dash="dot", width=1), name="capacity"))
            notes.append(self.lx_peak_note())
            extra_notes.append(dict(text=self.lx_peak_text(float(occ.max(initial=0))), xref="x3 domain",
                                    yref="y3 domain", x=1.0, y=1.0, xanchor="right", yanchor="top", showarrow=False,
                                    align="right", font=dict(size=10, color=NEUTRAL["muted"]), name="lx"))
        elif self.mode == "analytic":
            notes.append("analytic timing: one span per unit and core, no tiles to step through")
        shapes, annotations, bar = self._cursor_parts()
        data.append(dict(type="bar", xaxis="x2", yaxis="y2", **bar))
        names = list(rows)
        tickvals, ticktext = [], []
        shown_cores = sorted({int(m.group(1)) for ln in names if (m := _CORE.fullmatch(ln))})
        every = max(1, math.ceil(len(shown_cores) / 16))        # at most ~16 core labels
        labelled = set(shown_cores[::every]) | {self.core}
        for lane in names:
            m = _CORE.fullmatch(lane)
            if lane == "kernels" or not m or (m.group(2) == _first_unit(rows, int(m.group(1)))
                                              and int(m.group(1)) in labelled):
                tickvals.append(rows[lane])
                ticktext.append(lane if not m else f"core {m.group(1)}")
        band = [ln for ln in names if (m := _CORE.fullmatch(ln)) and int(m.group(1)) == self.core]
        if band:
            launches.append(dict(type="rect", x0=0, x1=1, xref="x domain", y0=rows[band[0]] - 0.5,
                                 y1=rows[band[-1]] + 0.5, yref="y", fillcolor=NEUTRAL["band"], line=dict(width=0),
                                 layer="below", name="band"))
        mode_word = "event timing: every tile op" if self.mode == "event" else "analytic timing: span per unit"
        kernel_word = "" if self.kernel == ALL else f" · kernel {self.kernel}"
        layout, _ = cached_subplots(rows=2, cols=2, shared_xaxes=True, column_widths=[0.8, 0.2],
                                    row_heights=[0.75, 0.25], vertical_spacing=0.06, horizontal_spacing=0.04,
                                    specs=[[{}, {"rowspan": 2}], [{}, None]],
                                    subplot_titles=["", "", "LX in use (selected core)"],
                                    template="plotly_white", height=self.figure_height)
        bottom = [note_annotation(text) | dict(y=-0.09, yshift=-22 * i - 18, yanchor="top")
                  for i, text in enumerate(notes)]
        layout = {**layout,
                  "title": dict(text=f"Dataflow of {html.escape(self.name)}{html.escape(kernel_word)} — {mode_word} "
                                     "(modeled µs)", x=0.01, xanchor="left", font=dict(size=15)),
                  "margin": dict(l=80, r=20, t=110, b=60 + 22 * len(notes)),
                  "legend": dict(orientation="h", yanchor="bottom", y=1.075, xanchor="right", x=1.0),
                  "bargap": 0.25, "hovermode": "closest",
                  "shapes": [*launches[:1000], *shapes],
                  "annotations": [*layout.get("annotations", []), *extra_notes, *bottom, *annotations]}
        axis = layout.get
        layout["yaxis"] = {**axis("yaxis", {}), "tickvals": tickvals, "ticktext": ticktext, "autorange": "reversed",
                           "showgrid": False, "zeroline": False}
        layout["yaxis3"] = {**axis("yaxis3", {}), **lx_axis}
        layout["xaxis"] = {**axis("xaxis", {}), "range": [t0, t1]}
        layout["xaxis3"] = {**axis("xaxis3", {}), "range": [t0, t1], "title": {"text": MODELED_TIME_AXIS}}
        layout["xaxis2"] = {**axis("xaxis2", {}), "title": {"text": "KiB in LX now<br>(selected core)"}}
        layout["yaxis2"] = {**axis("yaxis2", {}), "autorange": "reversed", "tickfont": {"size": 10}}
        return go.Figure(dict(data=data, layout=layout), _validate=False)

    def _rows(self, tl: _Timeline) -> dict[str, int]:
        """Row of each lane that has events in the window (the kernel strip first)."""
        t0, t1 = self.window()
        rows = {"kernels": 0}
        for lane in tl.lanes:
            if len(_window(tl, lane, t0, t1)[0]):
                rows[lane] = len(rows)
        return rows

    def _cursor_parts(self) -> tuple[list[dict], list[dict], dict]:
        """The step-dependent part of the figure: cursor lines, the trigger arrow, the LX bar chart."""
        tl = self.timeline()
        f = self.firing()
        bar: dict[str, Any] = dict(x=[], y=[], orientation="h", marker=dict(color=[]), name="in LX",
                                   showlegend=False, hovertemplate="%{y}: %{x:.1f} KiB<extra></extra>")
        if f is None:
            return [], [], bar
        e = f["event"]
        t = e.start_us
        shapes = [dict(type="line", x0=t, x1=t, xref=x, y0=0, y1=1, yref=f"{y} domain", name="cursor",
                       line=dict(color=NEUTRAL["cursor"], width=1.5)) for x, y in (("x", "y"), ("x3", "y3"))]
        rows = self._rows(tl)
        annotations = []
        trig = f["trigger"]
        if trig is not None and trig.lane in rows and e.lane in rows:
            annotations.append(dict(x=t, y=rows[e.lane], ax=trig.end_us, ay=rows[trig.lane], xref="x", yref="y",
                                    axref="x", ayref="y", showarrow=True, arrowhead=3, arrowsize=1.2,
                                    arrowcolor=NEUTRAL["cursor"], arrowwidth=1.5, text="", name="arrow"))
        text = (f"core {self.core} · step {_step_words(f['step'], f['steps'])}: <b>{html.escape(e.name)}</b> "
                f"({_UNIT_LABEL.get(lane_unit(e.lane), '')}) fired at {t:.3f} µs")
        if trig is not None:
            text += f", triggered by <b>{html.escape(trig.name)}</b> landing at {trig.end_us:.3f} µs"
        if f["waited"]:
            text += f"; then waited: {html.escape(f['waited'])}"
        annotations.append(dict(text=text, x=0.0, xref="paper", y=1.005, yref="paper", xanchor="left",
                                yanchor="bottom", showarrow=False, align="left", font=dict(size=11.5),
                                name="cursor"))
        res = self.resident(t)
        unit_of = {x.args.get("buffer"): lane_unit(x.lane) for x in res}
        bar.update(x=[int(x.args.get("buffer_bytes", 0)) / 1024 for x in res],
                   y=[str(x.args.get("buffer", x.name)) for x in res],
                   marker=dict(color=[UNIT_COLORS.get(unit_of[x.args.get("buffer")], UNIT_COLORS["engine"])
                                      for x in res]))
        return shapes, annotations, bar


def _step_words(step: int, steps: int) -> str:
    """The step as the slider shows it (it counts from 0): ``3 of 0–27``."""
    return f"{step} of 0–{steps - 1}"


def _other(mode: str) -> str:
    return "analytic" if mode == "event" else "event"


def _config_named(name: Any) -> SpyreConfig:
    try:
        return get_config(str(name)) if name else SPYRE
    except ValueError:
        return SPYRE


def _program_trace(name: str, launches: list[tuple[Any, Any]], mode: str) -> Trace:
    """Device kernels of a program laid end to end, as the executor lays them (host fallbacks not drawn)."""
    trace = Trace(meta={"program": name, "mode": mode})
    clock = 0.0
    for launch, kernel in launches:
        sim = launch.simulate(mode)
        if sim.trace is None:
            from spyre_lab.device.sim import simulate

            sim = simulate(launch.tile_kernel, launch.cfg, mode=mode)
        trace.extend(sim.trace, offset_us=clock)
        rule = kernel.rule if kernel is not None else getattr(launch, "rule", "")
        trace.add("stream0", launch.name, clock, sim.time_us, rule=rule, bottleneck=sim.bottleneck,
                  launch_us=sim.launch_us)
        clock += sim.time_us
    return trace


def _window(tl: _Timeline, lane: str, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s, e, pos = tl.starts[lane], tl.ends[lane], tl.index[lane]
    keep = (e > t0) & (s < t1) | ((s == e) & (s >= t0) & (s <= t1))
    return s[keep], e[keep], pos[keep]


def _count(tl: _Timeline, t0: float, t1: float) -> int:
    return sum(len(_window(tl, lane, t0, t1)[0]) for lane in tl.lanes)


def _merge(s: np.ndarray, e: np.ndarray, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Busy spans of one lane: events whose gap to the running end is at most ``gap`` are merged."""
    if len(s) == 0:
        return s, e
    run_end = np.maximum.accumulate(e)
    breaks = np.nonzero(s[1:] > run_end[:-1] + gap)[0] + 1
    first = np.concatenate([[0], breaks])
    last = np.concatenate([breaks - 1, [len(s) - 1]])
    return s[first], run_end[last]


def _choose_gap(tl: _Timeline, t0: float, t1: float) -> float:
    """The smallest gap width (a fraction of the window) that brings the busy spans under ``SPAN_BUDGET``."""
    span = t1 - t0
    for fraction in (0.0, 1 / 20000, 1 / 8000, 1 / 4000, 1 / 2000, 1 / 1000, 1 / 500, 1 / 250, 1 / 100, 1 / 30):
        gap = span * fraction
        total = sum(len(_merge(*_window(tl, ln, t0, t1)[:2], gap)[0]) for ln in tl.lanes)
        if total <= SPAN_BUDGET:
            return gap
    return span / 10


def _max_buckets(t: np.ndarray, y: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    edges = np.linspace(t[0], t[-1], buckets + 1)
    idx = np.clip(np.searchsorted(t, edges[:-1], side="left"), 0, len(t) - 1)
    idx = np.unique(idx)
    return t[idx], np.maximum.reduceat(y, idx)


def _first_unit(rows: dict[str, int], core: int) -> str:
    for lane in rows:
        m = _CORE.fullmatch(lane)
        if m and int(m.group(1)) == core:
            return m.group(2)
    return ""
