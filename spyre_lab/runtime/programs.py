"""A compiler Program on the card: loaded once (:class:`LoadedProgram`), bound to DRAM buffers, launched.

The compiler hands over a ``Program``: ordered launches (``KernelSpec``, ``HostFallback`` or
``UnplannedSpec``), each naming its DRAM operands by symbolic ``address_slots``, plus graph
inputs, constants, outputs and the buffers' shapes. :func:`run_program` does what the host runtime
does with it:

* uploads the program's constants once per card (they live with the loaded program),
* allocates a DRAM buffer for every output of this launch; the program's intermediates were placed once,
  by live range, in the card's intermediates segment (:mod:`~spyre_lab.runtime.intermediates`),
* launches every kernel through the one launch route, :mod:`~spyre_lab.runtime.launch` (HostCompute correction ->
  H2D of the blob -> Compute), a host fallback as D2H -> HostCompute -> H2D,
* lands the program's in-place updates (``program.mutations``) in the caller's tensors: the launch
  ends with one write-back kernel per mutated input (:class:`~spyre_lab.runtime.launch.correction.WriteBack`),
* returns the outputs as spyre tensors: new tensors of this launch, or views of an input the program returns as
  a view (a constant output is copied: the loaded program keeps its constants, and a caller may write to what it
  gets back).

:func:`load` makes the runtime's form of a Program once (per timing mode): a :class:`LoadedProgram`
whose kernels are :class:`LoadedKernel` s. Each device kernel's numerics are the compiler's own
(``IRNode.compute`` through the reference interpreter's per-kernel routine, so they equal
``compiler.executor.execute``); its modeled time and per-core events come from ``KernelSpec.simulate``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from spyre_lab.compiler.access import Read
from spyre_lab.compiler.executor import per_core_slices, run_kernel, slices_that_matter
from spyre_lab.compiler.ir import NodeGroup
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.program import HostFallback, Launch, Program
from spyre_lab.device.trace import Trace
from spyre_lab.runtime.devices import get_device, spyre_index
from spyre_lab.runtime.intermediates import IntermediatesPool, place_intermediates
from spyre_lab.runtime.launch import CorrectionArea, Operands, RuntimeOptions, correction_area, launch, launch_bound
from spyre_lab.runtime.stream import Stream
from spyre_lab.runtime.tensor import FreshTensors, empty_spyre

EXACT_INTERMEDIATE_DTYPES = (torch.float32,)
"""Intermediate dtypes a compiled program keeps as they are in DRAM: the card's fp32 format (32 values
per 128-byte stick), which the compiler's decompositions use for norms, variances and lerp."""


@dataclass(eq=False)
class LoadedKernel:
    """One launch of a compiler Program as the runtime runs it (a
    :class:`~spyre_lab.runtime.launch.kernels.LaunchKernel`): the compiler's numerics for its fused kernel, its
    modeled time from the simulator."""

    program: Program
    kernel: NodeGroup
    spec: Launch                    # KernelSpec | HostFallback | UnplannedSpec
    mode: str
    host: bool = False
    _timing: tuple[float, str, Trace | None, dict[str, Any]] | None = field(default=None, repr=False)
    _plan: tuple[list[str], list[tuple[str, torch.Tensor]], list[dict[str, tuple[int, int]]] | None] | None = field(
        default=None, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def address_slots(self) -> list[str]:
        return list(self.spec.address_slots)

    @property
    def output_slots(self) -> list[str]:
        return [s for s in self.address_slots if s in set(self.kernel.outputs)]

    def _time(self) -> tuple[float, str, Trace | None, dict[str, Any]]:
        if self._timing is None:
            if self.host:
                cfg = self.program.cfg
                self._timing = (cfg.host_launch_us, "host estimate", None, {"ops": [n.op for n in self.kernel.nodes]})
            elif not isinstance(self.spec, KernelSpec):
                self._timing = (0.0, "unplanned kernel: no tile plan, no time", None, {})
            else:
                sim = self.spec.simulate(self.mode)
                trace = sim.core_trace(self.name)
                args = {"rule": self.kernel.rule, "ops": [n.op for n in self.kernel.nodes],
                        "bottleneck": sim.bottleneck}
                self._timing = (sim.time_us, f"simulated, {self.mode}", trace, args)
        return self._timing

    @property
    def time_us(self) -> float:
        return self._time()[0]

    @property
    def timing(self) -> str:
        return self._time()[1]

    @property
    def sim_trace(self) -> Trace | None:
        return self._time()[2]

    @property
    def args(self) -> dict[str, Any]:
        return self._time()[3]

    def run(self, operands: Operands) -> None:
        if self._plan is None:           # decided once per kernel: which inputs, constants and per-core slices
            read = {b for node in self.kernel.nodes for b in node.inputs}
            self._plan = ([b for b in self.kernel.inputs if b in operands],
                          [(b, t) for b, t in self.program.constants.items() if b in read and b not in operands],
                          per_core_slices(self.kernel, self.program, slices_that_matter(self.spec)))
        inputs, constants, slices = self._plan
        env: dict[str, torch.Tensor] = {}
        operands.read_into(env, inputs)
        env.update(constants)
        if slices is None:                   # computed whole: run_kernel's loop, without the call
            read = env.__getitem__
            for node in self.kernel.nodes:
                env[node.output] = node.compute(*map(read, node.inputs))
        else:
            run_kernel(self.kernel, self.program, env, slices, checked=True, tiles=False)   # numbers only: no views
        for b in self.kernel.outputs:
            operands.write(b, env[b])


@dataclass(eq=False)
class LoadedProgram:
    """A compiler Program as the runtime launches it (a :class:`~spyre_lab.runtime.launch.kernels.LaunchProgram`): its
    kernels timed in one mode, and its constants uploaded once per card."""

    program: Program
    kernels: list[LoadedKernel]
    constants_on: dict[int, tuple[int, dict[str, torch.Tensor]]] = field(default_factory=dict)
    plans: dict[int, tuple[CorrectionArea, BindingPlan]] = field(default_factory=dict)
    fixed_timing: ClassVar[bool] = True      # name and kernel times are the compiler's: launches need not check

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def mutations(self) -> list[tuple[str, Read]]:
        """The program's in-place updates (input <- value): the launch writes them back."""
        return list(self.program.mutations)

    @property
    def num_nodes(self) -> int:
        """Nodes of the execution graph a "rebuild" dispatch reconstructs: the graph's ATen ops."""
        return self.program.aten_ops or sum(len(k.kernel.nodes) for k in self.kernels)

    def binding_plan(self, device_index: int) -> tuple[CorrectionArea, BindingPlan]:
        """The program's correction area on card ``device_index`` and how a launch there binds its slots
        (made again when the card was reset)."""
        cached = self.plans.get(device_index)
        if cached is None or not cached[0].valid():
            area = correction_area(self, get_device(device_index))
            plan = BindingPlan.of(self, device_index)
            area.claims = plan.intermediates.claims
            cached = self.plans[device_index] = (area, plan)
        return cached

    def constants(self, device_index: int) -> dict[str, torch.Tensor]:
        """The program's constants on card ``device_index``, uploaded once (again after a device reset)."""
        generation = get_device(device_index).generation
        cached = self.constants_on.get(device_index)
        if cached is None or cached[0] != generation:
            uploaded = {b: upload_constant(t, device_index) for b, t in self.program.constants.items()}
            self.constants_on[device_index] = cached = (generation, uploaded)
        return cached[1]


def upload_constant(t: torch.Tensor, device_index: int) -> torch.Tensor:
    """A program constant on the card. The compiler's own fp32 constants (SDPA's mask and fill values, a
    decomposition's epsilon) keep the card's fp32 format, as its fp32 intermediates do: nobody outside the
    program sees them, so the fp16 storage policy for user tensors does not apply."""
    if t.dtype not in EXACT_INTERMEDIATE_DTYPES:
        return t.to(torch.device("spyre", device_index))
    on_card = empty_spyre(t.shape, None, t.dtype, device_index, exact=True)
    on_card.copy_(t)
    return on_card


_LOADED: dict[tuple[int, str], LoadedProgram] = {}


def load(program: Program, mode: str | None = None) -> LoadedProgram:
    """The runtime's view of ``program`` timed in ``mode`` (default: the program's own timing mode),
    built once and kept while the program lives."""
    mode = mode or program.options.timing
    key = (id(program), mode)
    loaded = _LOADED.get(key)
    if loaded is None or loaded.program is not program:
        kernels = [LoadedKernel(program, k, spec, mode, host=isinstance(spec, HostFallback))
                   for spec, k in zip(program.launches, program.kernels)]
        loaded = _LOADED[key] = LoadedProgram(program, kernels)
        weakref.finalize(program, _LOADED.pop, key, None)
    return loaded


def run_program(program: Program, inputs: Sequence[torch.Tensor], *, outputs: Sequence[torch.Tensor | None] = (),
                stream: Stream | None = None, options: RuntimeOptions | None = None,
                mode: str | None = None) -> list[torch.Tensor]:
    """Launch a compiled ``Program`` on spyre tensors; returns its outputs as spyre tensors.

    Inputs on the CPU are copied to the card first (a traced H2D). In-place updates of inputs
    (``x.add_(1)`` in the compiled function) land in the caller's tensors, CPU inputs included.
    ``outputs`` may give spyre tensors for the program's outputs to be written in place (an out=
    call); where it gives None, or an output is a view of a buffer, the runtime allocates the
    buffer. The launch's trace is ``spyre_lab.runtime.last_trace()``.
    """
    if len(inputs) != len(program.inputs):
        raise ValueError(f"program {program.name!r} takes {len(program.inputs)} inputs "
                         f"({', '.join(program.inputs)}), got {len(inputs)}")
    cards = [spyre_index(x.device) for x in inputs]
    index = next((c for c in cards if c is not None), None)
    if index is None:
        index = torch.spyre.current_device()
    loaded = load(program, mode)
    area, plan = loaded.binding_plan(index)
    bound: dict[str, torch.Tensor] = {}
    on_host, on_card = False, True
    for (name, shape, dtype), x, card in zip(plan.inputs, inputs, cards):
        if x.shape != shape or x.dtype != dtype:
            raise ValueError(f"input {name} is {tuple(x.shape)} {x.dtype} but the program was compiled for "
                             f"{shape} {dtype}; compile again for the new shape")
        if card is not None:
            bound[name] = x
            on_card = on_card and card == index
        else:
            bound[name], on_host = x.to(torch.device("spyre", index)), True
    bound.update(loaded.constants(index))
    direct = set()
    for (buffer, identity, shape, dtype), target in zip(plan.outputs, outputs):
        if (target is not None and identity and buffer not in bound
                and target.shape == shape and target.dtype == dtype):
            bound[buffer] = target
            direct.add(buffer)
            on_card = on_card and target.device == area.torch_device
    plan.bind_made(bound, index)
    if on_card:                              # every slot bound on the card: nothing for launch() to check
        launch_bound(loaded, area, bound, stream=stream, options=options)
    else:                                    # operands on another card: launch() says which
        launch(loaded, bound, stream=stream, options=options)
    if on_host:
        for name, x in zip(program.inputs, inputs):
            if x.device.type != "spyre" and name in plan.mutated:
                x.copy_(bound[name])             # a CPU input updated in place gets its new values back
    results = []
    for read, target in zip(program.outputs, [*outputs, *[None] * len(program.outputs)]):
        if read.buffer in direct:
            results.append(bound[read.buffer])
            continue
        value = bound[read.buffer] if read.is_identity else read.apply(bound[read.buffer])
        if read.buffer in program.constants and target is None:
            value = value.clone()                # the loaded program keeps its constants: the caller gets a copy
        if target is not None:
            target.copy_(value)
            value = target
        results.append(value)
    return results


@dataclass(frozen=True)
class BindingPlan:
    """How a launch of a loaded program binds its slots on one card, worked out once: the inputs to check,
    the outputs a caller may give, and the buffers each launch allocates (in slot order)."""

    inputs: list[tuple[str, tuple[int, ...], torch.dtype]]
    outputs: list[tuple[str, bool, tuple[int, ...], torch.dtype]]   # buffer, read is the identity, shape, dtype
    fresh: list[tuple[str, tuple[int, ...], torch.dtype]]           # the caller's new tensors: slot, shape, dtype
    intermediates: IntermediatesPool                                # seen by no one else: placed once
    mutated: frozenset[str]
    makers: list[tuple[str, FreshTensors]]                          # per fresh slot, what makes its tensor

    def bind_made(self, bound: dict[str, Any], index: int) -> None:
        """Bind what the program makes and ``bound`` does not give: a new tensor for each output the caller sees
        (the fp16 storage policy; ``empty_spyre`` on the plan's card), and the intermediates, placed once in the
        card's segment 0."""
        for slot, make in self.makers:
            if slot not in bound:
                bound[slot] = make()
        bound.update(self.intermediates.slots)

    @staticmethod
    def of(loaded: LoadedProgram, index: int) -> BindingPlan:
        program = loaded.program
        buffers = program.buffers
        visible = {r.buffer for r in program.outputs} | {value.buffer for _, value in program.mutations}
        given = set(program.inputs) | set(program.constants)
        area = correction_area(loaded, get_device(index))
        made = [s for s in area.all_slots if s not in given]
        # intermediates keep their compiled dtype (a norm's fp32 sum of squares); outputs follow the fp16 policy
        private = [(s, tuple(buffers[s].shape), buffers[s].dtype, buffers[s].dtype in EXACT_INTERMEDIATE_DTYPES)
                   for s in made if s not in visible]
        fresh = [(s, tuple(buffers[s].shape), buffers[s].dtype) for s in made if s in visible]
        return BindingPlan(
            inputs=[(name, tuple(buffers[name].shape), buffers[name].dtype) for name in program.inputs],
            outputs=[(r.buffer, r.is_identity, tuple(buffers[r.buffer].shape), buffers[r.buffer].dtype)
                     for r in program.outputs],
            fresh=fresh,
            intermediates=place_intermediates(private, area.slots, index),
            mutated=frozenset(target for target, _ in program.mutations),
            makers=[(slot, FreshTensors(shape, None, dtype, index)) for slot, shape, dtype in fresh])


@dataclass(eq=False)
class LoadedFamilyKernel:
    """A launch of a compiler kernel family planned per launch shape (paged attention: its work depends on the
    cache blocks each sequence reads), as the runtime runs it. ``spec`` is the compiler's ``KernelSpec`` for the
    coming launch, set by :meth:`LoadedFamilyLaunch.launch`; its time and per-core events are that spec's
    simulation, as a :class:`LoadedKernel`'s are. ``numerics(spec, operands)`` is the family's own routine (it
    walks block tables: there is no node group to interpret)."""

    name: str
    address_slots: tuple[str, ...]
    output_slots: tuple[str, ...]
    numerics: Callable[[KernelSpec, Operands], None]
    mode: str = "analytic"
    spec: KernelSpec | None = None
    host: bool = False
    _timed: tuple[KernelSpec, float, Trace | None, dict[str, Any]] | None = field(default=None, repr=False)

    def _time(self) -> tuple[KernelSpec, float, Trace | None, dict[str, Any]]:
        if self._timed is None or self._timed[0] is not self.spec:
            sim = self.spec.simulate(self.mode)
            args = {"rule": self.spec.rule, "kernel": self.spec.name, **getattr(self.spec, "launch_args", {}),
                    "dram_bytes": int(sim.dram_bytes), "bottleneck": sim.bottleneck, "cores": len(sim.active_cores)}
            self._timed = (self.spec, sim.time_us, sim.core_trace(self.spec.name), args)
        return self._timed

    @property
    def time_us(self) -> float:
        return self._time()[1] if self.spec is not None else 0.0

    @property
    def timing(self) -> str:
        return f"simulated, {self.mode}"

    @property
    def sim_trace(self) -> Trace | None:
        return self._time()[2] if self.spec is not None else None

    @property
    def args(self) -> dict[str, Any]:
        return self._time()[3] if self.spec is not None else {}

    def run(self, operands: Operands) -> None:
        self.numerics(self.spec, operands)


@dataclass(eq=False)
class LoadedFamilyLaunch:
    """One :class:`LoadedFamilyKernel` as a launchable (no write-backs: the kernel writes its in-place operands
    itself). Made once and kept by its caller, so the runtime binds its correction area once; each launch
    only sets the launch shape's spec and patches the addresses."""

    kernel: LoadedFamilyKernel
    num_nodes: int = 1

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def kernels(self) -> list[LoadedFamilyKernel]:
        return self._kernels

    @property
    def mutations(self) -> list[tuple[str, Read]]:
        return []

    def __post_init__(self) -> None:
        self._kernels = [self.kernel]

    def launch(self, spec: KernelSpec, bindings: dict[str, torch.Tensor], stream: Stream | None = None) -> None:
        """Launch the kernel as planned by ``spec`` on ``bindings`` (slot -> spyre tensor)."""
        self.kernel.spec = spec
        launch(self, bindings, stream=stream)
