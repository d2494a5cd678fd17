"""Streams: FIFO queues of device work with a modeled completion time (``torch.spyre.Stream``).

Streams follow the real runtime: stream 0 is the default, ids 1-32 are the low-priority pool and 33-64 the
high-priority pool, handed out round-robin; priority is binary (0 low, -1 high). A stream's work runs in order on
the modeled clock (:mod:`~spyre_lab.runtime.timeline`); work on different streams may overlap when it needs
different units. Markers between streams are :class:`~spyre_lab.runtime.event.Event` s.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from spyre_lab.runtime.devices import DeviceLike, device_index, get_device
from spyre_lab.runtime.event import Event
from spyre_lab.runtime.lazy_trace import add_events
from spyre_lab.runtime.timeline import HOST_LANE, TIMELINE, device_lane

_DEVICE_TYPE = int(torch._C._autograd.DeviceType.PrivateUse1)  # what torch.Stream records for spyre
LOW_PRIORITY_IDS = range(1, 33)
HIGH_PRIORITY_IDS = range(33, 65)


class StreamTable:
    """The process's streams: every one made (by card and id), each card's current one, the streams a ``with``
    made current (restored on exit) and the pools' round-robin cursors."""

    def __init__(self) -> None:
        self.streams: dict[tuple[int, int], Stream] = {}
        self.current: dict[int, Stream] = {}
        self.entered: list[Stream] = []
        self.cursors: dict[tuple[int, bool], Iterator[int]] = {}

    def reset(self) -> None:
        """Every stream's queue empty at time zero, each card back on its default stream, the pools' cursors at
        their first ids. The streams themselves are kept: whoever holds one keeps the one the table has."""
        for s in self.streams.values():
            s.ready_us = 0.0
        self.current.clear()
        self.entered.clear()
        self.cursors.clear()


STREAMS = StreamTable()


def _next_stream_id(device_index: int, high_priority: bool) -> int:
    key = (device_index, high_priority)
    cursors = STREAMS.cursors
    if key not in cursors:
        cursors[key] = itertools.cycle(HIGH_PRIORITY_IDS if high_priority else LOW_PRIORITY_IDS)
    return next(cursors[key])


def _host_launch_us(index: int) -> float:
    return get_device(index).config.host_launch_us


def _unit(unit: str, index: int) -> str:
    return f"spyre{index}.{unit}"


class QueuedStep:
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
        existing = STREAMS.streams.get(key)
        if existing is not None:
            return existing
        self = super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_DEVICE_TYPE)
        self.priority = -1 if stream_id in HIGH_PRIORITY_IDS else 0
        self.ready_us = 0.0
        STREAMS.streams[key] = self
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

    def enqueue_all(self, steps: Sequence[QueuedStep]) -> float:
        """:meth:`enqueue` of ``steps`` one after the other (a kernel's three), each with its names, unit, lane and
        trace args worked out once (:class:`QueuedStep`): the same clock arithmetic and the same events; returns
        the last step's start. (The hottest loop of every launch: the events go to the open traces as one list.)"""
        timeline = TIMELINE
        unit_free = timeline.unit_free
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
            add_events(trace, events)
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
        STREAMS.entered.append(current_stream(self.device_index))
        set_stream(self)
        return self

    def __exit__(self, *exc: object) -> None:
        set_stream(STREAMS.entered.pop())


def default_stream(device: DeviceLike = None) -> Stream:
    return Stream(device, stream_id=0)


def current_stream(device: DeviceLike = None) -> Stream:
    index = device_index(device)
    current = STREAMS.current
    stream = current.get(index)
    if stream is None:                       # none made current yet: the default stream, which stays current
        stream = current[index] = default_stream(index)
    return stream


def set_stream(stream: Stream) -> None:
    STREAMS.current[stream.device_index] = stream


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
    for s in STREAMS.streams.values():
        s.ready_us = 0.0


def synchronize(device: DeviceLike = None) -> None:
    """Block the host (modeled) until every stream of the device has drained."""
    index = device_index(device)
    latest = max((s.ready_us for (d, _), s in STREAMS.streams.items() if d == index), default=0.0)
    TIMELINE.host_wait_until(latest, f"synchronize spyre:{index}")
