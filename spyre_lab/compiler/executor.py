"""The reference interpreter: run a Program kernel by kernel on CPU tensors -- real numbers from torch, modeled time.

Numerics: every buffer is held at its graph dtype (fp16 on the device), elementwise ops and
reductions run the ATen op on the CPU (fp32 inside, one rounding), matmuls accumulate in fp32.
A kernel that has a work division is computed the way the cores compute it: each core's slice of
the iteration space separately, K-split partial sums added in K order (the ring reduction). So the
tile-by-tile mode, which keeps every core's slice for the step-through view, gives exactly the same
numbers as the default mode -- it is the same computation with the per-core results kept
(``per_core`` holds that emulation).

Time: device kernels are placed back to back on a Trace, each kernel's per-core events (from
``KernelSpec.simulate(mode)``) shifted to its start; host fallbacks appear as a host event between
two modeled PCIe copies (``cfg.pcie_bandwidth``, ``cfg.pcie_latency_us``). All times are modeled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from spyre_lab.compiler.ir import Fallback, NodeGroup
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.per_core import CoreTile, per_core_slices, run_kernel, run_node
from spyre_lab.compiler.program import HostFallback, Program, UnplannedSpec
from spyre_lab.device.trace import Trace

KERNEL_LANE = "stream0"

__all__ = ["CoreTile", "ExecutionResult", "execute", "per_core_slices", "run_kernel"]


@dataclass
class ExecutionResult:
    outputs: list[torch.Tensor]
    trace: Trace
    kernel_times_us: dict[str, float | None]
    tiles: dict[str, list[CoreTile]] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        """Modeled end-to-end time of the launches (device kernels and host fallbacks)."""
        return self.trace.end_us


def _check_inputs(program: Program, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if len(inputs) != len(program.inputs):
        raise ValueError(f"program {program.name!r} takes {len(program.inputs)} inputs "
                         f"({', '.join(program.inputs)}), got {len(inputs)}")
    out = []
    for name, x in zip(program.inputs, inputs):
        info = program.buffers[name]
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"input {name} must be a tensor, got {type(x).__name__}")
        if tuple(x.shape) != info.shape or x.dtype != info.dtype:
            raise ValueError(f"input {name} is {tuple(x.shape)} {x.dtype} but the program was compiled for "
                             f"{info.shape} {info.dtype}; compile again for the new shape (compile_graph caches "
                             "one program per shape)")
        out.append(x.cpu() if x.device.type != "cpu" else x)
    return out


# --- timing ------------------------------------------------------------------------------------

def _pcie_us(program: Program, nbytes: int) -> float:
    cfg = program.cfg
    return cfg.pcie_latency_us + nbytes / cfg.pcie_bandwidth * 1e6


SMALL_PROGRAM_ELEMENTS = 1 << 20
"""Below this many elements in its largest buffer a program's per-core ops are too small to share between
CPU threads: thread hand-off costs more than the work (measured 6x slower with 2 threads on a small layer)."""


@contextmanager
def _cpu_threads(program: Program):
    small = max((b.numel for b in program.buffers.values()), default=0) < SMALL_PROGRAM_ELEMENTS
    before = torch.get_num_threads()
    if small and before > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small and before > 1:
            torch.set_num_threads(before)


def execute(program: Program, inputs: Sequence[torch.Tensor], mode: str = "analytic",
            tile_by_tile: bool = False) -> ExecutionResult:
    """Run ``program`` on real CPU tensors. Returns outputs, the modeled Trace and per-kernel modeled times."""
    if mode not in ("analytic", "event"):
        raise ValueError(f"mode must be 'analytic' or 'event', got {mode!r}")
    with _cpu_threads(program), torch.no_grad():          # programs are inference-only
        return _execute(program, inputs, mode, tile_by_tile)


def slices_that_matter(spec: object) -> list[dict[str, tuple[int, int]]] | None:
    """A launch's per-core slices when they change its numbers, else None (computed whole, as the runtime does).

    They matter only when a reduction is split across cores: then the partial sums are added in core order,
    which changes the rounding. Without such a split each core computes exactly its part of the whole-tensor
    result, so the whole tensor is computed at once."""
    if not isinstance(spec, KernelSpec) or not spec.slices:
        return None
    division = spec.division
    reduced = set(division.reduction_dims) | {"K"}
    return spec.slices if any(division.splits.get(d, 1) > 1 for d in reduced) else None


def execute_values(program: Program, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs of ``program`` on ``inputs`` as a launch on the card computes them: the same kernels, on per-core
    slices where those change the numbers (:func:`slices_that_matter`), without timing the program or building
    its trace; for a caller that checks the numbers only (an eager op's one-op program against the CPU op)."""
    with _cpu_threads(program), torch.no_grad():
        return _execute(program, inputs, "analytic", False, timed=False).outputs


def _execute(program: Program, inputs: Sequence[torch.Tensor], mode: str, tile_by_tile: bool,
             timed: bool = True) -> ExecutionResult:
    env: dict[str, torch.Tensor] = dict(zip(program.inputs, _check_inputs(program, inputs)))
    env.update(program.constants)
    trace = Trace(meta={"program": program.name, "mode": mode})
    times: dict[str, float | None] = {}
    tiles: dict[str, list[CoreTile]] = {}
    clock = 0.0
    for launch, kernel in zip(program.launches, program.kernels):
        if isinstance(launch, HostFallback):
            if not timed:
                for node in kernel.nodes:
                    env[node.output] = run_node(node, env)
                continue
            clock = _host_fallback(program, kernel, env, trace, clock)
            times[launch.name] = None
            continue
        if timed:
            slices = launch.slices if isinstance(launch, KernelSpec) else None
        else:
            slices = slices_that_matter(launch)
        core_tiles = run_kernel(kernel, program, env, slices, tiles=tile_by_tile)
        if tile_by_tile:
            tiles[launch.name] = core_tiles
        if isinstance(launch, UnplannedSpec) or not timed:
            times[launch.name] = None
            continue
        sim = launch.simulate(mode)
        trace.extend(sim.core_trace(launch.name), offset_us=clock)
        trace.add(KERNEL_LANE, launch.name, clock, sim.time_us, rule=kernel.rule,
                  ops=[n.op for n in kernel.nodes], bottleneck=sim.bottleneck)
        times[launch.name] = sim.time_us
        clock += sim.time_us
    outputs = [r.apply(env[r.buffer]).clone() for r in program.outputs]
    for name, value in program.mutations:            # in-place updates of graph inputs land in the caller's tensor
        inputs[program.inputs.index(name)].copy_(value.apply(env[value.buffer]))
    return ExecutionResult(outputs, trace, times, tiles)


def _host_fallback(program: Program, kernel: NodeGroup, env: dict[str, torch.Tensor], trace: Trace,
                   clock: float) -> float:
    bytes_in = sum(program.buffers[b].nbytes for b in kernel.inputs if program.buffers[b].role != "constant")
    bytes_out = sum(program.buffers[b].nbytes for b in kernel.outputs)
    d2h = _pcie_us(program, bytes_in)
    trace.add("pcie", f"D2H {kernel.name}", clock, d2h, bytes=bytes_in, modeled=True)
    clock += d2h
    start = time.perf_counter()
    for node in kernel.nodes:
        env[node.output] = run_node(node, env)
    measured_us = (time.perf_counter() - start) * 1e6
    host_us = program.cfg.host_launch_us
    trace.add("host", f"fallback {', '.join(n.op for n in kernel.nodes)}", clock, host_us,
              modeled=True, measured_cpu_us=round(measured_us, 1), reason=_fallback_reason(kernel))
    clock += host_us
    h2d = _pcie_us(program, bytes_out)
    trace.add("pcie", f"H2D {kernel.name}", clock, h2d, bytes=bytes_out, modeled=True)
    return clock + h2d


def _fallback_reason(kernel: NodeGroup) -> str:
    node = kernel.nodes[0]
    return node.reason if isinstance(node, Fallback) else ""
