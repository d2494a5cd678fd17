"""Program: the wrapper -- ordered launches, graph I/O, and the DRAM plan for intermediates.

What Inductor emits as the Python wrapper and torch-spyre as host code: the order kernels launch
in, which DRAM buffer each launch's symbolic address slots refer to, and where intermediates live.
Intermediates that cross kernels get first-fit offsets by live range inside one pool (segment 0 of
the compiler's address map, like torch-spyre's ``memory_planning``); LX-resident intermediates
never appear here. The runtime only has to bind graph inputs, outputs and one pool base address.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from spyre_lab.compiler.access import Access, Read
from spyre_lab.compiler.ir import BufferInfo, Fallback, NodeGroup
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.device.config import SpyreConfig

if TYPE_CHECKING:
    from spyre_lab.compiler.layout_propagation import Restickify


@dataclass
class HostFallback:
    """A launch that runs on the host CPU: inputs copied over PCIe, the torch op, results copied back."""

    name: str
    kernel: NodeGroup
    address_slots: list[str]
    rule: str = "fallback"
    host: bool = True

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.kernel.nodes]

    def explain(self) -> str:
        node = self.kernel.nodes[0]
        reason = node.reason if isinstance(node, Fallback) else ""
        return f"{self.name}: host fallback aten.{', '.join(self.ops)} ({reason})"


@dataclass
class UnplannedSpec:
    """A device kernel whose numerics are known but which has no tile plan (codegen unavailable)."""

    name: str
    kernel: NodeGroup
    address_slots: list[str]
    error: str = ""
    host: bool = False

    @property
    def rule(self) -> str:
        return self.kernel.rule

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.kernel.nodes]

    def explain(self) -> str:
        return f"{self.name}: rule={self.rule} ops={self.ops} (no tile plan: {self.error})"


Launch = KernelSpec | HostFallback | UnplannedSpec
"""One entry of a Program's launch order: a planned device kernel, a host fallback, or a device kernel
without a tile plan (numbers known, time not)."""


@dataclass(frozen=True)
class DramSlot:
    """An intermediate's place in the pool: [offset, offset+size) from launch ``first`` to ``last``."""

    buffer: str
    offset: int
    size: int
    first: int
    last: int


def plan_intermediates(kernels: list[NodeGroup], buffers: dict[str, BufferInfo], keep: set[str],
                       alignment: int = 128) -> tuple[dict[str, DramSlot], int]:
    """First-fit offsets by live range for kernel outputs that other kernels read (not graph outputs)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for b in k.outputs:
            if b not in keep and buffers[b].role == "intermediate":
                first.setdefault(b, i)
                last[b] = i
        for b in k.inputs:
            if b in first:
                last[b] = i
    live: list[DramSlot] = []
    plan: dict[str, DramSlot] = {}
    pool = 0
    for b in sorted(first, key=lambda b: (first[b], b)):
        info = buffers[b]
        size = info.layout.device_nbytes if info.layout is not None else info.nbytes
        size = -(-max(size, 1) // alignment) * alignment
        live = [s for s in live if s.last >= first[b]]
        offset = 0
        for s in sorted(live, key=lambda s: s.offset):
            if offset + size <= s.offset:
                break
            offset = max(offset, s.offset + s.size)
        slot = DramSlot(b, offset, size, first[b], last[b])
        live.append(slot)
        plan[b] = slot
        pool = max(pool, offset + size)
    return plan, pool


@dataclass
class Program:
    """One compiled graph: what the runtime launches, in order, and how its buffers are laid out."""

    name: str
    kernels: list[NodeGroup]
    launches: list[Launch]                    # same order as kernels
    inputs: list[str]
    outputs: list[Read]
    buffers: dict[str, BufferInfo]
    constants: dict[str, torch.Tensor]
    access: dict[str, Access]
    options: CompileOptions
    cfg: SpyreConfig
    dram_plan: dict[str, DramSlot] = field(default_factory=dict)
    pool_bytes: int = 0
    restickifies: list[Restickify] = field(default_factory=list)
    fallback_ops: list[str] = field(default_factory=list)
    mutations: list[tuple[str, Read]] = field(default_factory=list)   # input <- value after the run (in-place ops)
    unfused_kernels: int = 0
    aten_ops: int = 0
    compile_ms: float = 0.0
    cache_key: str = ""
    cache_note: str = "compiled"

    @property
    def num_kernels(self) -> int:
        return len(self.launches)

    @property
    def device_launches(self) -> list[KernelSpec | UnplannedSpec]:
        return [launch for launch in self.launches if not isinstance(launch, HostFallback)]

    def address_slots(self) -> list[list[str]]:
        """Per launch, the DRAM buffers whose addresses the runtime patches in before it runs."""
        return [list(launch.address_slots) for launch in self.launches]

    def input_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [(self.buffers[b].shape, self.buffers[b].dtype) for b in self.inputs]

    def modeled_time_us(self, mode: str | None = None) -> float | None:
        """Sum of the device kernels' modeled times (None if any kernel has no tile plan)."""
        total = 0.0
        for launch in self.device_launches:
            if not isinstance(launch, KernelSpec):
                return None
            total += launch.simulate(mode or self.options.timing).time_us
        return total

    def to_json(self) -> dict[str, Any]:
        def buf(b: str) -> dict[str, Any]:
            info = self.buffers[b]
            out: dict[str, Any] = {"name": b, "shape": list(info.shape), "dtype": str(info.dtype).split(".")[-1],
                                   "role": info.role}
            if info.layout is not None:
                out["device_size"] = list(info.layout.device_size)
                out["stride_map"] = list(info.layout.stride_map)
            return out

        launches = []
        for launch, kernel in zip(self.launches, self.kernels):
            entry: dict[str, Any] = {"name": launch.name, "rule": kernel.rule, "ops": [n.op for n in kernel.nodes],
                                     "host": isinstance(launch, HostFallback), "address_slots": list(
                                         launch.address_slots), "lx_resident": list(kernel.lx_resident)}
            if isinstance(launch, KernelSpec):
                entry["superdsc"] = launch.to_json()
            if hasattr(launch, "simulate"):            # what a view of a saved program needs (roofline, tables)
                sim = launch.simulate(self.options.timing)
                entry["modeled"] = {k: getattr(sim, k) for k in ("mode", "time_us", "launch_us", "flops", "dram_bytes",
                                                                 "bytes_loaded", "bytes_stored", "ring_bytes",
                                                                 "bottleneck")}
            launches.append(entry)
        return {
            "name": self.name,
            "inputs": [buf(b) for b in self.inputs],
            "outputs": [{"buffer": r.buffer, "view": r.describe()} for r in self.outputs],
            "constants": [buf(b) for b in self.constants],
            "intermediates_pool_bytes": self.pool_bytes,
            "intermediates": [{"buffer": s.buffer, "offset": s.offset, "size": s.size, "live": [s.first, s.last]}
                              for s in self.dram_plan.values()],
            "launches": launches,
            "options": {"fusion": sorted(self.options.fusion), "work_division": self.options.work_division,
                        "lx_allocator": self.options.lx_allocator, "timing": self.options.timing},
            "device": dataclasses.asdict(self.cfg),
        }

    def save_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1, default=str)

    def __repr__(self) -> str:
        return (f"Program({self.name!r}: {len(self.launches)} launches, {len(self.inputs)} inputs, "
                f"{len(self.outputs)} outputs, pool {self.pool_bytes:,} B)")
