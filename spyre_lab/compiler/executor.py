"""The reference interpreter: run a Program kernel by kernel on CPU tensors -- real numbers from torch, modeled time.

Numerics: every buffer is held at its graph dtype (fp16 on the device), elementwise ops and
reductions run the ATen op on the CPU (fp32 inside, one rounding), matmuls accumulate in fp32.
A kernel that has a work division is computed the way the cores compute it: each core's slice of
the iteration space separately, K-split partial sums added in K order (the ring reduction). So the
tile-by-tile mode, which keeps every core's slice for the step-through view, gives exactly the same
numbers as the default mode -- it is the same computation with the per-core results kept. Cores share
their fp32 input conversions where that provably leaves each core's matmul unchanged (``core_operands``).

Time: device kernels are placed back to back on a Trace, each kernel's per-core events (from
``KernelSpec.simulate(mode)``) shifted to its start; host fallbacks appear as a host event between
two modeled PCIe copies (``cfg.pcie_bandwidth``, ``cfg.pcie_latency_us``). All times are modeled.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from spyre_lab.compiler.access import Access
from spyre_lab.compiler.core_operands import Ranges, SharedOperands, core_ranges, narrowed, plan_operands
from spyre_lab.compiler.ir import Fallback, FusedKernel, IRNode, MatMul, Reduction
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.program import HostFallback, Program, UnplannedKernel
from spyre_lab.device.trace import Trace

KERNEL_LANE = "stream0"


@dataclass
class CoreTile:
    """What one core computed in one kernel: its slice and the values it produced (LX and DRAM)."""

    core: int
    slice: dict[str, tuple[int, int]]
    values: dict[str, torch.Tensor]


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


def _run_node(node: IRNode, env: dict[str, torch.Tensor]) -> torch.Tensor:
    return node.compute(*(env[b] for b in node.inputs))


# --- per-core slicing --------------------------------------------------------------------------

def _split_dims(kernel: FusedKernel, slices: list[dict[str, tuple[int, int]]]) -> set[str]:
    """The anchor dims some core does not cover whole."""
    anchor = kernel.anchor
    return {d for s in slices for d, (a, b) in s.items() if (a, b) != (0, anchor.dims.get(d, -1))}


def _sliceable(kernel: FusedKernel, access: dict[str, Access], slices: list[dict[str, tuple[int, int]]]) -> bool:
    """Can every node of the kernel be computed per core from the anchor's slices?"""
    anchor = kernel.anchor
    split = _split_dims(kernel, slices)
    if not split:
        return False
    produced = {n.output for n in kernel.nodes}
    for _i, node in enumerate(kernel.nodes):
        for d in split:
            if node.dims.get(d) != anchor.dims.get(d) and not (d == "K" and node is not anchor and d not in node.dims):
                return False
            if d in node.reduction_dims and not (node is anchor and ((isinstance(node, MatMul) and d == "K")
                                                                     or _lone_split_reduction(kernel))):
                return False
        if isinstance(node, MatMul) and node is not anchor:
            return False
        if any(r.buffer in produced and not r.is_identity for r in access[node.name].reads):
            return False
    return not ("K" in split and kernel.nodes[0] is not anchor)


PARTIAL_COMBINE = {"matmul": torch.add, "sum": torch.add, "mean": torch.add, "amax": torch.maximum,
                   "amin": torch.minimum}
"""How partners' partial results meet when a reduced dim is split across cores (the ring reduction)."""


def _lone_split_reduction(kernel: FusedKernel) -> bool:
    node = kernel.nodes[0]
    return len(kernel.nodes) == 1 and isinstance(node, Reduction) and node.op in PARTIAL_COMBINE


def _partial(node: IRNode, ins: list[torch.Tensor], access: Access) -> torch.Tensor:
    """A core's fp32 partial result over its share of the reduced dims (kept as size-1 dims)."""
    if isinstance(node, MatMul):
        return torch.matmul(ins[0].float(), ins[1].float())
    axes = [i for i, a in enumerate(access.reads[0].axes) if a in node.reduction_dims]
    x = ins[0]
    if node.op in ("amax", "amin"):
        return getattr(x, node.op)(dim=axes, keepdim=True)
    return x.float().sum(dim=axes, keepdim=True)


def _finish(node: IRNode, total: torch.Tensor, access: Access, dtype: torch.dtype) -> torch.Tensor:
    """Partial sums combined: scale a mean, round once to the buffer dtype, drop reduced dims if not kept."""
    if node.op == "mean":
        total = total / math.prod(node.dims[d] for d in node.reduction_dims)
    total = total.to(dtype)
    if isinstance(node, Reduction) and len(access.out_axes) < total.dim():
        total = total.squeeze([i for i, a in enumerate(access.reads[0].axes) if a in node.reduction_dims])
    return total


def _narrow(t: torch.Tensor, axes: Sequence[str | None], s: dict[str, tuple[int, int]],
            full: dict[str, int]) -> torch.Tensor:
    for i, name in enumerate(axes):
        if name in s and t.shape[i] == full[name] and s[name] != (0, full[name]):
            a, b = s[name]
            t = t.narrow(i, a, b - a)
    return t


def _core_values(nodes: Sequence[IRNode], anchor: IRNode, access: dict[str, Access], env: dict[str, torch.Tensor],
                 s: dict[str, tuple[int, int]], local: dict[str, torch.Tensor] | None = None,
                 ) -> dict[str, torch.Tensor]:
    """One core's computation of its slice; a K-split matmul leaves its fp32 partial sum."""
    local = {} if local is None else local
    for node in nodes:
        acc = access[node.name]
        ins = []
        for r in acc.reads:
            if r.buffer in local:
                ins.append(local[r.buffer])
            else:
                ins.append(_narrow(r.apply(env[r.buffer]), r.axes, s, node.dims))
        if node is anchor and any(d in node.reduction_dims for d in s):
            local[node.output] = _partial(node, ins, acc)
        else:
            local[node.output] = _narrow(acc.op_fn(*ins), acc.out_axes, s, node.dims)
    return local


@dataclass
class _SlicedPlan:
    """What :func:`_run_sliced` derives from a kernel and its slices alone, kept while both are the same objects
    (a runtime launches the kernel again and again)."""

    split: set[str]
    cores: list[tuple[int, dict, dict]]          # per busy core: index, its slice, its slice of the split dims
    blocks: list[list[int]] | None               # split reduction: positions in ``cores`` of each output block's
    #                                              partners in reduction order (the leader first); else None
    out_ranges: dict[str, list[Ranges]]          # per kernel output: each core's part of it
    operands: list[dict[tuple, SharedOperands]] = field(default_factory=list)   # per anchor read, by layout

    def anchor_operands(self, kernel: FusedKernel, access: Access, env: dict[str, torch.Tensor]
                        ) -> list[list[torch.Tensor]]:
        """Per anchor read, every core's operand: what ``_core_values`` would narrow (and ``_partial`` convert),
        made with one fp32 conversion per group of cores that can share it (see ``core_operands``)."""
        convert = isinstance(kernel.anchor, MatMul) or kernel.anchor.op in ("sum", "mean")
        if not self.operands:
            self.operands = [{} for _ in access.reads]
        out = []
        for r, plans in zip(access.reads, self.operands):
            x = r.apply(env[r.buffer])
            key = (x.shape, x.stride(), x.dtype)
            plan = plans.get(key)
            if plan is None:
                ranges = [core_ranges(r.axes, x.shape, kernel.anchor.dims, own) for _, _, own in self.cores]
                plan = plans[key] = plan_operands(x, ranges, convert)
            out.append(plan(x))
        return out


_SLICED: dict[int, tuple[weakref.ref, list, _SlicedPlan]] = {}


def _sliced_plan(kernel: FusedKernel, program: Program, slices: list[dict[str, tuple[int, int]]]) -> _SlicedPlan:
    cached = _SLICED.get(id(kernel))
    if cached is None or cached[0]() is not kernel or cached[1] is not slices:
        if cached is None:
            weakref.finalize(kernel, _SLICED.pop, id(kernel), None)   # dropped with the kernel
        cached = _SLICED[id(kernel)] = (weakref.ref(kernel), slices, _make_plan(kernel, program, slices))
    return cached[2]


def _make_plan(kernel: FusedKernel, program: Program, slices: list[dict[str, tuple[int, int]]]) -> _SlicedPlan:
    anchor = kernel.anchor
    split = _split_dims(kernel, slices)
    partial_dims = [d for d in anchor.dims if d in split and d in anchor.reduction_dims]
    cores = [(c, s, {d: r for d, r in s.items() if d in split}) for c, s in enumerate(slices) if s]
    blocks = None
    if partial_dims:                             # partners: the cores that share a block of the kept dims
        kept = [d for d in anchor.dims if d not in partial_dims]
        by_block: dict[tuple, list[int]] = {}
        for j, (_, s, _) in enumerate(cores):
            by_block.setdefault(tuple(s.get(d, (0, anchor.dims[d])) for d in kept), []).append(j)
        blocks = [sorted(js, key=lambda j: tuple(cores[j][1][d][0] for d in partial_dims))
                  for js in by_block.values()]
    out_ranges = {}
    for name in kernel.outputs:
        shape = program.buffers[name].shape
        node = next(n for n in kernel.nodes if n.output == name)
        axes = program.access[node.name].out_axes
        out_ranges[name] = [tuple(s[a] if a in split and shape[i] == node.dims[a] and s[a] != (0, shape[i]) else None
                                  for i, a in enumerate(axes)) for _, s, _ in cores]
    return _SlicedPlan(split, cores, blocks, out_ranges)


def _run_sliced(kernel: FusedKernel, program: Program, env: dict[str, torch.Tensor],
                slices: list[dict[str, tuple[int, int]]]) -> list[CoreTile]:
    access = program.access
    anchor = kernel.anchor
    plan = _sliced_plan(kernel, program, slices)
    if plan.blocks is None:
        tiles = [CoreTile(c, dict(s), _core_values(kernel.nodes, anchor, access, env, own)) for c, s, own in plan.cores]
    else:
        tiles = _reduce_across_cores(kernel, program, env, plan)
    for name, ranges in plan.out_ranges.items():
        info = program.buffers[name]
        env[name] = _gather(info.shape, info.dtype, [(r, t.values[name]) for t, r in zip(tiles, ranges)
                                                     if name in t.values])
    return tiles


def _reduce_across_cores(kernel: FusedKernel, program: Program, env: dict[str, torch.Tensor],
                         plan: _SlicedPlan) -> list[CoreTile]:
    """Every core's fp32 partial, then the ring reduction: partners' partials combined in slice order, rounded
    once by the block's leader, which runs the epilogue on its block."""
    access, anchor = program.access, kernel.anchor
    acc = access[anchor.name]
    operands = plan.anchor_operands(kernel, acc, env)
    out, partial = anchor.output, anchor.output + ".partial"
    if isinstance(anchor, MatMul):             # its operands are fp32 already: _partial's .float() would be a no-op
        tiles = [CoreTile(c, dict(s), {out: torch.matmul(a, b)})
                 for (c, s, _), a, b in zip(plan.cores, operands[0], operands[1])]
    else:
        tiles = [CoreTile(c, dict(s), {out: _partial(anchor, [ins[j] for ins in operands], acc)})
                 for j, (c, s, _) in enumerate(plan.cores)]
    combine = PARTIAL_COMBINE[anchor.op]
    dtype = program.buffers[out].dtype
    for block in plan.blocks or ():
        group = [tiles[j] for j in block]
        total = group[0].values[out]
        for t in group[1:]:
            total = combine(total, t.values[out])
        for t in group[1:]:
            t.values[partial] = t.values.pop(out)
        leader = group[0]                      # the partner that stores finishes the block and runs the epilogue
        leader.values[partial] = leader.values[out]
        leader.values[out] = _finish(anchor, total, acc, dtype)
        if len(kernel.nodes) > 1:
            s = {d: r for d, r in plan.cores[block[0]][2].items() if d not in anchor.reduction_dims}
            _core_values(kernel.nodes[1:], anchor, access, env, s, local=leader.values)
    return tiles


def _gather(shape: tuple[int, ...], dtype: torch.dtype, parts: list[tuple[Ranges, torch.Tensor]]) -> torch.Tensor:
    """A whole buffer from the cores' parts of it (written in core order). Parts that tile one axis exactly,
    in the buffer's dtype, are concatenated in one call; anything else is copied part by part."""
    axes = {i for r, _ in parts for i, x in enumerate(r) if x is not None}
    if len(axes) == 1 and all(v.dtype == dtype for _, v in parts):
        i = axes.pop()
        ordered = sorted(parts, key=lambda p: p[0][i][0] if p[0][i] else -1)
        end = 0
        for r, v in ordered:
            if r[i] is None or r[i][0] != end or v.shape != (*shape[:i], r[i][1] - end, *shape[i + 1:]):
                break
            end = r[i][1]
        else:
            if end == shape[i]:
                return torch.cat([v for _, v in ordered], dim=i)
    full = torch.empty(shape, dtype=dtype)
    for r, v in parts:
        narrowed(full, r).copy_(v)
    return full


def per_core_slices(kernel: FusedKernel, program: Program,
                    slices: Sequence[dict[str, tuple[int, int]]] | None) -> list[dict[str, tuple[int, int]]] | None:
    """The slices :func:`run_kernel` computes core by core (None: the kernel is computed whole). A runtime that
    launches the kernel many times decides once and passes ``checked=True``."""
    if slices and _sliceable(kernel, program.access, list(slices)):
        return list(slices)
    return None


def run_kernel(kernel: FusedKernel, program: Program, env: dict[str, torch.Tensor],
               slices: Sequence[dict[str, tuple[int, int]]] | None = None, *, checked: bool = False) -> list[CoreTile]:
    """Compute one kernel's outputs into ``env`` (buffer name -> tensor). With the kernel's per-core
    ``slices`` (``KernelSpec.slices``) it computes core by core and returns what each core produced.
    ``checked``: ``slices`` came from :func:`per_core_slices` (no need to ask again whether they apply)."""
    if slices and checked:
        return _run_sliced(kernel, program, env, slices if isinstance(slices, list) else list(slices))
    if slices and _sliceable(kernel, program.access, list(slices)):
        return _run_sliced(kernel, program, env, list(slices))
    for node in kernel.nodes:
        env[node.output] = _run_node(node, env)
    return []



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


def _execute(program: Program, inputs: Sequence[torch.Tensor], mode: str, tile_by_tile: bool) -> ExecutionResult:
    env: dict[str, torch.Tensor] = dict(zip(program.inputs, _check_inputs(program, inputs)))
    env.update(program.constants)
    trace = Trace(meta={"program": program.name, "mode": mode})
    times: dict[str, float | None] = {}
    tiles: dict[str, list[CoreTile]] = {}
    clock = 0.0
    for launch, kernel in zip(program.launches, program.kernels):
        if isinstance(launch, HostFallback):
            clock = _host_fallback(program, kernel, env, trace, clock)
            times[launch.name] = None
            continue
        slices = launch.slices if isinstance(launch, KernelSpec) else None
        core_tiles = run_kernel(kernel, program, env, slices)
        if tile_by_tile:
            tiles[launch.name] = core_tiles
        if isinstance(launch, UnplannedKernel):
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


def _host_fallback(program: Program, kernel: FusedKernel, env: dict[str, torch.Tensor], trace: Trace,
                   clock: float) -> float:
    bytes_in = sum(program.buffers[b].nbytes for b in kernel.inputs if program.buffers[b].role != "constant")
    bytes_out = sum(program.buffers[b].nbytes for b in kernel.outputs)
    d2h = _pcie_us(program, bytes_in)
    trace.add("pcie", f"D2H {kernel.name}", clock, d2h, bytes=bytes_in, modeled=True)
    clock += d2h
    start = time.perf_counter()
    for node in kernel.nodes:
        env[node.output] = _run_node(node, env)
    measured_us = (time.perf_counter() - start) * 1e6
    host_us = program.cfg.host_launch_us
    trace.add("host", f"fallback {', '.join(n.op for n in kernel.nodes)}", clock, host_us,
              modeled=True, measured_cpu_us=round(measured_us, 1), reason=_fallback_reason(kernel))
    clock += host_us
    h2d = _pcie_us(program, bytes_out)
    trace.add("pcie", f"H2D {kernel.name}", clock, h2d, bytes=bytes_out, modeled=True)
    return clock + h2d


def _fallback_reason(kernel: FusedKernel) -> str:
    node = kernel.nodes[0]
    return node.reason if isinstance(node, Fallback) else ""
