"""CPU fallback: an op with no spyre kernel runs on the host, with both PCIe trips on the trace.

The inputs are copied to the host (a D2H per spyre input, except out= tensors, which are only
written), the CPU op runs (its host time is modeled from bytes and elements), and the results are
copied back (an H2D per result). The first call of each op warns once, naming it and filed under the
user's line (the first frame outside torch and spyre_lab); ops whose output size depends on the data are
host ops by design and do not warn. Every call is counted, with the line that first made it:
``fallback_stats()`` for the process, ``with collect_fallbacks() as log:`` for a stretch of work, which
also holds back the per-op warnings so a report can print ``log.summary()`` once instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.runtime.devices import get_device
from spyre_lab.runtime.op_schema import rewrap_numbers, to_cpu_kwargs, written_leaves
from spyre_lab.runtime.stream import current_stream
from spyre_lab.runtime.tensor import device_nbytes, from_host, host_view, resize, write_into
from spyre_lab.runtime.timeline import TIMELINE, dma_us, pcie_lane
from spyre_lab.user_line import caller_frame, user_frame, warn_at_user_line, where

# estimates (documented nowhere): one host core doing the CPU fallback's work.
# estimates (measured nowhere): one host core doing a fallback's work, plus its dispatch cost.
HOST_FALLBACK_FLOPS = 20e9
HOST_FALLBACK_BYTES_PER_S = 10e9
HOST_FALLBACK_DISPATCH_US = 5.0


@dataclass
class FallbackStat:
    """One op that ran as a CPU fallback: how often, and where it was first called from."""

    op: str
    calls: int
    first_seen: str  # file:line of the first call: the line that called the torch op (may be spyre_lab's own)
    user_line: str  # file:line of the first frame outside torch and spyre_lab (what the warning names)
    by_design: bool = False  # a host op by design (its output size depends on the data), not a missing kernel


class FallbackLog:
    """CPU fallbacks counted per op over a stretch of work; ``summary()`` is one table instead of warnings."""

    def __init__(self) -> None:
        self.stats: dict[str, FallbackStat] = {}

    def record(self, name: str, by_design: bool) -> None:
        stat = self.stats.get(name)
        if stat is None:
            self.stats[name] = FallbackStat(name, 1, where(caller_frame(3)), where(user_frame(3)), by_design)
        else:
            stat.calls += 1

    def summary(self) -> str:
        if not self.stats:
            return "CPU fallbacks: none (every op ran on the device)"
        width = max(len(name) for name in self.stats)
        lines = [f"CPU fallbacks: {len(self.stats)} ops ran on the host "
                 "(each call: D2H of its inputs, the CPU op, H2D of its results)",
                 f"  {'op':<{width}}  {'calls':>6}  {'why':<21}  first seen"]
        for stat in sorted(self.stats.values(), key=lambda s: -s.calls):
            why = "output size from data" if stat.by_design else "no spyre kernel"
            lines.append(f"  {stat.op:<{width}}  {stat.calls:6d}  {why:<21}  {stat.first_seen}")
        return "\n".join(lines)


_PROCESS_LOG = FallbackLog()
_collectors: list[FallbackLog] = []
_warned_ops: set[str] = set()


def fallback_stats() -> dict[str, FallbackStat]:
    """Every CPU fallback of this process so far, per op (calls, first call site)."""
    return dict(_PROCESS_LOG.stats)


def reset_fallback_warnings() -> None:
    """Warn again on the next fallback of every op (each warns once per process otherwise)."""
    _warned_ops.clear()


@contextlib.contextmanager
def collect_fallbacks() -> Iterator[FallbackLog]:
    """``with collect_fallbacks() as log:`` counts the block's CPU fallbacks into ``log`` and holds back their
    one-time warnings (``log.summary()`` reports them instead)."""
    log = FallbackLog()
    _collectors.append(log)
    try:
        yield log
    finally:
        _collectors.remove(log)


def _note_fallback(name: str, warn: bool) -> None:
    for log in (_PROCESS_LOG, *_collectors):
        log.record(name, by_design=not warn)
    if warn and not _collectors and name not in _warned_ops:
        _warned_ops.add(name)
        site, user = where(caller_frame(1)), where(user_frame(1))   # this call's (the stats keep the first one's)
        via = f" (called from {site})" if site != user else ""
        warn_at_user_line(f"{name} has no spyre kernel{via}; it runs as a CPU fallback (inputs copied to the host, "
                          "the CPU op, results copied back). Each call pays two PCIe transfers; "
                          "spyre_lab.runtime.fallback.fallback_stats() counts them.")


def run_on_host(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, index: int, warn: bool) -> Any:
    """Run ``op`` (its flattened call ``leaves``/``spec``) on the CPU for card ``index``; results come
    back as spyre tensors, written-in-place arguments are updated on the card."""
    name = f"aten::{op.overloadpacket.__name__}"
    _note_fallback(name, warn)
    device = get_device(index)
    stream = current_stream(index)
    written = set(written_leaves(op, leaves, spec))
    with TIMELINE.launch(f"{name} (CPU fallback)", fallback=True):
        host = list(leaves)
        moved_in = 0
        write_only = set(written_leaves(op, leaves, spec, only_out=True))
        for i, x in enumerate(leaves):
            if i in write_only:  # out= tensors are written, never read: nothing to copy over
                host[i] = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
            elif isinstance(x, torch.Tensor) and x.device.type == "spyre":
                nbytes = device_nbytes(x)
                moved_in += nbytes
                stream.enqueue(f"D2H {name} input", "pcie.d2h", pcie_lane(index), dma_us(nbytes, device), bytes=nbytes,
                               kind="D2H", fallback=True)
                host[i] = host_view(x).clone() if i in written else host_view(x)
        stream.synchronize()
        args, kwargs = rewrap_numbers(op, *tree_unflatten(host, spec))
        result = op(*args, **to_cpu_kwargs(kwargs))
        out_leaves, out_spec = tree_flatten(result)
        out_bytes = sum(t.numel() * t.element_size() for t in out_leaves if isinstance(t, torch.Tensor))
        TIMELINE.host_work(f"{name} on CPU", _host_cost_us(moved_in + out_bytes, out_leaves), kind="HostCompute",
                           fallback=True, timing="modeled (host estimate)")
        host_to_leaf = {id(host[i]): i for i in written}
        results, returned = [], set()
        for value in out_leaves:
            if isinstance(value, torch.Tensor) and id(value) in host_to_leaf:
                returned.add(host_to_leaf[id(value)])
                target = leaves[host_to_leaf[id(value)]]
                if tuple(target.shape) != tuple(value.shape):
                    resize(target, tuple(value.shape), None)
                write_into(target, value)
                _h2d(stream, target, name)
                results.append(target)
            elif isinstance(value, torch.Tensor):
                out = from_host(value, index)
                _h2d(stream, out, name)
                results.append(out)
            else:
                results.append(value)
        for i in written - returned:            # written but not returned (e.g. _cummax_helper -> ())
            write_into(leaves[i], host[i])
            _h2d(stream, leaves[i], name)
    return tree_unflatten(results, out_spec)


def _h2d(stream: Any, t: torch.Tensor, name: str) -> None:
    nbytes = device_nbytes(t)
    stream.enqueue(f"H2D {name} result", "pcie.h2d", pcie_lane(stream.device_index),
                   dma_us(nbytes, get_device(stream.device_index)), bytes=nbytes, kind="H2D", fallback=True)


def _host_cost_us(nbytes: int, outputs: list[Any]) -> float:
    elems = sum(t.numel() for t in outputs if isinstance(t, torch.Tensor))
    return HOST_FALLBACK_DISPATCH_US + max(nbytes / HOST_FALLBACK_BYTES_PER_S, elems / HOST_FALLBACK_FLOPS) * 1e6
