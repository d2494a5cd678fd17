"""DataflowView's lanes: one mode's trace indexed by lane and core, the window arithmetic, and the lane traces.

:class:`LaneTimeline` holds a trace's events as numpy arrays per lane (for drawing and aggregating) and as
firing order per core (for the step cursor); the functions below cut a lane to a time window and merge a
lane's events into busy spans when a window holds more events than the figure can carry.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spyre_lab.device.trace import Trace, TraceEvent, lane_sort_key
from spyre_lab.viz.base import aggregation_note
from spyre_lab.viz.style import NEUTRAL, UNIT_COLORS, lane_unit

CORE_LANE = re.compile(r"core(\d+)\.(\w+)")
"""A core's unit lane: ``core3.pt`` -> core 3, unit ``pt``."""
DETAIL_LIMIT = 2500
"""Above this many events in the visible window, lanes are drawn as merged busy spans (the figure says so)."""
UNITS = ("load", "pt", "sfu", "store", "ring")
UNIT_LABEL = {"load": "load", "pt": "PT", "sfu": "SFU", "store": "store", "ring": "ring"}
SPAN_BUDGET = 12_000
"""Most busy spans drawn when aggregating (gaps are closed at growing widths until the count fits)."""


@dataclass
class KernelSpan:
    """One kernel's span on the trace's clock (its launch overhead first)."""

    name: str
    start: float
    end: float
    rule: str = ""
    launch_us: float = 0.0


@dataclass
class LaneTimeline:
    """One mode's trace, indexed for drawing: events by lane (numpy), by core (sorted), kernel spans."""

    trace: Trace
    mode: str
    lanes: list[str]
    starts: dict[str, np.ndarray]
    ends: dict[str, np.ndarray]
    index: dict[str, np.ndarray]                       # lane -> positions in ``events``
    events: list[TraceEvent]
    kernels: list[KernelSpan]
    cores: list[int]
    detailed: bool                                     # tile-level events with idx / trigger args
    by_core: dict[int, list[int]] = field(default_factory=dict)   # core -> event positions sorted by start

    @classmethod
    def of(cls, trace: Trace, mode: str) -> LaneTimeline:
        events = [e for e in trace.events if not e.lane.startswith("stream")]
        kernel_events = sorted((e for e in trace.events if e.lane.startswith("stream")), key=lambda e: e.start_us)
        kernels = [KernelSpan(e.name, e.start_us, e.end_us, str(e.args.get("rule", "")),
                              float(e.args.get("launch_us", 0))) for e in kernel_events]
        if not kernels and events:
            name = str(trace.meta.get("kernel") or trace.meta.get("program") or "kernel")
            launch = float(trace.meta.get("launch_us", 0.0))
            kernels = [KernelSpan(name, min(e.start_us for e in events) - launch, max(e.end_us for e in events), "",
                               launch)]
        per_lane: dict[str, list[int]] = {}
        by_core: dict[int, list[int]] = {}
        detailed = False
        for i, e in enumerate(events):
            per_lane.setdefault(e.lane, []).append(i)
            m = CORE_LANE.fullmatch(e.lane)
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



def window_events(tl: LaneTimeline, lane: str, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Starts, ends and event positions of ``lane``'s events that overlap ``[t0, t1]`` (instants inside it too)."""
    s, e, pos = tl.starts[lane], tl.ends[lane], tl.index[lane]
    keep = (e > t0) & (s < t1) | ((s == e) & (s >= t0) & (s <= t1))
    return s[keep], e[keep], pos[keep]


def count_events(tl: LaneTimeline, t0: float, t1: float) -> int:
    """Events of every lane in the window."""
    return sum(len(window_events(tl, lane, t0, t1)[0]) for lane in tl.lanes)


def merge_spans(s: np.ndarray, e: np.ndarray, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Busy spans of one lane: events whose gap to the running end is at most ``gap`` are merged."""
    if len(s) == 0:
        return s, e
    run_end = np.maximum.accumulate(e)
    breaks = np.nonzero(s[1:] > run_end[:-1] + gap)[0] + 1
    first = np.concatenate([[0], breaks])
    last = np.concatenate([breaks - 1, [len(s) - 1]])
    return s[first], run_end[last]


def choose_gap(tl: LaneTimeline, t0: float, t1: float) -> float:
    """The smallest gap width (a fraction of the window) that brings the busy spans under ``SPAN_BUDGET``."""
    span = t1 - t0
    for fraction in (0.0, 1 / 20000, 1 / 8000, 1 / 4000, 1 / 2000, 1 / 1000, 1 / 500, 1 / 250, 1 / 100, 1 / 30):
        gap = span * fraction
        total = sum(len(merge_spans(*window_events(tl, ln, t0, t1)[:2], gap)[0]) for ln in tl.lanes)
        if total <= SPAN_BUDGET:
            return gap
    return span / 10


def max_buckets(t: np.ndarray, y: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """A step curve thinned to about ``buckets`` points, each the maximum of its bucket (peaks survive)."""
    edges = np.linspace(t[0], t[-1], buckets + 1)
    idx = np.clip(np.searchsorted(t, edges[:-1], side="left"), 0, len(t) - 1)
    idx = np.unique(idx)
    return t[idx], np.maximum.reduceat(y, idx)


def lx_occupancy(tl: LaneTimeline, core: int) -> tuple[np.ndarray, np.ndarray]:
    """(times, bytes) of ``core``'s LX in use, as a step function (a claim lasts its ``lx_held_us``)."""
    claims = [(e.start_us, float(e.args["lx_held_us"]), int(e.args.get("buffer_bytes", 0)))
              for e in (tl.events[i] for i in tl.by_core.get(core, [])) if "lx_held_us" in e.args]
    if not claims:
        return np.zeros(0), np.zeros(0)
    arr = np.round(np.array(claims, dtype=float), 6)   # saved traces keep 6 decimals of start and hold alike
    t = np.round(np.concatenate([arr[:, 0], arr[:, 0] + arr[:, 1]]), 6)
    delta = np.concatenate([arr[:, 2], -arr[:, 2]])
    order = np.lexsort((delta, t))       # at equal times, releases before claims
    return t[order], np.cumsum(delta[order])


def resident(tl: LaneTimeline, core: int, t: float) -> list[TraceEvent]:
    """``core``'s LX buffers claimed at time ``t`` (the op that fires at ``t`` included)."""
    out = []
    for i in tl.by_core.get(core, []):
        e = tl.events[i]
        if "lx_held_us" in e.args and e.start_us <= t + 1e-9 < e.start_us + float(e.args["lx_held_us"]):
            out.append(e)
    return out


def firing(tl: LaneTimeline, core: int, steps: list[int], step: int) -> dict[str, Any]:
    """What fired at ``steps[step]`` on ``core`` and why then: the op, the arrival that triggered it (the
    ``trigger`` the event simulator records) and, if it started later than that, what it waited for."""
    e = tl.events[steps[step]]
    out: dict[str, Any] = {"event": e, "step": step, "steps": len(steps), "trigger": None, "waited": ""}
    trig_idx = e.args.get("trigger")
    if trig_idx is None:
        return out
    k0, k1 = next(((k.start, k.end) for k in tl.kernels if k.start - 1e-9 <= e.start_us <= k.end + 1e-9),
                  (float("-inf"), float("inf")))          # op indices restart in every kernel
    trig = next((tl.events[i] for i in tl.by_core[core] if tl.events[i].args.get("idx") == trig_idx
                 and k0 - 1e-9 <= tl.events[i].start_us <= k1 + 1e-9), None)
    out["trigger"] = trig
    if trig is not None and e.start_us > trig.end_us + 1e-6:
        same_lane = [tl.events[i] for i in tl.by_core[core]
                     if tl.events[i].lane == e.lane and tl.events[i].end_us <= e.start_us + 1e-6
                     and tl.events[i] is not e]
        unit_free = max((x.end_us for x in same_lane), default=-1.0)
        if abs(unit_free - e.start_us) < 1e-6:
            out["waited"] = f"its {UNIT_LABEL.get(lane_unit(e.lane), 'unit')} unit was busy until then"
        else:
            out["waited"] = "LX had no room for its buffer until one was released"
    return out


def unit_traces(tl: LaneTimeline, rows: dict[str, int], t0: float, t1: float, width: float,
                detail_limit: int = DETAIL_LIMIT) -> tuple[list[dict], list[str]]:
    """One line trace per unit (every core's lane of it), merged into busy spans above ``detail_limit`` events in the
    window (and a note that says so)."""
    data: list[dict] = []
    notes: list[str] = []
    visible = sum(int(((tl.ends[ln] > t0) & (tl.starts[ln] < t1)).sum()) for ln in tl.lanes)
    detailed = visible <= detail_limit
    gap = 0.0 if detailed else choose_gap(tl, t0, t1)
    drawn = 0
    for unit in (*UNITS, "host", "pcie", "engine"):
        lanes = [ln for ln in rows if ln != "kernels" and lane_unit(ln) == unit]
        xs, ys, texts = [], [], []
        for lane in lanes:
            s, e, pos = window_events(tl, lane, t0, t1)
            if not len(s):
                continue
            if not detailed:
                s, e = merge_spans(s, e, gap)
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
                     name=UNIT_LABEL.get(unit, unit), legendgroup=unit, connectgaps=False, xaxis="x",
                     yaxis="y")
        if detailed:
            trace.update(hovertext=texts, hoverinfo="text")
        else:
            trace.update(hoverinfo="skip")
        data.append(trace)
    if not detailed:
        notes.append(aggregation_note(drawn, visible, "events", "busy spans") +
                     f" (gaps under {gap:.3g} µs closed; zoom into a kernel for tiles)")
    return data, notes


def lane_ticks(rows: dict[str, int], core: int, shapes: list[dict]) -> tuple[list[int], list[str]]:
    """Lane labels (one per core, at most ~16 cores named) and the band behind the selected core's lanes."""
    names = list(rows)
    tickvals, ticktext = [], []
    shown_cores = sorted({int(m.group(1)) for ln in names if (m := CORE_LANE.fullmatch(ln))})
    every = max(1, math.ceil(len(shown_cores) / 16))        # at most ~16 core labels
    labelled = set(shown_cores[::every]) | {core}
    for lane in names:
        m = CORE_LANE.fullmatch(lane)
        if lane == "kernels" or not m or (m.group(2) == _first_unit(rows, int(m.group(1)))
                                          and int(m.group(1)) in labelled):
            tickvals.append(rows[lane])
            ticktext.append(lane if not m else f"core {m.group(1)}")
    band = [ln for ln in names if (m := CORE_LANE.fullmatch(ln)) and int(m.group(1)) == core]
    if band:
        shapes.append(dict(type="rect", x0=0, x1=1, xref="x domain", y0=rows[band[0]] - 0.5,
                           y1=rows[band[-1]] + 0.5, yref="y", fillcolor=NEUTRAL["band"], line=dict(width=0),
                           layer="below", name="band"))
    return tickvals, ticktext


def _first_unit(rows: dict[str, int], core: int) -> str:
    for lane in rows:
        m = CORE_LANE.fullmatch(lane)
        if m and int(m.group(1)) == core:
            return m.group(2)
    return ""
