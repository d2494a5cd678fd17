"""Trace: timed events on named lanes, the one record every layer writes and every figure reads.

Lanes are plain strings (``host``, ``pcie``, ``core3.load``, ``core3.pt``, ``ring``, ``engine``)
so the simulator, the runtime and the engine can all add to one trace without knowing about
each other. Times are *modeled* microseconds unless a lane says otherwise.
``to_chrome_trace`` writes the trace-event JSON that Perfetto and chrome://tracing open.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TraceEvent:
    """One busy interval on one lane."""

    lane: str
    name: str
    start_us: float
    dur_us: float
    args: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


_CORE_LANE = re.compile(r"core(\d+)\.(\w+)")
_CARD_LANE = re.compile(r"card(\d+)\.ccl")
_UNIT_ORDER = {"load": 0, "pt": 1, "sfu": 2, "store": 3, "ring": 4}


def lane_sort_key(lane: str) -> tuple:
    """Host-side lanes first, then cores in numeric order with their units in pipeline order."""
    m = _CORE_LANE.fullmatch(lane)
    if m:
        return (1, int(m.group(1)), _UNIT_ORDER.get(m.group(2), 9), m.group(2))
    fixed = {"engine": 0, "host": 1, "pcie": 2, "stream": 3}
    for prefix, rank in fixed.items():
        if lane.startswith(prefix):
            return (0, rank, 0, lane)
    card = _CARD_LANE.fullmatch(lane)
    return (2, int(card.group(1)), 0, lane) if card else (3, 0, 0, lane)


def card_of_lane(lane: str) -> int | None:
    """The card index of a collective lane (``card<rank>.ccl``, where spyreccl charges its modeled time), else None."""
    m = _CARD_LANE.fullmatch(lane)
    return int(m.group(1)) if m else None


def collective_flows(events: Iterable[TraceEvent]) -> list[tuple[TraceEvent, TraceEvent]]:
    """(collective, the same collective on a peer card) pairs, from every card to each of its peers.

    spyreccl is synchronous and c10d requires every rank to issue the group's collectives in the same order, so
    the n-th event on ``card<r>.ccl`` and the n-th on ``card<s>.ccl`` are one collective seen from two cards."""
    per_card: dict[int, list[TraceEvent]] = {}
    for e in sorted(events, key=lambda e: e.start_us):
        card = card_of_lane(e.lane)
        if card is not None:
            per_card.setdefault(card, []).append(e)
    pairs = []
    for card, own in sorted(per_card.items()):
        for peer, theirs in sorted(per_card.items()):
            if peer != card:
                pairs.extend(zip(own, theirs))
    return sorted(pairs, key=lambda pair: (pair[0].start_us, pair[0].lane, pair[1].lane))


class Trace:
    """An ordered collection of :class:`TraceEvent` with helpers to shift, merge and export."""

    def __init__(self, events: Iterable[TraceEvent] = (), meta: dict[str, Any] | None = None) -> None:
        self.events: list[TraceEvent] = list(events)
        self.meta: dict[str, Any] = dict(meta or {})

    # --- building ----------------------------------------------------------------------------
    def add(self, lane: str, name: str, start_us: float, dur_us: float, **args: Any) -> TraceEvent:
        if dur_us < 0:
            raise ValueError(f"trace event {name!r} on {lane!r} has negative duration {dur_us}")
        event = TraceEvent(lane, name, float(start_us), float(dur_us), args)
        self.events.append(event)
        return event

    def extend(self, other: Trace, offset_us: float = 0.0, lane_prefix: str = "") -> Trace:
        """Append ``other``'s events shifted by ``offset_us`` (and optionally renamed lanes)."""
        for e in other.events:
            self.events.append(TraceEvent(lane_prefix + e.lane, e.name, e.start_us + offset_us, e.dur_us, e.args))
        return self

    def shifted(self, offset_us: float) -> Trace:
        return Trace(meta=self.meta).extend(self, offset_us)

    def kept(self, keep: Callable[[str], bool]) -> Trace:
        """The events on the lanes ``keep`` accepts, in order (a trace that builds its events lazily overrides
        this so the dropped ones are never made)."""
        return Trace([e for e in self.events if keep(e.lane)], meta=dict(self.meta))

    # --- reading -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return f"Trace({len(self.events)} events on {len(self.lanes())} lanes, {self.duration_us:.2f} us modeled)"

    def lanes(self) -> list[str]:
        return sorted({e.lane for e in self.events}, key=lane_sort_key)

    def on(self, lane: str) -> list[TraceEvent]:
        return sorted((e for e in self.events if e.lane == lane), key=lambda e: e.start_us)

    @property
    def start_us(self) -> float:
        return min((e.start_us for e in self.events), default=0.0)

    @property
    def end_us(self) -> float:
        return max((e.end_us for e in self.events), default=0.0)

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    def busy_us(self, lane: str) -> float:
        """Time a lane is busy, counting overlapping events once."""
        total, cursor = 0.0, float("-inf")
        for e in self.on(lane):
            start = max(e.start_us, cursor)
            if e.end_us > start:
                total += e.end_us - start
                cursor = e.end_us
        return total

    # --- export ------------------------------------------------------------------------------
    def to_chrome_trace(self, path: str | Path | None = None) -> dict[str, Any]:
        """Trace-event JSON (Perfetto, chrome://tracing). Writes ``path`` when given.

        One process per lane group (``host``, each core, ``ring``, each card's ``card<r>.ccl``), one thread per
        lane, so Perfetto shows cores as collapsible groups with their load/pt/sfu/store units inside; each card's
        collective has a flow arrow to the same collective on each of its peers (:func:`collective_flows`).
        """
        lanes = self.lanes()
        groups: dict[str, int] = {}
        tids: dict[str, tuple[int, int]] = {}
        for lane in lanes:
            group = lane.split(".")[0]
            pid = groups.setdefault(group, len(groups) + 1)
            tids[lane] = (pid, len(tids) + 1)
        out: list[dict[str, Any]] = []
        for group, pid in groups.items():
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": group}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for lane, (pid, tid) in tids.items():
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        ordered = sorted(self.events, key=lambda e: (e.start_us, lane_sort_key(e.lane), e.name))
        for e in ordered:
            pid, tid = tids[e.lane]
            out.append({"ph": "X", "name": e.name, "cat": e.lane.split(".")[-1], "pid": pid, "tid": tid,
                        "ts": round(e.start_us, 6), "dur": round(e.dur_us, 6), "args": _jsonable(e.args)})
        for flow_id, (source, peer) in enumerate(collective_flows(self.events), start=1):
            for ph, event in (("s", source), ("f", peer)):
                pid, tid = tids[event.lane]
                out.append({"ph": ph, "id": flow_id, "name": source.name, "cat": "ccl", "pid": pid, "tid": tid,
                            "ts": round(event.start_us, 6), **({"bp": "e"} if ph == "f" else {})})
        doc = {"traceEvents": out, "displayTimeUnit": "ns",
               "otherData": {"source": "spyre_lab", "time": "modeled microseconds", **_jsonable(self.meta)}}
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=None, separators=(",", ":")))
        return doc

    @classmethod
    def from_chrome_trace(cls, source: str | Path | dict[str, Any]) -> Trace:
        """Read back a file (or dict) written by :meth:`to_chrome_trace`."""
        doc = source if isinstance(source, dict) else json.loads(Path(source).read_text())
        names: dict[tuple[int, int], str] = {}
        for ev in doc["traceEvents"]:
            if ev.get("ph") == "M" and ev.get("name") == "thread_name":
                names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
        trace = cls(meta={k: v for k, v in doc.get("otherData", {}).items() if k not in ("source", "time")})
        for ev in doc["traceEvents"]:
            if ev.get("ph") == "X":
                trace.add(names[(ev["pid"], ev["tid"])], ev["name"], ev["ts"], ev["dur"], **ev.get("args", {}))
        return trace


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
