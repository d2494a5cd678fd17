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

Both give the same numbers; only the trace differs. Any object with ``kernels`` (or ``launches``),
each kernel having ``name``, ``address_slots``, a modeled ``time_us`` and ``run(operands)``, can be
launched; :class:`ProgramKernel` adapts anything that computes with a plain function.

**In-place updates.** A compiled graph is functional: ``x.add_(1)`` becomes a new buffer plus a
*mutation* (``program.mutations``: input slot <- value read) that must land in the caller's tensor.
:func:`program_kernels`, which every launch reads its kernels from, appends one :class:`WriteBack`
copy kernel per mutation, so no launch path can run a program and drop its in-place updates.
:func:`launch` is the one way to launch (eager one-op programs, compiled programs, engine pieces).
"""

from __future__ import annotations

import dataclasses
import enum
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from spyre_lab.device.trace import Trace
from spyre_lab.runtime.device_module import SpyreDevice, get_device
from spyre_lab.runtime.streams import CALLBACK_LANE, PCIE_LANE, TIMELINE, Stream, current_stream, device_lane
from spyre_lab.runtime.tensor import buffer_of, device_nbytes

Dispatch = Literal["rebuild", "aot_patch"]
ADDRESS_BYTES = 8


@dataclass(frozen=True)
class RuntimeOptions:
    """How the host drives launches: ``"aot_patch"`` (async, patched programs) or ``"rebuild"``."""

    dispatch: Dispatch = "aot_patch"

    def __post_init__(self) -> None:
        if self.dispatch not in ("rebuild", "aot_patch"):
            raise ValueError(f"RuntimeOptions.dispatch must be 'rebuild' or 'aot_patch', got {self.dispatch!r}")


_DEFAULT_OPTIONS = RuntimeOptions()


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
        steps = [dataclasses.replace(s, action=None, on_start=None) for s in self.steps]
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
            if step.action is not None:
                step.action()
        if options.dispatch == "rebuild":
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
class Operands:
    """What a kernel's prologue hands its body: operands found through their patched addresses.

    Each slot is a (buffer, size, stride, offset) window; ``operands[slot]`` reads it as a host
    tensor and ``operands.write(slot, values)`` writes it back into the buffer's DRAM payload.
    """

    def __init__(self, windows: Mapping[str, tuple[Any, tuple[int, ...], tuple[int, ...], int]]) -> None:
        self._windows = dict(windows)

    def __getitem__(self, slot: str) -> torch.Tensor:
        buffer, size, stride, offset = self._windows[slot]
        return buffer.read_window(size, stride, offset)

    def write(self, slot: str, values: torch.Tensor) -> None:
        buffer, size, stride, offset = self._windows[slot]
        buffer.write_window(size, stride, offset, values)

    def __contains__(self, slot: str) -> bool:
        return slot in self._windows


class LaunchableKernel(Protocol):
    name: str
    address_slots: Sequence[str]

    def run(self, operands: Operands) -> None: ...


@dataclass
class ProgramKernel:
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

    def run(self, operands: Operands) -> None:
        self.compute(operands)


class ProgramImage:
    """A program loaded on one card: its correction areas in DRAM and the reused pinned buffer."""

    def __init__(self, kernels: Sequence[Any], device: SpyreDevice) -> None:
        self.device = device
        self.slot_counts = [len(k.address_slots) for k in kernels]
        self.offsets = [sum(self.slot_counts[:i]) for i in range(len(kernels))]
        total = max(1, sum(self.slot_counts))
        self.region = device.allocate_program_region(total * ADDRESS_BYTES, tag="correction areas")
        self.region_address = device.program_base + self.region.address
        self.region_data = torch.zeros(total, dtype=torch.int64)
        self.pinned = torch.zeros(max([1, *self.slot_counts]), dtype=torch.int64)
        self.launches = 0
        self.last_patched: list[dict[str, int]] = [{} for _ in kernels]
        self._generation = device.generation
        weakref.finalize(self, device.free_program_region, self.region, self._generation)

    def valid(self) -> bool:
        return self._generation == self.device.generation


_IMAGES: weakref.WeakKeyDictionary[Any, dict[int, ProgramImage]] = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class WriteBack:
    """The copy kernel that lands one in-place update: the program's value for a mutated input
    (``source`` seen through ``read``'s views) is written into the input's own DRAM buffer.

    Timed by a roofline (read and write the bytes at DRAM bandwidth, plus the kernel launch cost):
    a compiler that re-used the input's buffer for the value would save this kernel."""

    target: str
    read: Any                                 # compiler Read: buffer + views; anything with .buffer and .apply
    time_us: float
    timing: str = "roofline, in-place update copy"
    sim_trace: Trace | None = None

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


def writebacks(program: Any) -> list[WriteBack]:
    """One :class:`WriteBack` per in-place update the program declares (``program.mutations``)."""
    mutations = list(getattr(program, "mutations", None) or ())
    if not mutations:
        return []
    from spyre_lab.device.config import SPYRE

    cfg = getattr(program, "cfg", None) or SPYRE
    launch_us = cfg.cycles_to_us(cfg.kernel_launch_cycles)
    out = []
    for target, read in mutations:
        if read.buffer == target and read.is_identity:
            continue                          # the value is the input itself: nothing to write
        meta = getattr(read, "meta", None)
        nbytes = device_nbytes(meta) if isinstance(meta, torch.Tensor) else 0
        out.append(WriteBack(target, read, 2 * nbytes / cfg.dram_bandwidth * 1e6 + launch_us))
    return out


def program_kernels(program: Any) -> list[Any]:
    """What a launch of ``program`` runs, in order: its kernels, then a write-back per in-place update."""
    kernels = getattr(program, "kernels", None)
    if kernels is None:
        kernels = getattr(program, "launches", None)
    if kernels is None:
        raise TypeError(f"{type(program).__name__} is not launchable: it needs a 'kernels' or 'launches' list")
    return [*kernels, *writebacks(program)]


def load_program(program: Any, device: SpyreDevice) -> ProgramImage:
    """The program's image on ``device`` (loaded once, kept while the program object lives)."""
    per_device = _IMAGES.setdefault(program, {})
    image = per_device.get(device.index)
    if image is None or not image.valid():
        image = per_device[device.index] = ProgramImage(program_kernels(program), device)
    return image


def plan_launch(program: Any, bindings: Mapping[str, torch.Tensor], device: SpyreDevice | None = None) -> JobPlan:
    """The JobPlan of one launch of ``program`` with slots bound to spyre tensors."""
    kernels = program_kernels(program)
    if device is None:
        first = next(iter(bindings.values()), None)
        device = get_device(first.device.index if first is not None else None)
    elsewhere = {slot: str(t.device) for slot, t in bindings.items() if t.device != torch.device("spyre", device.index)}
    if elsewhere:
        raise ValueError(f"a launch on spyre:{device.index} needs every bound tensor there; {elsewhere} are not "
                         f"(move them with .to('spyre:{device.index}'))")
    image = load_program(program, device)
    cfg = device.config
    steps: list[Step] = []
    for k, kernel in enumerate(kernels):
        slots = list(kernel.address_slots)
        missing = [s for s in slots if s not in bindings]
        if missing:
            raise KeyError(f"kernel {kernel.name!r} needs address slot(s) {missing} but the launch binds only "
                           f"{sorted(bindings)}")
        steps.extend(_kernel_steps(kernel, k, slots, bindings, image, cfg))
    nodes = getattr(program, "num_nodes", None) or len(kernels)
    return JobPlan(getattr(program, "name", type(program).__name__), steps, nodes=nodes)


def _kernel_steps(kernel: Any, k: int, slots: list[str], bindings: Mapping[str, torch.Tensor],
                  image: ProgramImage, cfg: Any) -> list[Step]:
    n, offset = len(slots), image.offsets[k]
    views = {s: bindings[s] for s in slots}

    def correct() -> None:
        addresses = [buffer_of(views[s]).address for s in slots]
        image.pinned[:n] = torch.tensor(addresses, dtype=torch.int64)

    def copy_blob() -> None:
        image.region_data[offset:offset + n] = image.pinned[:n]

    def patch_and_run() -> None:
        addresses = image.region_data[offset:offset + n].tolist()
        image.last_patched[k] = dict(zip(slots, addresses))
        resolved = {s: _resolve(image.device, a, views[s]) for s, a in zip(slots, addresses)}
        kernel.run(Operands(resolved))
        if k == len(image.slot_counts) - 1:
            image.launches += 1

    def place_sim_trace(start: float) -> None:
        sim = getattr(kernel, "sim_trace", None)
        if sim is not None:
            index = image.device.index
            TIMELINE.emit_shifted(sim.events, start, None if index == 0 else lambda lane: device_lane(lane, index))

    time_us = float(getattr(kernel, "time_us", 0.0))
    timing = getattr(kernel, "timing", "given")
    if getattr(kernel, "host", False):
        return _host_kernel_steps(kernel, slots, views, image, time_us, timing)
    blob = n * ADDRESS_BYTES
    return [
        Step(StepKind.HOST_COMPUTE, f"correct {kernel.name}",
             cfg.host_correction_base_us + cfg.host_correction_per_slot_us * n, correct,
             args={"slots": n, "pinned_buffer": image.pinned.data_ptr()}),
        Step(StepKind.H2D, f"correction blob -> {kernel.name}", dma_us(blob, image.device), copy_blob, nbytes=blob,
             args={"region_address": image.region_address + offset * ADDRESS_BYTES}),
        Step(StepKind.COMPUTE, kernel.name, time_us, patch_and_run, on_start=place_sim_trace,
             args={"timing": f"modeled ({timing})", **getattr(kernel, "args", {})}),
    ]


def _host_kernel_steps(kernel: Any, slots: list[str], views: Mapping[str, torch.Tensor], image: ProgramImage,
                       time_us: float, timing: str) -> list[Step]:
    """A launch the device cannot run: its operands cross PCIe to the host and its results come back."""
    outputs = set(getattr(kernel, "output_slots", slots))
    bytes_in = sum(device_nbytes(views[s]) for s in slots if s not in outputs)
    bytes_out = sum(device_nbytes(views[s]) for s in slots if s in outputs)

    def run_on_host() -> None:
        windows = {s: _resolve(image.device, buffer_of(views[s]).address, views[s]) for s in slots}
        kernel.run(Operands(windows))

    return [
        Step(StepKind.D2H, f"{kernel.name} inputs -> host", dma_us(bytes_in, image.device), nbytes=bytes_in,
             args={"fallback": True}),
        Step(StepKind.HOST_COMPUTE, f"{kernel.name} on host", time_us, run_on_host,
             args={"fallback": True, "timing": f"modeled ({timing})"}),
        Step(StepKind.H2D, f"{kernel.name} results -> device", dma_us(bytes_out, image.device), nbytes=bytes_out,
             args={"fallback": True}),
    ]


def _resolve(device: SpyreDevice, address: int, static_view: torch.Tensor) -> tuple[Any, tuple, tuple, int]:
    """The operand window at a patched ``address``: the live buffer there, with the kernel's static
    size/stride/offset (compiled into the program; only base addresses are patched)."""
    buffer = device.buffer_at(address)
    buffer.check_valid()
    if buffer.host_dtype != static_view.dtype:
        raise RuntimeError(f"patched address {address:#x} holds {buffer.host_dtype} data but the kernel expects "
                           f"{static_view.dtype}; the correction blob is stale")
    return buffer, tuple(static_view.size()), tuple(static_view.stride()), static_view.storage_offset()


def launch(program: Any, bindings: Mapping[str, torch.Tensor], *, stream: Stream | None = None,
           options: RuntimeOptions | None = None, **trace_args: Any) -> JobPlan:
    """Plan and submit one launch of ``program``, in-place updates included; returns the JobPlan that
    ran (its trace: ``last_trace()``). Every device launch goes through here."""
    first = next(iter(bindings.values()), None)
    index = first.device.index if first is not None else None
    stream = current_stream(index) if stream is None else stream
    plan = plan_launch(program, bindings, get_device(stream.device_index))
    with TIMELINE.launch(plan.name, dispatch=(options or _DEFAULT_OPTIONS).dispatch, **trace_args):
        plan.submit(stream, options)
    return plan
