"""LazyTrace: a launch trace that makes its events only when someone reads them (it exists for speed).

A one-op launch emits about a hundred per-core events; copying them at every launch was the largest single cost
of a cached eager op, and most launch traces are never looked at. So a launch hands the traces that are open
(:class:`~spyre_lab.runtime.timeline.Timeline`) either events' fields or a kernel's already-timed simulator block
placed at an offset (:class:`PlacedBlock`), and the trace turns them into ``TraceEvent`` s when it is read. The
small caches here (a block's extent, the events a filter keeps) are listed with the rest of the process's state
in :mod:`~spyre_lab.runtime.process_state`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from spyre_lab.device.trace import Trace, TraceEvent


class PlacedBlock:
    """A block of already-timed events (a kernel's simulator trace) placed at an offset, not yet copied."""

    __slots__ = ("events", "lane_of", "offset_us")

    def __init__(self, events: list[TraceEvent], offset_us: float, lane_of: Callable[[str], str] | None) -> None:
        self.events, self.offset_us, self.lane_of = events, offset_us, lane_of

    def materialise(self) -> list[TraceEvent]:
        off, lane_of = self.offset_us, self.lane_of
        return [TraceEvent(e.lane if lane_of is None else lane_of(e.lane), e.name, e.start_us + off, e.dur_us, e.args)
                for e in self.events]

    def extent(self) -> tuple[float, float]:
        """(first start, last end), rounded exactly as the placed events' own start and end.

        Rounding is monotonic, so the first start is ``min(start) + offset`` and the last end is reached
        by an event that no other event beats in both start and duration: those few are kept per kernel
        trace (:func:`_frontier`) and only they are added up at each placement."""
        off = self.offset_us
        first, frontier = _frontier(self.events)
        return first + off, max((s + off) + d for s, d in frontier)

    def kept(self, keep: Callable[[str], bool]) -> PlacedBlock | None:
        """The block of the placed events on lanes ``keep`` accepts (None if none is; nothing is copied)."""
        lane_of = self.lane_of
        if lane_of is None:
            wanted = _kept_events(self.events, keep)
        else:
            wanted = [e for e in self.events if keep(lane_of(e.lane))]
        return PlacedBlock(wanted, self.offset_us, lane_of) if wanted else None


FRONTIER_CACHE: dict[int, tuple[list[TraceEvent], float, list[tuple[float, float]]]] = {}
KEPT_CACHE: dict[tuple[int, Callable[[str], bool]], tuple[list[TraceEvent], list[TraceEvent]]] = {}


def _frontier(events: list[TraceEvent]) -> tuple[float, list[tuple[float, float]]]:
    """The smallest start of ``events`` and the (start, duration) pairs not beaten in both by another event."""
    cached = FRONTIER_CACHE.get(id(events))
    if cached is None or cached[0] is not events:
        pairs = sorted({(e.start_us, e.dur_us) for e in events}, key=lambda p: (-p[0], -p[1]))
        frontier, best_dur = [], float("-inf")
        for start, dur in pairs:                 # by start, latest first: keep each longer duration
            if dur > best_dur:
                frontier.append((start, dur))
                best_dur = dur
        if len(FRONTIER_CACHE) > 512:
            FRONTIER_CACHE.clear()
        cached = FRONTIER_CACHE[id(events)] = (events, min(e.start_us for e in events), frontier)
    return cached[1], cached[2]


def _kept_events(events: list[TraceEvent], keep: Callable[[str], bool]) -> list[TraceEvent]:
    key = (id(events), keep)
    cached = KEPT_CACHE.get(key)
    if cached is None or cached[0] is not events:
        if len(KEPT_CACHE) > 512:
            KEPT_CACHE.clear()
        cached = KEPT_CACHE[key] = (events, [e for e in events if keep(e.lane)])
    return cached[1]


class LazyTrace(Trace):
    """A Trace that makes its events only when someone reads them.

    Why: a one-op launch emits about a hundred per-core events; copying them at every launch was the
    largest single cost of a cached eager op, and most launch traces are never looked at. Pending items
    are a kernel's simulator block (:class:`PlacedBlock`) or one event's fields (a tuple: lane, name, start,
    duration, args); reading ``events`` (or iterating, exporting, ``on(lane)``) turns them into
    :class:`TraceEvent` s in emission order; ``len``, ``start_us`` and ``end_us`` are answered without that.
    """

    def __init__(self, events: Iterable[TraceEvent] = (), meta: dict[str, Any] | None = None) -> None:
        self._pending: list[PlacedBlock | tuple[str, str, float, float, dict[str, Any]]] = []
        self._pending_len = 0
        super().__init__(events, meta)

    @classmethod
    def of_launch(cls, meta: dict[str, Any]) -> LazyTrace:
        """An empty trace that keeps ``meta`` itself (a dict made for it): ``LazyTrace(meta=meta)`` without the
        copy and the property calls, for the trace every launch opens."""
        trace = _new_object(cls)
        trace._pending, trace._pending_len, trace._events, trace.meta = [], 0, [], meta
        return trace

    @property  # type: ignore[override]
    def events(self) -> list[TraceEvent]:
        if self._pending:
            events = self._events
            for item in self._pending:
                if type(item) is tuple:
                    lane, name, start, dur, args = item
                    events.append(TraceEvent(lane, name, start, dur, dict(args)))
                else:
                    events.extend(item.materialise())
            self._pending.clear()
            self._pending_len = 0
        return self._events

    @events.setter
    def events(self, value: list[TraceEvent]) -> None:
        self._pending.clear()
        self._pending_len = 0
        self._events = value

    def place(self, block: PlacedBlock) -> None:
        if block.events:
            self._pending.append(block)
            self._pending_len += len(block.events)

    def add_pending(self, items: list[tuple[str, str, float, float, dict[str, Any]]]) -> None:
        """Events' fields, each made into a TraceEvent when read (``args`` is copied then)."""
        self._pending.extend(items)
        self._pending_len += len(items)

    def __len__(self) -> int:
        return len(self._events) + self._pending_len

    def kept(self, keep: Callable[[str], bool]) -> LazyTrace:
        """The events on lanes ``keep`` accepts, in order, as another LazyTrace: the dropped events are never
        made, the kept ones when read. (What a step record keeps: the engine drops the thousands of per-core
        events of every step, and most step records are never looked at.)"""
        out = LazyTrace(meta=dict(self.meta))
        out._events = [e for e in self._events if keep(e.lane)]
        for item in self._pending:
            if type(item) is tuple:
                if keep(item[0]):
                    out.add_pending([item])
            else:
                block = item.kept(keep)
                if block is not None:
                    out.place(block)
        return out

    def _bounds(self) -> tuple[float, float]:
        """(first start, last end) of every event, pending ones included, in one pass that makes no list (the
        engine asks a step's duration at every step); (0.0, 0.0) for an empty trace."""
        lo, hi = math.inf, -math.inf
        for event in self._events:
            lo, hi = min(lo, event.start_us), max(hi, event.end_us)
        for item in self._pending:
            if type(item) is tuple:
                start = item[2]
                end = start + item[3]
            else:
                start, end = item.extent()
            if start < lo:
                lo = start
            if end > hi:
                hi = end
        return (0.0, 0.0) if lo == math.inf else (lo, hi)

    @property
    def start_us(self) -> float:
        return self._bounds()[0]

    @property
    def end_us(self) -> float:
        return self._bounds()[1]

    @property
    def duration_us(self) -> float:
        lo, hi = self._bounds()
        return hi - lo


_new_object = object.__new__


def add_events(trace: Trace, items: list[tuple[str, str, float, float, dict[str, Any]]]) -> None:
    """Hand events' fields to ``trace``: a lazy trace keeps them pending, any other makes its events now."""
    if isinstance(trace, LazyTrace):
        trace.add_pending(items)
    else:
        trace.events.extend(TraceEvent(lane, name, start, dur, dict(args)) for lane, name, start, dur, args in items)
