"""JobPlan: the ordered steps of one launch, and program correction at launch time.

A compiled kernel's binary names its DRAM operands symbolically (``address_slots``); the real
addresses are only known when the program is launched with real tensors. The runtime patches them
in three ordered steps per kernel, as torch-spyre's ``SpyreStream::launch`` does:

1. **HostCompute** - a host callback computes the *correction blob* (the real DRAM address of every
   slot) into a pinned host buffer that is allocated once per loaded program and reused.
2. **H2D** - the blob is copied into the kernel's correction area in the program region on the card.
3. **Compute** - the kernel's prologue reads the blob, patches its operands and runs. Here the
   prologue resolves each operand by looking its address up in the card's live-buffer map, so a
   wrong address would really read the wrong buffer.

:class:`RuntimeOptions` picks how the host drives this:

* ``dispatch="aot_patch"`` (default): the steps are enqueued and the host returns; it prepares the
  next launch while the card works on this one (ordered queues keep the reused buffer safe).
* ``dispatch="rebuild"``: the host rebuilds the execution graph at every launch
  (``cfg.host_rebuild_per_node_us`` per node) and waits for the card: host and device serialised.

Both give the same numbers; only the trace differs.

The names a launch goes through, from compiler to card:

* a :class:`Launchable` is what gets launched: a name, its :class:`RuntimeKernel` s in order, the node
  count a "rebuild" reconstructs, and the in-place updates it must land. A compiler ``Program`` becomes
  one as a :class:`~spyre_lab.runtime.programs.LoadedProgram` (its kernels are ``LoadedKernel`` s);
  an eager op is an :class:`~spyre_lab.runtime.eager_programs.EagerProgram`; a hand-made program needs
  only those four attributes, with :class:`FunctionKernel` s for kernels that compute with a plain function;
* a :class:`CorrectionArea` is what a launch patches: the program's correction areas in the card's
  program segment and the pinned host buffer, made once per program and card (:func:`correction_area`).

**In-place updates.** A compiled graph is functional: ``x.add_(1)`` becomes a new buffer plus a
*mutation* (``program.mutations``: input slot <- value read) that must land in the caller's tensor.
:func:`launch_kernels`, which every launch reads its kernels from, appends one :class:`WriteBack`
copy kernel per mutation, so no launch path can run a program and drop its in-place updates.
:func:`launch` is the one way to launch (eager one-op programs, compiled programs, engine pieces).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import torch

from spyre_lab.compiler.access import Read
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.roofline import roofline_us
from spyre_lab.device.trace import Trace, TraceEvent
from spyre_lab.runtime.devices import LiveBuffer, SpyreDevice, get_device
from spyre_lab.runtime.streams import (
    CALLBACK_LANE,
    PCIE_LANE,
    TIMELINE,
    PreparedStep,
    Stream,
    current_stream,
    device_lane,
)
from spyre_lab.runtime.tensor import DeviceBuffer, buffer_of, device_nbytes, owns_its_memory

Dispatch = Literal["rebuild", "aot_patch"]
ADDRESS_BYTES = 8


@dataclass(frozen=True)
class RuntimeOptions:
    """How the host drives launches: ``"aot_patch"`` (async, patched programs) or ``"rebuild"``."""

    dispatch: Dispatch = "aot_patch"
    # with "aot_patch": False makes the host wait for each launch to finish before it prepares the next one
    # (patched programs, but host and device serialised), to separate patching from overlap in a study
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.dispatch not in ("rebuild", "aot_patch"):
            raise ValueError(f"RuntimeOptions.dispatch must be 'rebuild' or 'aot_patch', got {self.dispatch!r}")

    @property
    def trace_meta(self) -> dict[str, Any]:
        """What a launch's trace records of these options (a fresh dict: the trace keeps it)."""
        return {"dispatch": self.dispatch}


_DEFAULT_OPTIONS = RuntimeOptions()
_TIMING_ONLY = False


def is_timing_only() -> bool:
    """Are launches skipping their numerics (inside :func:`timing_only`)?"""
    return _TIMING_ONLY


@contextlib.contextmanager
def timing_only() -> Iterator[None]:
    """Launches inside the block are planned, enqueued and timed as usual but skip their numerics
    (step actions): a study can time a model whose weights were never written, e.g. one built on the
    meta device and given DRAM with ``to_empty``. Outputs read as zeros."""
    global _TIMING_ONLY
    previous, _TIMING_ONLY = _TIMING_ONLY, True
    try:
        yield
    finally:
        _TIMING_ONLY = previous


def default_options() -> RuntimeOptions:
    """The options launches use when they are given none (eager ops always use these)."""
    return _DEFAULT_OPTIONS


def set_default_options(options: RuntimeOptions) -> RuntimeOptions:
    """Switch every later launch, eager or compiled, e.g. to ``RuntimeOptions(dispatch="rebuild")``;
    returns the previous options so a study can put them back."""
    global _DEFAULT_OPTIONS
    if not isinstance(options, RuntimeOptions):
        raise TypeError(f"expected RuntimeOptions, got {type(options).__name__}")
    previous, _DEFAULT_OPTIONS = _DEFAULT_OPTIONS, options
    return previous


class StepKind(enum.StrEnum):
    H2D = "H2D"
    D2H = "D2H"
    COMPUTE = "Compute"
    HOST_COMPUTE = "HostCompute"


_UNIT = {StepKind.H2D: "pcie.h2d", StepKind.D2H: "pcie.d2h", StepKind.COMPUTE: "cores",
         StepKind.HOST_COMPUTE: "host.callback"}


@dataclass
class Step:
    """One entry of a stream's queue: what it is, how long it runs (modeled), what it does."""

    kind: StepKind
    name: str
    dur_us: float
    action: Callable[[], None] | None = None
    nbytes: int = 0
    on_start: Callable[[float], None] | None = field(default=None, repr=False)
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobPlan:
    """The ordered steps of one launch; ``nodes`` is what a "rebuild" dispatch reconstructs."""

    name: str
    steps: list[Step]
    nodes: int = 1

    def describe(self) -> str:
        lines = [f"JobPlan {self.name!r}: {len(self.steps)} steps"]
        for i, s in enumerate(self.steps):
            extra = f", {s.nbytes} B" if s.nbytes else ""
            lines.append(f"  {i:2d}. {s.kind.value:<11} {s.name} ({s.dur_us:.2f} us modeled{extra})")
        return "\n".join(lines)

    def without_actions(self) -> JobPlan:
        """The same steps with their actions dropped: a record that keeps no buffers alive."""
        steps = [Step(s.kind, s.name, s.dur_us, None, s.nbytes, None, s.args) for s in self.steps]
        return JobPlan(self.name, steps, self.nodes)

    def submit(self, stream: Stream | None = None, options: RuntimeOptions | None = None) -> None:
        """Enqueue every step in order on ``stream`` and run its action (the numerics)."""
        global _LAST_PLAN
        stream = current_stream() if stream is None else stream
        options = _DEFAULT_OPTIONS if options is None else options
        cfg = get_device(stream.device_index).config
        _LAST_PLAN = self.without_actions()
        if options.dispatch == "rebuild":
            TIMELINE.host_work(f"rebuild graph {self.name}", cfg.host_rebuild_per_node_us * self.nodes,
                               nodes=self.nodes, dispatch="rebuild")
        for step in self.steps:
            lane = _lane(step.kind, stream)
            extra = {"bytes": step.nbytes} if step.nbytes else {}
            start, _ = stream.enqueue(step.name, _UNIT[step.kind], lane, step.dur_us, kind=step.kind.value,
                                      dispatch=options.dispatch, **extra, **step.args)
            if step.on_start is not None:
                step.on_start(start)
            if step.action is not None and not _TIMING_ONLY:
                step.action()
        if options.dispatch == "rebuild" or not options.overlap:
            stream.synchronize()


_LAST_PLAN: JobPlan | None = None


def last_plan() -> JobPlan | None:
    """The JobPlan submitted last (``print(last_plan().describe())`` lists its steps)."""
    return _LAST_PLAN


def _lane(kind: StepKind, stream: Stream) -> str:
    if kind in (StepKind.H2D, StepKind.D2H):
        return device_lane(PCIE_LANE, stream.device_index)
    if kind is StepKind.HOST_COMPUTE:
        return device_lane(CALLBACK_LANE, stream.device_index)
    return stream.lane


def dma_us(nbytes: int, device: SpyreDevice) -> float:
    """Modeled PCIe time of one DMA: fixed latency plus bytes over the effective bandwidth."""
    cfg = device.config
    return cfg.pcie_latency_us + nbytes / cfg.pcie_bandwidth * 1e6


# --- kernels and programs ---------------------------------------------------------------------
Window = tuple[DeviceBuffer, tuple[int, ...], tuple[int, ...], int]
"""An operand as a kernel sees it: the live buffer at its patched address, and its size, stride and offset."""


class Operands:
    """What a kernel's prologue hands its body: operands found through their patched addresses.

    Each slot is a (buffer, size, stride, offset) window; ``operands[slot]`` reads it as a host
    tensor and ``operands.write(slot, values)`` writes it back into the buffer's DRAM payload.
    """

    def __init__(self, windows: Mapping[str, Window]) -> None:
        self._windows = windows if type(windows) is dict else dict(windows)   # the launch hands over its own dict

    def __getitem__(self, slot: str) -> torch.Tensor:
        buffer, size, stride, offset = self._windows[slot]
        return buffer.read_window(size, stride, offset)

    def write(self, slot: str, values: torch.Tensor) -> None:
        """A kernel hands over what it writes: a result that owns its memory becomes the buffer's contents as it
        is; anything that shares memory (a view of an operand) is copied."""
        buffer, size, stride, offset = self._windows[slot]
        buffer.write_window(size, stride, offset, values, adopt=owns_its_memory(values))

    def window(self, slot: str) -> Window:
        """The (buffer, size, stride, offset) the prologue resolved for ``slot``: for a kernel that writes only
        part of an operand's buffer (``DeviceBuffer.write_rows``)."""
        return self._windows[slot]

    def __contains__(self, slot: str) -> bool:
        return slot in self._windows


class RuntimeKernel(Protocol):
    """What a launch runs: its operands by symbolic slot, its modeled time and where that comes from,
    whether it runs on the host (a CPU fallback inside a program), and the computation itself."""

    @property
    def name(self) -> str: ...
    @property
    def address_slots(self) -> Sequence[str]: ...
    @property
    def output_slots(self) -> Sequence[str]: ...
    @property
    def time_us(self) -> float: ...
    @property
    def timing(self) -> str: ...
    @property
    def sim_trace(self) -> Trace | None: ...
    @property
    def args(self) -> Mapping[str, Any]: ...
    @property
    def host(self) -> bool: ...

    def run(self, operands: Operands) -> None: ...


class Launchable(Protocol):
    """What :func:`launch` accepts: a name, kernels in launch order, the node count a "rebuild" dispatch
    reconstructs, and the in-place updates (input slot <- compiler ``Read`` of a value) to land."""

    @property
    def name(self) -> str: ...
    @property
    def kernels(self) -> Sequence[RuntimeKernel]: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def mutations(self) -> Sequence[tuple[str, Read]]: ...


@dataclass
class FunctionKernel:
    """A kernel from a plain function: ``compute(operands)`` reads ``operands[slot]`` and writes outputs.

    ``time_us`` is its modeled device time; ``sim_trace`` (optional) holds per-core events relative to
    the kernel start, placed on the launch trace when the kernel runs. ``timing`` says where the time
    comes from (``"simulated"``, ``"roofline"``, ...), so a trace never passes one off as the other.
    """

    name: str
    address_slots: list[str]
    compute: Callable[[Operands], None]
    time_us: float
    timing: str = "given"
    sim_trace: Trace | None = None
    args: dict[str, Any] = field(default_factory=dict)
    host: bool = False

    @property
    def output_slots(self) -> list[str]:
        return list(self.address_slots)

    def run(self, operands: Operands) -> None:
        self.compute(operands)


class CorrectionArea:
    """What a launch patches: a program's correction areas in the card's program segment (one address
    per slot per kernel) and the pinned host buffer the correction blob is written to, reused every launch."""

    def __init__(self, kernels: Sequence[RuntimeKernel], device: SpyreDevice,
                 source: Sequence[RuntimeKernel] | None = None, fixed: bool = False) -> None:
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
        self.launches = 0
        self.fixed = fixed                     # the program's name and modeled times never change (see refresh)
        # per kernel, the intermediates-segment addresses it claims before it runs (a compiled program's plan)
        self.claims: list[dict[int, LiveBuffer]] = [{} for _ in kernels]
        self._patched: list[list[int]] = [[] for _ in kernels]   # per kernel, the addresses its prologue patched
        self._generation = device.generation
        self._record: JobPlan | None = None
        self._record_bytes: tuple[tuple[int, int], ...] = ()
        self._durations: list[float] = []
        self._prepared: dict[tuple[int, str, tuple], list[PreparedKernel]] = {}
        weakref.finalize(self, device.free_program_region, self.region, self._generation)

    @property
    def last_patched(self) -> list[dict[str, int]]:
        """Per kernel, slot -> the DRAM address its last launch patched in (empty if it never ran)."""
        return [dict(zip(slots, addresses)) for slots, addresses in zip(self.slots, self._patched)]

    def valid(self) -> bool:
        return self._generation == self.device.generation

    def binds(self, program: Launchable) -> bool:
        """Still the area of ``program``: same card generation, same kernels (a hand-made program may
        swap its kernel list between launches)."""
        kernels = program.kernels
        return (self.valid() and kernels is self.source and len(kernels) == len(self.source_ids)
                and all(id(k) == i for k, i in zip(kernels, self.source_ids)))


    # --- the launch image: what every launch of this program on this card repeats, worked out once ---------
    def refresh(self, program: Launchable) -> None:
        """Forget the launch image if what it was made from changed (a hand-made program renamed, a kernel
        given another modeled time): the next launch works it out again."""
        record = self._record
        if record is not None and not self.fixed and (record.name != program.name or any(
                float(k.time_us) != d for k, d in zip(self.kernels, self._durations))):
            self._record = None
            self._prepared.clear()

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

    def record(self, program: Launchable, host_bytes: tuple[tuple[int, int], ...] = ()) -> JobPlan:
        """The steps of a launch as a record (no actions): the same for every launch of a program whose host
        kernels (if any) move ``host_bytes``."""
        if self._record is None or self._record_bytes != host_bytes:
            self._durations = [float(k.time_us) for k in self.kernels]
            steps = [Step(kind, name, dur, None, nbytes, None, args)
                     for k in range(len(self.kernels))
                     for kind, name, dur, nbytes, args in self._static_steps(k, host_bytes)]
            self._record = JobPlan(program.name, steps, nodes=program.num_nodes or len(self.kernels))
            self._record_bytes = host_bytes
        return self._record

    def _static_steps(self, k: int, host_bytes: tuple[tuple[int, int], ...] = ()
                      ) -> list[tuple[StepKind, str, float, int, dict[str, Any]]]:
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

    def prepared(self, stream: Stream, dispatch: str, host_bytes: tuple[tuple[int, int], ...] = ()
                 ) -> list[PreparedKernel]:
        """Per kernel, in order, what ``stream`` enqueues for it with ``dispatch``: a device kernel's
        correction, blob copy and compute; a host kernel's D2H, host compute and H2D (moving ``host_bytes``)."""
        key = (stream.stream_id, dispatch, host_bytes)
        table = self._prepared.get(key)
        if table is None:
            table = []
            for k, kernel in enumerate(self.kernels):
                steps = []
                for kind, name, dur, nbytes, args in self._static_steps(k, host_bytes):
                    extra = {"bytes": nbytes} if nbytes else {}
                    steps.append(PreparedStep(stream, name, _UNIT[kind], _lane(kind, stream), dur,
                                              {"kind": kind.value, "dispatch": dispatch, **extra, **args}))
                sim = None if kernel.host else kernel.sim_trace
                table.append(PreparedKernel(k, kernel, self.slots[k], self.offsets[k], tuple(steps),
                                            None if sim is None else sim.events))
            self._prepared[key] = table
        return table


class PreparedKernel(NamedTuple):
    """One kernel of a launch as :func:`_submit_prepared` runs it: its operand slots and place in the
    correction area, its three prepared steps (a host kernel's: D2H, host compute, H2D), and its simulator
    events (None: it has none)."""

    index: int
    kernel: RuntimeKernel
    slots: list[str]
    offset: int
    steps: tuple[PreparedStep, PreparedStep, PreparedStep]
    sim_events: list[TraceEvent] | None


_AREAS: weakref.WeakKeyDictionary[Launchable, dict[int, CorrectionArea]] = weakref.WeakKeyDictionary()


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


def writebacks(program: Launchable, cfg: SpyreConfig) -> list[WriteBack]:
    """One :class:`WriteBack` per in-place update the program declares (``program.mutations``), timed on ``cfg``."""
    out = []
    for target, read in program.mutations:
        if read.buffer == target and read.is_identity:
            continue                          # the value is the input itself: nothing to write
        time_us, _ = roofline_us(2 * device_nbytes(read.meta), 0, "sfu", cfg)   # read it, write it
        out.append(WriteBack(target, read, time_us))
    return out


def launch_kernels(program: Launchable, cfg: SpyreConfig) -> list[RuntimeKernel]:
    """What a launch of ``program`` runs, in order: its kernels, then a write-back per in-place update."""
    return [*program.kernels, *writebacks(program, cfg)]


def correction_area(program: Launchable, device: SpyreDevice) -> CorrectionArea:
    """The program's correction areas on ``device`` (made once, kept while the program object lives)."""
    per_device = _AREAS.get(program)
    if per_device is None:
        per_device = _AREAS[program] = {}
    area = per_device.get(device.index)
    if area is None or not area.binds(program):
        area = per_device[device.index] = CorrectionArea(launch_kernels(program, device.config), device,
                                                         program.kernels, getattr(program, "fixed_timing", False))
    return area


def plan_launch(program: Launchable, bindings: Mapping[str, torch.Tensor],
                device: SpyreDevice | None = None) -> JobPlan:
    """The JobPlan of one launch of ``program`` with slots bound to spyre tensors."""
    if device is None:
        first = next(iter(bindings.values()), None)
        device = get_device(first.device.index if first is not None else None)
    index = device.index
    for t in bindings.values():
        d = t.device
        if d.type != "spyre" or d.index != index:
            elsewhere = {slot: str(t.device) for slot, t in bindings.items()
                         if t.device != torch.device("spyre", index)}
            raise ValueError(f"a launch on spyre:{index} needs every bound tensor there; {elsewhere} are not "
                             f"(move them with .to('spyre:{index}'))")
    area = correction_area(program, device)
    for kernel, slots in zip(area.kernels, area.slots):
        missing = [s for s in slots if s not in bindings]
        if missing:
            raise KeyError(f"kernel {kernel.name!r} needs address slot(s) {missing} but the launch binds only "
                           f"{sorted(bindings)}")
    return JobPlan(program.name, _plan_steps(area, bindings), nodes=program.num_nodes or len(area.kernels))


def _plan_steps(area: CorrectionArea, bindings: Mapping[str, torch.Tensor]) -> list[Step]:
    """Every kernel's steps (the area's own, :meth:`CorrectionArea._static_steps`) with the actions that do
    the work: write the correction blob, copy it, patch and run; or, for a host kernel, run it on the host."""
    host_bytes = area.host_bytes(bindings)
    steps = []
    for k, kernel in enumerate(area.kernels):
        make = _host_actions if kernel.host else _device_actions
        actions = make(kernel, k, bindings, area)
        steps.extend(Step(kind, name, dur, action, nbytes, on_start, args)
                     for (kind, name, dur, nbytes, args), (action, on_start)
                     in zip(area._static_steps(k, host_bytes), actions))
    return steps


Actions = list[tuple[Callable[[], None] | None, Callable[[float], None] | None]]
"""Per step of a kernel: its action and what it does when it starts (None: nothing)."""


def _device_actions(kernel: RuntimeKernel, k: int, bindings: Mapping[str, torch.Tensor],
                    area: CorrectionArea) -> Actions:
    slots = area.slots[k]
    n, offset = len(slots), area.offsets[k]
    views = {s: bindings[s] for s in slots}

    def correct() -> None:
        area.pinned_host[:n] = [buffer_of(views[s]).address for s in slots]

    def copy_blob() -> None:
        area.region_data[offset:offset + n] = area.pinned[:n]

    def patch_and_run() -> None:
        addresses = area.region_data[offset:offset + n].tolist()
        area._patched[k] = addresses
        area.device.claim(area.claims[k])
        resolved = {s: _resolve(area.device, a, views[s]) for s, a in zip(slots, addresses)}
        kernel.run(Operands(resolved))
        if k == len(area.slot_counts) - 1:
            area.launches += 1

    def place_sim_trace(start: float) -> None:
        sim = kernel.sim_trace
        if sim is not None:
            index = area.device.index
            TIMELINE.emit_shifted(sim.events, start, None if index == 0 else lambda lane: device_lane(lane, index))

    return [(correct, None), (copy_blob, None), (patch_and_run, place_sim_trace)]


def _host_actions(kernel: RuntimeKernel, k: int, bindings: Mapping[str, torch.Tensor],
                  area: CorrectionArea) -> Actions:
    """A kernel the device cannot run: its operands cross PCIe to the host, it runs there, its results come back."""
    views = {s: bindings[s] for s in area.slots[k]}

    def run_on_host() -> None:
        area.device.claim(area.claims[k])
        kernel.run(Operands({s: _resolve(area.device, buffer_of(v).address, v) for s, v in views.items()}))

    return [(None, None), (run_on_host, None), (None, None)]


def _address_of(view: torch.Tensor, generation: int) -> int:
    """``buffer_of(view).address`` for a tensor a launch bound on its card (so it has a buffer): what the host
    writes into the correction blob for it."""
    buffer = view.untyped_storage().spyre_buffer
    if buffer.generation != generation:
        buffer.check_valid()                             # the error of a tensor from before a device reset
    return buffer.allocation.address


def _resolve(device: SpyreDevice, address: int, static_view: torch.Tensor) -> Window:
    """The operand window at a patched ``address``: the live buffer there, with the kernel's static
    size/stride/offset (compiled into the program; only base addresses are patched)."""
    buffer = device.buffer_at(address)
    buffer.check_valid()
    if buffer.host_dtype != static_view.dtype:
        raise RuntimeError(f"patched address {address:#x} holds {buffer.host_dtype} data but the kernel expects "
                           f"{static_view.dtype}; the correction blob is stale")
    return buffer, static_view.shape, static_view.stride(), static_view.storage_offset()


def launch(program: Launchable, bindings: Mapping[str, torch.Tensor], *, stream: Stream | None = None,
           options: RuntimeOptions | None = None, **trace_args: Any) -> JobPlan:
    """Plan and submit one launch of ``program``, in-place updates included; returns the JobPlan that
    ran (its trace: ``last_trace()``). Every device launch goes through here.

    The work that is the same at every launch of a program on a card (its kernels, write-backs, step
    names, durations, lanes and trace args) is worked out once, in the program's :class:`CorrectionArea`;
    a launch computes the correction blob (the addresses), copies it to the card, patches and runs
    each kernel: the steps and events are exactly those of ``plan_launch(...).submit(...)``."""
    if stream is None:
        first = next(iter(bindings.values()), None)
        stream = current_stream(first.device.index if first is not None else None)
    device = get_device(stream.device_index)
    options = _DEFAULT_OPTIONS if options is None else options
    area = correction_area(program, device)
    meta = {"dispatch": options.dispatch, **trace_args} if trace_args else options.trace_meta
    if not _binds_every_slot(area, bindings):
        plan = plan_launch(program, bindings, device)        # explains what is wrong with the binding
        TIMELINE.begin_launch(plan.name, meta)
        try:
            plan.submit(stream, options)
        finally:
            TIMELINE.end_launch()
        return plan
    _launch_prepared(program, area, bindings, stream, options, meta)
    return _LaunchedPlan(area, bindings, _LAST_PLAN)


def launch_bound(program: Launchable, area: CorrectionArea, bindings: Mapping[str, torch.Tensor],
                 stream: Stream | None = None, options: RuntimeOptions | None = None) -> None:
    """:func:`launch` for a caller that bound every slot of ``area`` (``correction_area(program, card)``)
    to a buffer on that card itself, as ``run_program`` does: nothing to check again, and no JobPlan to
    return (``last_plan()`` has the record)."""
    stream = current_stream(area.device.index) if stream is None else stream
    options = _DEFAULT_OPTIONS if options is None else options
    _launch_prepared(program, area, bindings, stream, options, options.trace_meta)


def _launch_prepared(program: Launchable, area: CorrectionArea, bindings: Mapping[str, torch.Tensor],
                     stream: Stream, options: RuntimeOptions, meta: dict[str, Any]) -> None:
    TIMELINE.begin_launch(program.name, meta)
    try:
        _submit_prepared(program, area, bindings, stream, options)
    finally:
        TIMELINE.end_launch()


def _binds_every_slot(area: CorrectionArea, bindings: Mapping[str, torch.Tensor]) -> bool:
    """Every slot bound, every bound tensor on the area's card (else ``plan_launch`` says what is wrong)."""
    if len(bindings) < len(area.all_slots) or not bindings.keys() >= area.slot_set:
        return False
    expected = area.torch_device
    return all(t.device == expected for t in bindings.values())


def _submit_prepared(program: Launchable, area: CorrectionArea, bindings: Mapping[str, torch.Tensor],
                     stream: Stream, options: RuntimeOptions) -> None:
    """``JobPlan.submit`` of a launch from its prepared steps: same clock, same events, same actions."""
    global _LAST_PLAN
    area.refresh(program)
    host_bytes = area.host_bytes(bindings)
    _LAST_PLAN = area.record(program, host_bytes)
    dispatch = options.dispatch
    if dispatch == "rebuild":
        nodes = _LAST_PLAN.nodes
        TIMELINE.host_work(f"rebuild graph {_LAST_PLAN.name}", area.device.config.host_rebuild_per_node_us * nodes,
                           nodes=nodes, dispatch="rebuild")
    numerics = not _TIMING_ONLY
    device, pinned, region = area.device, area.pinned_host, area.region_host
    enqueue_all = stream.enqueue_all
    emit_shifted = TIMELINE.emit_shifted
    lane_of = None if device.index == 0 else functools.partial(device_lane, device_index=device.index)
    claims, claim = area.claims, device.claim
    buffer_at, generation = device.buffer_at, device.generation
    for k, kernel, slots, offset, steps, sim_events in area.prepared(stream, dispatch, host_bytes):
        # a device kernel: HostCompute writes the real addresses into the pinned buffer, H2D copies the blob into
        # the kernel's correction area, Compute's prologue patches the operands and the kernel runs; a host
        # kernel: D2H of its operands, the op on the host, H2D of its results
        start = enqueue_all(steps)
        if sim_events is not None:
            emit_shifted(sim_events, start, lane_of)
        if not numerics:
            continue
        views = [bindings[s] for s in slots]
        claim(claims[k])
        if kernel.host:
            kernel.run(Operands({s: _resolve(device, buffer_of(v).address, v) for s, v in zip(slots, views)}))
            continue
        n = len(slots)
        pinned[:n] = [_address_of(v, generation) for v in views]
        region[offset:offset + n] = pinned[:n]
        addresses = region[offset:offset + n].tolist()
        area._patched[k] = addresses
        windows = {}
        for s, a, v in zip(slots, addresses, views):      # the prologue: what each patched address holds
            buffer = buffer_at(a)
            if buffer.generation != generation or buffer.host_dtype != v.dtype:
                buffer = _resolve(device, a, v)[0]         # says what is wrong
            windows[s] = (buffer, v.shape, v.stride(), v.storage_offset())
        kernel.run(Operands(windows))
    if numerics and area.kernels:
        area.launches += 1
    if dispatch == "rebuild" or not options.overlap:
        stream.synchronize()


class _LaunchedPlan(JobPlan):
    """What :func:`launch` returns: the JobPlan that ran, its steps (with their actions) made when read."""

    def __init__(self, area: CorrectionArea, bindings: Mapping[str, torch.Tensor], record: JobPlan) -> None:
        self.name, self.nodes = record.name, record.nodes
        self._area, self._bindings = area, bindings

    def __getattr__(self, attr: str) -> Any:
        if attr != "steps":
            raise AttributeError(attr)
        steps = _plan_steps(self._area, self._bindings)
        self.steps = steps
        return steps
