"""Re-time a recorded engine step under other host, PCIe and launch costs, replaying the runtime's queue rules.

A step's trace holds, in order, everything the host did (``enqueue X``, graph rebuilds, waits, host
fallbacks) and every step it put on the card's queues (program correction callbacks, PCIe copies, kernels).
:class:`StepLog` keeps that sequence; :meth:`StepLog.retime` replays it with the rules of
``runtime.stream.Stream.enqueue``: the host pays the launch cost and moves on, a queued step starts when the
host has issued it, its stream is free and its unit (cores, PCIe in one direction, the callback thread) is
free, and a wait moves the host clock to the stream's end. Durations are derived again from a
:class:`~spyre_lab.device.config.SpyreConfig`:

* enqueue: ``host_launch_us``; graph rebuild: ``host_rebuild_per_node_us`` per node;
* correction callback: ``host_correction_base_us + host_correction_per_slot_us * slots``;
* a PCIe copy: ``pcie_latency_us + bytes / pcie_bandwidth``;
* a kernel: its simulated time with the launch part (``kernel_launch_cycles / clock_hz``) replaced.

Replayed with the config it was recorded under, a log gives back the recorded step time (a test checks),
so the sweep's engine ratios come from the runtime's own timing rules, not from a second model. What it
cannot re-derive is a kernel's tile-level time under another clock or DRAM: those are swept on the
kernel claims, which are recompiled for every configuration.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from spyre_lab.device.config import SpyreConfig

_QUEUE_LANES = ("stream", "pcie", "host.callback")


@dataclass(frozen=True)
class HostItem:
    """One thing the host thread did: ``enqueue`` (with the step it queued), ``rebuild``, ``wait`` or ``work``."""

    kind: str
    dur_us: float
    nodes: int = 0
    step: tuple[str, str, float, int, int] | None = None   # (unit, kind, dur_us, bytes, slots)


@dataclass
class StepLog:
    """The ordered host items of one recorded step, and the config the durations came from."""

    items: list[HostItem]
    depth: int

    @classmethod
    def from_trace(cls, trace: object, depth: int) -> StepLog:
        queued: dict[str, deque] = defaultdict(deque)
        for e in sorted(trace.events, key=lambda e: e.start_us):
            if e.lane.startswith(_QUEUE_LANES):
                queued[e.name].append(e)
        items = []
        for e in sorted((e for e in trace.events if e.lane == "host"), key=lambda e: e.start_us):
            if e.name.startswith("enqueue "):
                q = queued[e.name[len("enqueue "):]]
                step = q.popleft() if q else None
                if step is None:
                    items.append(HostItem("work", e.dur_us))
                    continue
                unit = ("cores" if step.lane.startswith("stream") else "host.callback" if step.lane == "host.callback"
                        else "pcie." + str(step.args.get("kind", "H2D")).lower())
                items.append(HostItem("enqueue", e.dur_us, step=(unit, str(step.args.get("kind", "")), step.dur_us,
                                                                  int(step.args.get("bytes", 0)),
                                                                  int(step.args.get("slots", 0)))))
            elif e.args.get("waiting"):
                items.append(HostItem("wait", e.dur_us))
            elif e.name.startswith("rebuild graph"):
                items.append(HostItem("rebuild", e.dur_us, nodes=int(e.args.get("nodes", 0))))
            else:
                items.append(HostItem("work", e.dur_us))
        return cls(items, depth)

    def host_breakdown(self) -> dict[str, float]:
        """Host thread time by what it was doing (µs): launches, graph rebuilds, other work (host fallbacks,
        copies), as recorded."""
        out = {"enqueue": 0.0, "rebuild": 0.0, "work": 0.0}
        for item in self.items:
            if item.kind in out:
                out[item.kind] += item.dur_us
        return out

    def retime(self, base: SpyreConfig, cfg: SpyreConfig) -> tuple[float, float, float]:
        """(step, host busy, device busy) in µs with ``cfg``'s costs in place of ``base``'s."""
        host = ready = 0.0
        free: dict[str, float] = {}
        host_spans: list[tuple[float, float]] = []    # host thread and correction callbacks, counted once
        device_busy = 0.0
        launch_delta = cfg.kernel_launch_cycles / cfg.clock_hz * 1e6 - base.kernel_launch_cycles / base.clock_hz * 1e6
        for item in self.items:
            if item.kind == "wait":
                host = max(host, ready)
                continue
            if item.kind == "rebuild":
                dur = cfg.host_rebuild_per_node_us * item.nodes
            elif item.kind == "enqueue":
                dur = cfg.host_launch_us
            else:
                dur = item.dur_us
            host_spans.append((host, host + dur))
            host += dur
            if item.step is None:
                continue
            unit, _, step_us, nbytes, slots = item.step
            if unit == "host.callback" and slots:
                step_us = cfg.host_correction_base_us + cfg.host_correction_per_slot_us * slots
            elif unit.startswith("pcie") and nbytes:
                step_us = cfg.pcie_latency_us + nbytes / cfg.pcie_bandwidth * 1e6
            elif unit == "cores":
                step_us = max(0.0, step_us + launch_delta)
                device_busy += step_us
            start = max(host, ready, free.get(unit, 0.0))
            ready = free[unit] = start + step_us
            if unit == "host.callback":
                host_spans.append((start, ready))
        return max(host, ready), _union(host_spans), device_busy


def _union(spans: list[tuple[float, float]]) -> float:
    total, cursor = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > cursor:
            total += end - max(start, cursor)
            cursor = end
    return total


def host_breakdown_extended(log: object) -> dict[str, float]:
    """``StepLog.host_breakdown`` of a log or of a (shallow, deep, layers) triple extended per layer."""
    if isinstance(log, StepLog):
        return log.host_breakdown()
    shallow, deep, layers = log
    a, b = shallow.host_breakdown(), deep.host_breakdown()
    k = (layers - deep.depth) / (deep.depth - shallow.depth)
    return {key: b[key] + (b[key] - a[key]) * k for key in b}


def retime_extended(log: object, base: SpyreConfig, cfg: SpyreConfig) -> tuple[float, float, float]:
    """Retime a StepLog, or a (shallow, deep, layers) triple extended per layer as ``StepTiming.extend`` does."""
    if isinstance(log, StepLog):
        return log.retime(base, cfg)
    shallow, deep, layers = log
    a, b = shallow.retime(base, cfg), deep.retime(base, cfg)
    k = (layers - deep.depth) / (deep.depth - shallow.depth)
    return tuple(y + (y - x) * k for x, y in zip(a, b))
