"""The modeled clock of the process: host time, when each unit is next free, and the trace they write.

Why a model of its own: the host thread and the card run concurrently. Enqueueing work costs the host a little
(``cfg.host_launch_us``) and returns; the work then runs on the device when its stream and the unit it needs (PCIe
in one direction, the cores) are free. Everything here is *modeled* microseconds on one shared clock, so a trace
shows host and device side by side, one lane each:

* ``host``          the Python thread: enqueues, rebuilds, waits in ``synchronize``.
* ``host.callback`` HostCompute steps (program correction) run by the driver in stream order.
* ``pcie``          DMA transfers, H2D and D2H (full duplex: the two directions do not block each other);
  :func:`dma_us` is what one transfer takes.
* ``stream<i>``     compute on the cores, labelled by the stream that issued it (:mod:`~spyre_lab.runtime.stream`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from spyre_lab.device.trace import Trace, TraceEvent
from spyre_lab.runtime.lazy_trace import LazyTrace, PlacedBlock, add_events

if TYPE_CHECKING:
    from spyre_lab.runtime.devices import SpyreDevice

HOST_LANE = "host"
CALLBACK_LANE = "host.callback"
PCIE_LANE = "pcie"


def device_lane(lane: str, device_index: int) -> str:
    """Lane name on ``device_index``: device 0 keeps the plain names, others get a suffix."""
    return lane if device_index == 0 else f"{lane}@spyre{device_index}"


def pcie_lane(device_index: int) -> str:
    """The PCIe lane of card ``device_index``."""
    return device_lane(PCIE_LANE, device_index)


def dma_us(nbytes: int, device: SpyreDevice) -> float:
    """Modeled PCIe time of one DMA: fixed latency plus bytes over the effective bandwidth."""
    cfg = device.config
    return cfg.pcie_latency_us + nbytes / cfg.pcie_bandwidth * 1e6


class Timeline:
    """The modeled clock of the process: host time, when each unit is next free, and the trace.

    Work is grouped into *launches* (one eager op, one transfer, one compiled program call);
    :meth:`launch` opens one and :attr:`last_trace` keeps the events of the last one finished.
    :meth:`recording` collects every event over a longer stretch (several launches, several streams).
    """

    def __init__(self) -> None:
        self.host_us = 0.0
        self.unit_free: dict[str, float] = {}          # per unit (``spyre0.cores``, ...), when it is next free
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
            add_events(trace, items)

    def emit_shifted(self, events: Iterable[TraceEvent], offset_us: float,
                     lane_of: Callable[[str], str] | None = None) -> None:
        """Place already-timed events (a simulator's per-core trace) at ``offset_us``."""
        traces = self.open_traces()
        if not traces:
            return
        block = PlacedBlock(events if type(events) is list else list(events), offset_us, lane_of)
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
            self._launch_trace = LazyTrace.of_launch({"launch": name, "time": "modeled us", **meta})
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
        return self.unit_free.get(unit, 0.0)

    def reserve(self, unit: str, lane: str, earliest_us: float, dur_us: float, name: str,
                **args: Any) -> tuple[float, float]:
        """Run ``dur_us`` of work on ``unit`` no earlier than ``earliest_us``; returns (start, end)."""
        start = max(earliest_us, self.unit_free_at(unit))
        end = start + dur_us
        self.unit_free[unit] = end
        self.emit(lane, name, start, dur_us, **args)
        return start, end

    def reset(self) -> None:
        """Back to time zero (tests and notebooks that want reproducible absolute times)."""
        self.host_us = 0.0
        self.unit_free.clear()
        self.last_trace = Trace(meta={"launch": None})


TIMELINE = Timeline()


def last_trace() -> Trace:
    """The Trace of the last launch (eager op, transfer or compiled program), modeled microseconds."""
    return TIMELINE.last_trace


def recording() -> contextlib.AbstractContextManager[Trace]:
    """``with recording() as trace:`` collects every modeled event of the block."""
    return TIMELINE.recording()
