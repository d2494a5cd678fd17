"""Modeled time for the runtime: one host clock, FIFO streams, events and the trace they write.

Why a model of its own: the host thread and the card run concurrently. Enqueueing work costs the
host a little (``cfg.host_launch_us``) and returns; the work then runs on the device when its
stream and the unit it needs (PCIe in one direction, the cores) are free. Everything here is
*modeled* microseconds on one shared clock, so a trace shows host and device side by side:

* ``host``          the Python thread: enqueues, rebuilds, waits in ``synchronize``.
* ``host.callback`` HostCompute steps (program correction) run by the driver in stream order.
* ``pcie``          DMA transfers, H2D and D2H (full duplex: the two directions do not block each other).
* ``stream<i>``     compute on the cores, labelled by the stream that issued it.

Streams follow the real runtime: stream 0 is the default, ids 1-32 are the low-priority pool and
33-64 the high-priority pool, handed out round-robin; priority is binary (0 low, -1 high).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spyre_lab.device.trace import Trace, TraceEvent
from spyre_lab.runtime.devices import DeviceLike, device_index, get_device

_DEVICE_TYPE = int(torch._C._autograd.DeviceType.PrivateUse1)  # what torch.Stream records for spyre
LOW_PRIORITY_IDS = range(1, 33)
HIGH_PRIORITY_IDS = range(33, 65)

HOST_LANE = "host"
CALLBACK_LANE = "host.callback"
PCIE_LANE = "pcie"


def device_lane(lane: str, device_index: int) -> str:
    """Lane name on ``device_index``: device 0 keeps the plain names, others get a suffix."""
    return lane if device_index == 0 else f"{lane}@spyre{device_index}"


def pcie_lane(device_index: int) -> str:
    """The PCIe lane of card ``device_index``."""
    return device_lane(PCIE_LANE, device_index)


class _Placed:
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

    def kept(self, keep: Callable[[str], bool]) -> _Placed | None:
        """The block of the placed events on lanes ``keep`` accepts (None if none is; nothing is copied)."""
        lane_of = self.lane_of
        if lane_of is None:
            wanted = _kept_events(self.events, keep)
        else:
            wanted = [e for e in self.events if keep(lane_of(e.lane))]
        return _Placed(wanted, self.offset_us, lane_of) if wanted else None


_FRONTIERS: dict[int, tuple[list[TraceEvent], float, list[tuple[float, float]]]] = {}
_KEPT: dict[tuple[int, Callable[[str], bool]], tuple[list[TraceEvent], list[TraceEvent]]] = {}


def _frontier(events: list[TraceEvent]) -> tuple[float, list[tuple[float, float]]]:
    """The smallest start of ``events`` and the (start, duration) pairs not beaten in both by another event."""
    cached = _FRONTIERS.get(id(events))
    if cached is None or cached[0] is not events:
        pairs = sorted({(e.start_us, e.dur_us) for e in events}, key=lambda p: (-p[0], -p[1]))
        frontier, best_dur = [], float("-inf")
        for start, dur in pairs:                 # by start, latest first: keep each longer duration
            if dur > best_dur:
                frontier.append((start, dur))
                best_dur = dur
        if len(_FRONTIERS) > 512:
            _FRONTIERS.clear()
        cached = _FRONTIERS[id(events)] = (events, min(e.start_us for e in events), frontier)
    return cached[1], cached[2]


def _kept_events(events: list[TraceEvent], keep: Callable[[str], bool]) -> list[TraceEvent]:
    key = (id(events), keep)
    cached = _KEPT.get(key)
    if cached is None or cached[0] is not events:
        if len(_KEPT) > 512:
            _KEPT.clear()
        cached = _KEPT[key] = (events, [e for e in events if keep(e.lane)])
    return cached[1]


class LazyTrace(Trace):
    """A Trace that makes its events only when someone reads them.

    Why: a one-op launch emits about a hundred per-core events; copying them at every launch was the
    largest single cost of a cached eager op, and most launch traces are never looked at. Pending items
    are a kernel's simulator block (:class:`_Placed`) or one event's fields (a tuple: lane, name, start,
    duration, args); reading ``events`` (or iterating, exporting, ``on(lane)``) turns them into
    :class:`TraceEvent` s in emission order; ``len``, ``start_us`` and ``end_us`` are answered without that.
    """

    def __init__(self, events: Iterable[TraceEvent] = (), meta: dict[str, Any] | None = None) -> None:
        self._pending: list[_Placed | tuple[str, str, float, float, dict[str, Any]]] = []
        self._pending_len = 0
        super().__init__(events, meta)

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

    def place(self, block: _Placed) -> None:
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


class Timeline:
    """The modeled clock of the process: host time, when each unit is next free, and the trace.

    Work is grouped into *launches* (one eager op, one transfer, one compiled program call);
    :meth:`launch` opens one and :attr:`last_trace` keeps the events of the last one finished.
    :meth:`recording` collects every event over a longer stretch (several launches, several streams).
    """

    def __init__(self) -> None:
        self.host_us = 0.0
        self._unit_free: dict[str, float] = {}
        self._recorders: list[Trace] = []
        self._launch_trace: Trace | None = None
        self._launch_depth = 0
        self.last_trace = Trace(meta={"launch": None})

    # --- trace ------------------------------------------------------------------------------
    def emit(self, lane: str, name: str, start_us: float, dur_us: float, **args: Any) -> None:
        self.emit_args(lane, name, start_us, dur_us, args)

    def emit_args(self, lane: str, name: str, start_us: float, dur_us: float, args: dict[str, Any]) -> None:
        """:meth:`emit` with the args as one dict (not kept: each trace copies it when it makes the event)."""
        traces = self.open_traces()
        if not traces:
            return
        if dur_us < 0:
            raise ValueError(f"trace event {name!r} on {lane!r} has negative duration {dur_us}")
        items = [(lane, name, float(start_us), float(dur_us), args)]
        for trace in traces:
            _add(trace, items)

    def emit_shifted(self, events: Iterable[TraceEvent], offset_us: float,
                     lane_of: Callable[[str], str] | None = None) -> None:
        """Place already-timed events (a simulator's per-core trace) at ``offset_us``."""
        traces = self.open_traces()
        if not traces:
            return
        block = _Placed(events if type(events) is list else list(events), offset_us, lane_of)
        for trace in traces:
            if isinstance(trace, LazyTrace):
                trace.place(block)
            else:
                trace.events.extend(block.materialise())

    def open_traces(self) -> tuple[Trace, ...]:
        """Where an event goes now: the open launch's trace and every recording (none: nothing is traced)."""
        launch, recorders = self._launch_trace, self._recorders
        if not recorders:
            return () if launch is None else (launch,)
        return tuple(recorders) if launch is None else (launch, *recorders)

    @contextlib.contextmanager
    def launch(self, name: str, **meta: Any) -> Iterator[Trace]:
        """Group the events of one user-visible operation; nested launches join the outer one."""
        trace = self.begin_launch(name, meta)
        try:
            yield trace
        finally:
            self.end_launch()

    def begin_launch(self, name: str, meta: dict[str, Any]) -> Trace:
        """:meth:`launch` without the context manager (the launch hot path): pair with :meth:`end_launch`."""
        if self._launch_depth == 0:
            self._launch_trace = LazyTrace(meta={"launch": name, "time": "modeled us", **meta})
        self._launch_depth += 1
        return self._launch_trace

    def end_launch(self) -> None:
        self._launch_depth -= 1
        if self._launch_depth == 0:
            self.last_trace = self._launch_trace
            self._launch_trace = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[Trace]:
        """Collect every event emitted inside the ``with`` block into one Trace."""
        trace = LazyTrace(meta={"time": "modeled us", "recording": True})
        self._recorders.append(trace)
        try:
            yield trace
        finally:
            self._recorders.remove(trace)

    # --- clocks -----------------------------------------------------------------------------
    def host_work(self, name: str, dur_us: float, **args: Any) -> tuple[float, float]:
        """The host thread is busy for ``dur_us``; returns (start, end)."""
        start = self.host_us
        self.emit(HOST_LANE, name, start, dur_us, **args)
        self.host_us = start + dur_us
        return start, self.host_us

    def host_wait_until(self, t_us: float, reason: str) -> float:
        """Block the host thread until modeled time ``t_us``; the wait shows on the host lane."""
        if t_us > self.host_us:
            self.emit(HOST_LANE, f"wait: {reason}", self.host_us, t_us - self.host_us, waiting=True)
            self.host_us = t_us
        return self.host_us

    def unit_free_at(self, unit: str) -> float:
        return self._unit_free.get(unit, 0.0)

    def reserve(self, unit: str, lane: str, earliest_us: float, dur_us: float, name: str,
                **args: Any) -> tuple[float, float]:
        """Run ``dur_us`` of work on ``unit`` no earlier than ``earliest_us``; returns (start, end)."""
        start = max(earliest_us, self.unit_free_at(unit))
        end = start + dur_us
        self._unit_free[unit] = end
        self.emit(lane, name, start, dur_us, **args)
        return start, end

    def reset(self) -> None:
        """Back to time zero (tests and notebooks that want reproducible absolute times)."""
        self.host_us = 0.0
        self._unit_free.clear()
        self.last_trace = Trace(meta={"launch": None})


def _add(trace: Trace, items: list[tuple[str, str, float, float, dict[str, Any]]]) -> None:
    """Hand events' fields to ``trace``: a lazy trace keeps them pending, any other makes its events now."""
    if isinstance(trace, LazyTrace):
        trace.add_pending(items)
    else:
        trace.events.extend(TraceEvent(lane, name, start, dur, dict(args)) for lane, name, start, dur, args in items)


TIMELINE = Timeline()


def last_trace() -> Trace:
    """The Trace of the last launch (eager op, transfer or compiled program), modeled microseconds."""
    return TIMELINE.last_trace


def recording() -> contextlib.AbstractContextManager[Trace]:
    """``with recording() as trace:`` collects every modeled event of the block."""
    return TIMELINE.recording()


# --- streams ----------------------------------------------------------------------------------
_POOL_CURSORS: dict[tuple[int, bool], Iterator[int]] = {}


def _next_stream_id(device_index: int, high_priority: bool) -> int:
    key = (device_index, high_priority)
    if key not in _POOL_CURSORS:
        _POOL_CURSORS[key] = itertools.cycle(HIGH_PRIORITY_IDS if high_priority else LOW_PRIORITY_IDS)
    return next(_POOL_CURSORS[key])


def _host_launch_us(index: int) -> float:
    return get_device(index).config.host_launch_us


def _unit(unit: str, index: int) -> str:
    return f"spyre{index}.{unit}"


class PreparedStep:
    """One step of a launch as its stream enqueues it, worked out once per program, card and stream: what
    :meth:`Stream.enqueue` would compute from its arguments on every call (host event name and cost, unit,
    lane, trace args in the order ``enqueue`` gives them)."""

    __slots__ = ("args", "dur_us", "host_args", "host_cost_us", "host_name", "lane", "name", "unit_key")

    def __init__(self, stream: Stream, name: str, unit: str, lane: str, dur_us: float, args: dict[str, Any]) -> None:
        self.name, self.lane, self.dur_us = name, lane, float(dur_us)
        self.host_cost_us = float(_host_launch_us(stream.device_index))
        if self.dur_us < 0 or self.host_cost_us < 0:
            raise ValueError(f"step {name!r} has a negative duration ({dur_us} us, host {self.host_cost_us} us)")
        self.host_name = f"enqueue {name}"
        self.host_args = {"stream": stream.stream_id}
        self.unit_key = _unit(unit, stream.device_index)
        self.args = {"stream": stream.stream_id, **args}


class Stream(torch.Stream):
    """A FIFO queue of device work with a modeled completion time.

    ``Stream()`` takes the next id of the low-priority pool (1-32), ``Stream(priority=-1)`` of the
    high-priority pool (33-64); ``torch.spyre.default_stream()`` is stream 0. Work enqueued on one
    stream runs in order; work on different streams may overlap when it needs different units.
    It is a ``torch.Stream`` (same ``stream_id`` / ``device_index``), so torch APIs that take one
    accept it, e.g. ``tensor.record_stream(torch.spyre.current_stream())``.
    """

    def __new__(cls, device: DeviceLike = None, priority: int = 0, *, stream_id: int | None = None) -> Stream:
        index = device_index(device)
        if priority not in (0, -1):
            raise ValueError(f"Stream priority is binary on Spyre: 0 (low) or -1 (high), got {priority}")
        if stream_id is None:
            stream_id = _next_stream_id(index, priority == -1)
        key = (index, stream_id)
        existing = _STREAMS.get(key)
        if existing is not None:
            return existing
        self = super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_DEVICE_TYPE)
        self.priority = -1 if stream_id in HIGH_PRIORITY_IDS else 0
        self.ready_us = 0.0
        _STREAMS[key] = self
        return self

    @property
    def device(self) -> torch.device:
        return torch.device("spyre", self.device_index)

    @property
    def lane(self) -> str:
        return device_lane(f"stream{self.stream_id}", self.device_index)

    def __repr__(self) -> str:
        return (f"<torch.spyre.Stream device=spyre:{self.device_index} id={self.stream_id} "
                f"priority={self.priority} ready_at={self.ready_us:.2f}us (modeled)>")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and (self.device_index, self.stream_id) == (other.device_index,
                                                                                      other.stream_id)

    def __hash__(self) -> int:
        return hash((self.device_index, self.stream_id))

    # --- enqueueing ------------------------------------------------------------------------
    def enqueue(self, name: str, unit: str, lane: str, dur_us: float, *, after_us: float = 0.0,
                host_cost_us: float | None = None, **args: Any) -> tuple[float, float]:
        """Enqueue one step: the host pays the launch cost and returns; the step runs in FIFO order.

        ``unit`` is the resource the step occupies (``pcie.h2d``, ``pcie.d2h``, ``cores``,
        ``host.callback``); ``after_us`` adds a dependency on work outside this stream.
        Returns the modeled (start, end) of the step on the device.
        """
        cost = _host_launch_us(self.device_index) if host_cost_us is None else host_cost_us
        if cost:
            TIMELINE.host_work(f"enqueue {name}", cost, stream=self.stream_id)
        earliest = max(TIMELINE.host_us, self.ready_us, after_us)
        start, end = TIMELINE.reserve(_unit(unit, self.device_index), lane, earliest, dur_us, name,
                                      stream=self.stream_id, **args)
        self.ready_us = end
        return start, end

    def enqueue_all(self, steps: Sequence[PreparedStep]) -> float:
        """:meth:`enqueue` of ``steps`` one after the other (a kernel's three), each with its names, unit, lane and
        trace args worked out once (:class:`PreparedStep`): the same clock arithmetic and the same events; returns
        the last step's start. (The hottest loop of every launch: the events go to the open traces as one list.)"""
        timeline = TIMELINE
        unit_free = timeline._unit_free
        events: list[tuple[str, str, float, float, dict[str, Any]]] = []
        ready = self.ready_us
        host = timeline.host_us
        start = 0.0
        for step in steps:
            cost = step.host_cost_us
            if cost:
                events.append((HOST_LANE, step.host_name, host, cost, step.host_args))
                host += cost
            start = max(host, ready, unit_free.get(step.unit_key, 0.0))
            ready = unit_free[step.unit_key] = start + step.dur_us
            events.append((step.lane, step.name, start, step.dur_us, step.args))
        timeline.host_us = host
        self.ready_us = ready
        for trace in timeline.open_traces():
            _add(trace, events)
        return start

    # --- torch.cuda.Stream-like API ----------------------------------------------------------
    def query(self) -> bool:
        """True when all work enqueued so far has finished by the host's modeled clock."""
        return self.ready_us <= TIMELINE.host_us

    def synchronize(self) -> None:
        TIMELINE.host_wait_until(self.ready_us, f"stream {self.stream_id}")

    def wait_event(self, event: Event) -> None:
        """Later work on this stream starts only after ``event`` has completed (modeled)."""
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        _ENTERED.append(current_stream(self.device_index))
        set_stream(self)
        return self

    def __exit__(self, *exc: object) -> None:
        set_stream(_ENTERED.pop())


_STREAMS: dict[tuple[int, int], Stream] = {}
_CURRENT: dict[int, Stream] = {}
_ENTERED: list[Stream] = []  # streams made current by `with`, to restore on exit


def default_stream(device: DeviceLike = None) -> Stream:
    return Stream(device, stream_id=0)


def current_stream(device: DeviceLike = None) -> Stream:
    index = device_index(device)
    stream = _CURRENT.get(index)
    if stream is None:                       # none made current yet: the default stream, which stays current
        stream = _CURRENT[index] = default_stream(index)
    return stream


def set_stream(stream: Stream) -> None:
    _CURRENT[stream.device_index] = stream


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[Stream | None]:
    """``with torch.spyre.stream(s):`` makes ``s`` the current stream of its device (None: no change)."""
    if s is None:
        yield None
        return
    with s:
        yield s


def reset_time() -> None:
    """Modeled time back to zero on the host and every stream (reproducible traces in notebooks/tests)."""
    TIMELINE.reset()
    for s in _STREAMS.values():
        s.ready_us = 0.0


def synchronize(device: DeviceLike = None) -> None:
    """Block the host (modeled) until every stream of the device has drained."""
    index = device_index(device)
    latest = max((s.ready_us for (d, _), s in _STREAMS.items() if d == index), default=0.0)
    TIMELINE.host_wait_until(latest, f"synchronize spyre:{index}")


# --- events -----------------------------------------------------------------------------------
@dataclass(eq=False)
class Event:
    """A marker in a stream with a modeled completion time.

    ``record`` places it after the work enqueued so far; ``wait`` makes another stream wait for
    it; ``elapsed_time`` returns milliseconds between two recorded events, like ``torch.cuda.Event``.
    """

    enable_timing: bool = False
    blocking: bool = False
    interprocess: bool = False
    time_us: float | None = field(default=None, init=False)
    stream: Stream | None = field(default=None, init=False, repr=False)

    def record(self, stream: Stream | None = None) -> None:
        stream = current_stream() if stream is None else stream
        self.stream = stream
        self.time_us = max(stream.ready_us, TIMELINE.host_us)
        TIMELINE.emit(stream.lane, "event record", self.time_us, 0.0, stream=stream.stream_id)

    def _require_recorded(self, what: str) -> float:
        if self.time_us is None:
            raise RuntimeError(f"Event.{what}() needs a recorded event; call event.record(stream) first")
        return self.time_us

    def query(self) -> bool:
        return self.time_us is None or self.time_us <= TIMELINE.host_us

    def synchronize(self) -> None:
        if self.time_us is not None:
            TIMELINE.host_wait_until(self.time_us, "event")

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` (default: current) wait for this event; a stall shows on its lane."""
        stream = current_stream() if stream is None else stream
        t = self._require_recorded("wait")
        if t > stream.ready_us:
            start = max(stream.ready_us, TIMELINE.host_us)
            if t > start:
                source = self.stream.stream_id if self.stream is not None else None
                TIMELINE.emit(stream.lane, "wait event", start, t - start, stream=stream.stream_id,
                              waits_for_stream=source)
            stream.ready_us = t

    def elapsed_time(self, end_event: Event) -> float:
        """Modeled milliseconds from this event to ``end_event``; both need ``enable_timing=True``, as in CUDA."""
        start = self._require_recorded("elapsed_time")
        end = end_event._require_recorded("elapsed_time")
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError(
                "Event.elapsed_time() needs both events created with enable_timing=True, as torch.cuda.Event does: "
                "torch.spyre.Event(enable_timing=True)"
            )
        return (end - start) / 1000.0
