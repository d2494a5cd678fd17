"""Program correction: what a launch patches (:class:`CorrectionArea`), and the in-place updates it lands.

A compiled kernel's binary names its DRAM operands symbolically (``address_slots``); the real addresses are only
known when the program is launched with real tensors. Per program and card, a :class:`CorrectionArea` holds the
program's correction areas in the card's program segment (one 8-byte address per slot per kernel) and the pinned
host buffer the correction blob is written to, reused by every launch; it also works out, once, the steps every
launch of the program enqueues (their names, modeled durations, lanes and trace args).

**In-place updates.** A compiled graph is functional: ``x.add_(1)`` becomes a new buffer plus a *mutation*
(``program.mutations``: input slot <- value read) that must land in the caller's tensor. :func:`launch_kernels`,
which every correction area reads its kernels from, appends one :class:`WriteBack` copy kernel per mutation, so
no launch can run a program and drop its in-place updates.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from spyre_lab.compiler.access import Read
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.roofline import roofline_us
from spyre_lab.device.trace import Trace, TraceEvent
from spyre_lab.runtime.devices import LiveBuffer, SpyreDevice
from spyre_lab.runtime.launch.kernels import LaunchKernel, LaunchProgram, Operands
from spyre_lab.runtime.launch.plan import UNIT, JobPlan, Step, StepKind
from spyre_lab.runtime.stream import QueuedStep, Stream
from spyre_lab.runtime.tensor import device_nbytes
from spyre_lab.runtime.timeline import CALLBACK_LANE, PCIE_LANE, device_lane, dma_us

ADDRESS_BYTES = 8


def step_lane(kind: StepKind, stream: Stream) -> str:
    """Where a step of ``kind`` shows in the trace: PCIe, the host callback lane, or the stream's compute lane."""
    if kind in (StepKind.H2D, StepKind.D2H):
        return device_lane(PCIE_LANE, stream.device_index)
    if kind is StepKind.HOST_COMPUTE:
        return device_lane(CALLBACK_LANE, stream.device_index)
    return stream.lane


class CorrectionArea:
    """What a launch patches: a program's correction areas in the card's program segment (one address
    per slot per kernel) and the pinned host buffer the correction blob is written to, reused every launch."""

    def __init__(self, kernels: Sequence[LaunchKernel], device: SpyreDevice,
                 source: Sequence[LaunchKernel] | None = None, fixed: bool = False) -> None:
        self.device = device
        self.torch_device = torch.device("spyre", device.index)
        self.kernels = list(kernels)           # what every launch runs: bound once, not rebuilt per launch
        self.source = source                   # the program's own kernel list these were made from
        self.source_ids = tuple(map(id, source)) if source is not None else ()
        self.slots = [list(k.address_slots) for k in kernels]
        self.all_slots = list(dict.fromkeys(s for slots in self.slots for s in slots))
        self.slot_set = frozenset(self.all_slots)
        self.has_host = any(k.host for k in self.kernels)
        self.slot_counts = [len(slots) for slots in self.slots]
        self.offsets = [sum(self.slot_counts[:i]) for i in range(len(kernels))]
        total = max(1, sum(self.slot_counts))
        self.region = device.allocate_program_region(total * ADDRESS_BYTES, tag="correction areas")
        self.region_address = device.program_base + self.region.address
        self.region_data = torch.zeros(total, dtype=torch.int64)
        self.region_host = self.region_data.numpy()  # the same memory, copied into without a torch call
        self.pinned = torch.zeros(max([1, *self.slot_counts]), dtype=torch.int64)
        self.pinned_host = self.pinned.numpy()      # the same memory, written without a torch call per launch
        # per kernel, its part of the pinned buffer and of the correction areas (views made once, not per launch)
        self.pinned_views = [self.pinned_host[:n] for n in self.slot_counts]
        self.region_views = [self.region_host[o:o + n] for o, n in zip(self.offsets, self.slot_counts)]
        self.launches = 0
        self.fixed = fixed                     # the program's name and modeled times never change (see refresh)
        # per kernel, the intermediates-segment addresses it claims before it runs (a compiled program's plan)
        self.claims: list[dict[int, LiveBuffer]] = [{} for _ in kernels]
        self.patched: list[list[int]] = [[] for _ in kernels]   # per kernel, the addresses its prologue patched
        self._generation = device.generation
        self._record: JobPlan | None = None
        self._record_bytes: tuple[tuple[int, int], ...] = ()
        self._durations: list[float] = []
        self._queued: dict[tuple[int, str, tuple], list[QueuedKernel]] = {}
        weakref.finalize(self, device.free_program_region, self.region, self._generation)

    @property
    def last_patched(self) -> list[dict[str, int]]:
        """Per kernel, slot -> the DRAM address its last launch patched in (empty if it never ran)."""
        return [dict(zip(slots, addresses)) for slots, addresses in zip(self.slots, self.patched)]

    def valid(self) -> bool:
        return self._generation == self.device.generation

    def binds(self, program: LaunchProgram) -> bool:
        """Still the area of ``program``: same card generation, same kernels (a hand-made program may
        swap its kernel list between launches)."""
        kernels = program.kernels
        return (self.valid() and kernels is self.source and len(kernels) == len(self.source_ids)
                and all(id(k) == i for k, i in zip(kernels, self.source_ids)))


    # --- the launch image: what every launch of this program on this card repeats, worked out once ---------
    def refresh(self, program: LaunchProgram) -> None:
        """Forget the launch image if what it was made from changed (a hand-made program renamed, a kernel
        given another modeled time): the next launch works it out again."""
        record = self._record
        if record is not None and not self.fixed and (record.name != program.name or any(
                float(k.time_us) != d for k, d in zip(self.kernels, self._durations))):
            self._record = None
            self._queued.clear()

    def host_bytes(self, bindings: Mapping[str, torch.Tensor]) -> tuple[tuple[int, int], ...]:
        """Per host kernel, the bytes its operands move to the host and its results back (what its PCIe steps
        take): fixed by the bound tensors' sizes, so the same at every launch of a compiled program."""
        if not self.has_host:
            return ()
        out = []
        for kernel, slots in zip(self.kernels, self.slots):
            if kernel.host:
                outputs = set(kernel.output_slots)
                out.append((sum(device_nbytes(bindings[s]) for s in slots if s not in outputs),
                            sum(device_nbytes(bindings[s]) for s in slots if s in outputs)))
        return tuple(out)

    def record(self, program: LaunchProgram, host_bytes: tuple[tuple[int, int], ...] = ()) -> JobPlan:
        """The steps of a launch as a record (no actions): the same for every launch of a program whose host
        kernels (if any) move ``host_bytes``."""
        if self._record is None or self._record_bytes != host_bytes:
            self._durations = [float(k.time_us) for k in self.kernels]
            steps = [Step(kind, name, dur, nbytes, args)
                     for k in range(len(self.kernels))
                     for kind, name, dur, nbytes, args in self.step_fields(k, host_bytes)]
            self._record = JobPlan(program.name, steps, nodes=program.num_nodes or len(self.kernels))
            self._record_bytes = host_bytes
        return self._record

    def step_fields(self, k: int, host_bytes: tuple[tuple[int, int], ...] = ()
                    ) -> list[tuple[StepKind, str, float, int, dict[str, Any]]]:
        """Kernel ``k``'s three steps as (kind, name, modeled duration, bytes, trace args): the same at every launch."""
        kernel, n, offset = self.kernels[k], self.slot_counts[k], self.offsets[k]
        if kernel.host:                       # its operands cross PCIe to the host, its results come back
            bytes_in, bytes_out = host_bytes[sum(1 for j in self.kernels[:k] if j.host)]
            return [
                (StepKind.D2H, f"{kernel.name} inputs -> host", dma_us(bytes_in, self.device), bytes_in,
                 {"fallback": True}),
                (StepKind.HOST_COMPUTE, f"{kernel.name} on host", float(kernel.time_us), 0,
                 {"fallback": True, "timing": f"modeled ({kernel.timing})"}),
                (StepKind.H2D, f"{kernel.name} results -> device", dma_us(bytes_out, self.device), bytes_out,
                 {"fallback": True}),
            ]
        cfg, blob = self.device.config, self.slot_counts[k] * ADDRESS_BYTES
        return [
            (StepKind.HOST_COMPUTE, f"correct {kernel.name}",
             cfg.host_correction_base_us + cfg.host_correction_per_slot_us * n, 0,
             {"slots": n, "pinned_buffer": self.pinned.data_ptr()}),
            (StepKind.H2D, f"correction blob -> {kernel.name}", dma_us(blob, self.device), blob,
             {"region_address": self.region_address + offset * ADDRESS_BYTES}),
            (StepKind.COMPUTE, kernel.name, float(kernel.time_us), 0,
             {"timing": f"modeled ({kernel.timing})", **kernel.args}),
        ]

    def queued(self, stream: Stream, dispatch: str, host_bytes: tuple[tuple[int, int], ...] = ()
               ) -> list[QueuedKernel]:
        """Per kernel, in order, what ``stream`` enqueues for it with ``dispatch``: a device kernel's
        correction, blob copy and compute; a host kernel's D2H, host compute and H2D (moving ``host_bytes``)."""
        key = (stream.stream_id, dispatch, host_bytes)
        table = self._queued.get(key)
        if table is None:
            table = []
            for k, kernel in enumerate(self.kernels):
                steps = []
                for kind, name, dur, nbytes, args in self.step_fields(k, host_bytes):
                    extra = {"bytes": nbytes} if nbytes else {}
                    steps.append(QueuedStep(stream, name, UNIT[kind], step_lane(kind, stream), dur,
                                            {"kind": kind.value, "dispatch": dispatch, **extra, **args}))
                sim = None if kernel.host else kernel.sim_trace
                table.append(QueuedKernel(k, kernel, self.slots[k], self.offsets[k], tuple(steps),
                                          None if sim is None else sim.events))
            self._queued[key] = table
        return table


class QueuedKernel(NamedTuple):
    """One kernel of a launch as :func:`~spyre_lab.runtime.launch.route.launch` runs it: its operand slots and
    place in the correction area, its three queued steps (a host kernel's: D2H, host compute, H2D), and its simulator
    events (None: it has none)."""

    index: int
    kernel: LaunchKernel
    slots: list[str]
    offset: int
    steps: tuple[QueuedStep, QueuedStep, QueuedStep]
    sim_events: list[TraceEvent] | None


@dataclass(eq=False)
class WriteBack:
    """The copy kernel that lands one in-place update: the program's value for a mutated input
    (``source`` seen through ``read``'s views) is written into the input's own DRAM buffer.

    Timed by a roofline (read and write the bytes at DRAM bandwidth, plus the kernel launch cost):
    a compiler that re-used the input's buffer for the value would save this kernel."""

    target: str
    read: Read                                # the value: a buffer seen through views
    time_us: float
    timing: str = "roofline, in-place update copy"
    sim_trace: Trace | None = None
    host: bool = False

    @property
    def name(self) -> str:
        return f"write back {self.target}"

    @property
    def address_slots(self) -> list[str]:
        return [self.read.buffer, self.target]

    @property
    def output_slots(self) -> list[str]:
        return [self.target]

    @property
    def args(self) -> dict[str, Any]:
        return {"in_place_update": self.target, "from": self.read.buffer}

    def run(self, operands: Operands) -> None:
        operands.write(self.target, self.read.apply(operands[self.read.buffer]))


def writebacks(program: LaunchProgram, cfg: SpyreConfig) -> list[WriteBack]:
    """One :class:`WriteBack` per in-place update the program declares (``program.mutations``), timed on ``cfg``."""
    out = []
    for target, read in program.mutations:
        if read.buffer == target and read.is_identity:
            continue                          # the value is the input itself: nothing to write
        nbytes = device_nbytes(read.meta)
        time_us, _ = roofline_us(nbytes, nbytes, 0, "sfu", cfg)   # read it, write it
        out.append(WriteBack(target, read, time_us))
    return out


def launch_kernels(program: LaunchProgram, cfg: SpyreConfig) -> list[LaunchKernel]:
    """What a launch of ``program`` runs, in order: its kernels, then a write-back per in-place update."""
    return [*program.kernels, *writebacks(program, cfg)]


def correction_area(program: LaunchProgram, device: SpyreDevice) -> CorrectionArea:
    """The program's correction areas on ``device`` (made once, kept by the card while the program object lives)."""
    areas = device.correction_areas              # they live on the card: a reset card forgets them
    area = areas.get(program)
    if area is None or not area.binds(program):
        area = areas[program] = CorrectionArea(launch_kernels(program, device.config), device, program.kernels,
                                               getattr(program, "fixed_timing", False))
    return area
