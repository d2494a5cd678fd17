"""Events: markers in a stream with a modeled completion time (``torch.spyre.Event``, like ``torch.cuda.Event``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spyre_lab.runtime.timeline import TIMELINE

# An event is recorded on and waited for by a spyre_lab.runtime.stream.Stream (a torch.Stream); this module does
# not import that one, which makes events (Stream.record_event), and finds the current stream through torch.spyre.


@dataclass(eq=False)
class Event:
    """A marker in a stream with a modeled completion time.

    ``record`` places it after the work enqueued so far; ``wait`` makes another stream wait for
    it; ``elapsed_time`` returns milliseconds between two recorded events, like ``torch.cuda.Event``.
    """

    enable_timing: bool = False
    blocking: bool = False          # how a host wait would wait; a modeled card's wait never spins, so either works
    interprocess: bool = False
    time_us: float | None = field(default=None, init=False)
    stream: torch.Stream | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.interprocess:
            raise RuntimeError("spyre: an interprocess Event is not supported: a modeled card's clock lives in one "
                               "process. Share results between processes with torch.distributed (spyreccl) instead")

    def record(self, stream: torch.Stream | None = None) -> None:
        stream = torch.spyre.current_stream() if stream is None else stream
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

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Make ``stream`` (default: current) wait for this event; a stall shows on its lane."""
        stream = torch.spyre.current_stream() if stream is None else stream
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
