"""Codegen: one fused kernel -> a :class:`KernelSpec` (division, LX plan, per-core tile programs, SuperDSC).

``generate_kernel`` is where kernel planning comes together, in the order torch-spyre runs it:
work division picks each core's slice (:mod:`~spyre_lab.compiler.work_division`); tile sizes shrink
until a steady-state tile's buffers fit LX, placed by the scratchpad planner
(:mod:`~spyre_lab.compiler.scratchpad`); and every core gets its tile program
(:mod:`~spyre_lab.compiler.tiling`), the list of loads, PT/SFU ops, ring transfers and stores the
simulator runs. ``KernelSpec.to_json()`` writes it all down in the shape of a SuperDSC document,
with symbolic DRAM addresses the runtime patches at launch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from spyre_lab.compiler.ir import BufferInfo, FusedKernel, IRNode, MatMul, Pointwise, Reduction
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.scratchpad import LXBuffer, LXPlan, plan_scratchpad
from spyre_lab.compiler.tiling import (
    MatmulKernel,
    MlpKernel,
    Operand,
    RowKernel,
    align_axes,
    choose_matmul_tiles,
    choose_mlp_tiles,
    emit_matmul,
    emit_mlp,
    emit_rows,
    matmul_lx_buffers,
    mlp_lx_buffers,
    node_axes,
    renamed,
    row_lx_buffers,
    row_tile_shape,
    tile_grid,
)
from spyre_lab.compiler.work_division import (
    WorkDivision,
    divide_iteration_space,
    divide_matmul,
    placement,
    slice_ranges,
)
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreProgram, Kernel, LXOverflowError, OpKind
from spyre_lab.device.layout import StickLayout

if TYPE_CHECKING:
    from spyre_lab.device.sim import SimResult

KNOWN_RULES = ("single", "pointwise_chain", "reduction_fusion", "matmul_epilogue", "softmax", "mlp", "restickify")


@dataclass
class KernelSpec:
    """One scheduled kernel (a SuperDSC bundle): what every core does and where every buffer lives."""

    name: str
    rule: str
    ops: list[str]
    division: WorkDivision
    lx_plan: LXPlan
    tile_kernel: Kernel
    address_slots: list[str]
    slices: list[dict[str, tuple[int, int]]]
    cfg: SpyreConfig = field(repr=False)
    dims: dict[str, int] = field(default_factory=dict)
    tiles: dict[str, int] = field(default_factory=dict)
    operands: dict[str, Operand] = field(default_factory=dict, repr=False)
    buffers: dict[str, BufferInfo] = field(default_factory=dict, repr=False)
    units: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    _sims: dict[str, SimResult] = field(default_factory=dict, init=False, repr=False)

    # --- totals read off the tile programs -----------------------------------------------------
    @property
    def flops(self) -> int:
        return self.tile_kernel.total("flops")

    @property
    def bytes_in(self) -> int:
        return self.tile_kernel.total("nbytes", OpKind.LOAD)

    @property
    def bytes_out(self) -> int:
        return self.tile_kernel.total("nbytes", OpKind.STORE)

    @property
    def ring_bytes(self) -> int:
        return self.tile_kernel.total("nbytes", OpKind.RING_SEND)

    def simulate(self, mode: str = "analytic") -> SimResult:
        """Modeled timing of this kernel on ``cfg`` (cached per mode)."""
        if mode not in self._sims:
            from spyre_lab.device.sim import simulate

            self._sims[mode] = simulate(self.tile_kernel, self.cfg, mode=mode, trace=mode == "event")
        return self._sims[mode]

    def explain(self) -> str:
        d = self.division
        busy = len(self.tile_kernel.active_cores)
        lines = [
            f"kernel {self.name} ({self.rule}): {' -> '.join(self.ops)}",
            f"  work division {d.strategy}: {dict(d.splits)} on {busy} of {self.cfg.cores} cores - {d.reason}",
            f"  tiles per core: {self.tiles}; LX {self.lx_plan.peak:,} of {self.lx_plan.budget:,} B "
            f"({self.lx_plan.strategy})",
            f"  DRAM {self.bytes_in:,} B in, {self.bytes_out:,} B out; ring {self.ring_bytes:,} B; "
            f"{self.flops:,} FLOP; {self.tile_kernel.num_ops} tile ops",
            f"  address slots patched at launch: {', '.join(self.address_slots)}",
        ]
        kept = sorted({n.split("[")[0] for n in self.lx_plan.offsets} - set(self.address_slots) - {"acc", "psum_in",
                                                                                                "out_acc"})
        if kept:
            lines.append(f"  stays in LX (never touches DRAM): {', '.join(kept)}")
        hops = sorted({op.hops for p in self.tile_kernel.programs for op in p if op.kind is OpKind.RING_SEND})
        if hops:
            lines.append(f"  partial results of split {d.split_reduction_dim} meet over the ring, {hops} hop(s) apart")
        return "\n".join(lines)

    # --- SuperDSC-like document ----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """A SuperDSC-shaped description: core folding, work slices, data stages, buffers, addresses, ops."""
        d = self.division
        busy = [c for c, s in enumerate(self.slices) if s]
        slice_of = d.slice_of_core()
        last_tile = {}
        for core in busy[:1]:
            extent = {k: hi - lo for k, (lo, hi) in self.slices[core].items()}
            grid = tile_grid(extent, {k: self.tiles.get(k, v) for k, v in extent.items()})
            last_tile = grid[-1] if grid else {}
        stage = {
            "ss_": dict(self.tiles),
            "el_": last_tile,
            "perCore_": {str(c): {k: hi - lo for k, (lo, hi) in self.slices[c].items()} for c in busy},
        }
        labeled, schedule, info = [], [], {}
        for i, name in enumerate(self.address_slots):
            role = self.roles.get(name, "INPUT")
            buf = self.buffers.get(name)
            fmt = str(buf.dtype).replace("torch.", "") if buf else "float16"
            labeled.append({"ldsIdx_": i, "dsName_": name, "dsType_": role, "format_": fmt,
                            "memOrg_": {"hbm": {"isPresent": 1, "slot": name}}})
            schedule.append(self._hbm_allocate(name, busy))
            op = self.operands.get(name)
            if op is not None and role not in info:
                eps = self.cfg.stick_bytes // op.itemsize
                info[role] = {"name_": name, "layoutDimOrder_": [a or "_" for a in op.axes],
                              "stickDimOrder_": [op.axes[-1] or "_"] if op.axes else [], "stickSize_": [eps]}
        for name, offset in self.lx_plan.offsets.items():
            labeled.append({"ldsIdx_": len(labeled), "dsName_": name, "dsType_": "INTERMEDIATE",
                            "memOrg_": {"lx": {"isPresent": 1, "offset": offset, "size": self.lx_plan.sizes[name]}}})
            schedule.append({"nodeType_": "allocate", "name_": name, "component_": "lx",
                             "startAddressCoreCorelet_": {"dim_prop_func": [],
                                                          "data_": {str(c): offset for c in busy}}})
        compute = [{"exUnit": self.units.get(op, "sfp"), "opFuncName": op, "fidelity": "regular"} for op in self.ops]
        return {
            "kernel": self.name,
            "rule": self.rule,
            "coreFoldProp_": {"factor_": d.cores_used, "label_": "core"},
            "coreletFoldProp_": {"factor_": 1, "label_": "corelet"},
            "numWkSlicesPerDim_": dict(d.splits),
            "coreIdToWkSlice_": {str(c): d.slice_coords(slice_of[c]) for c in busy},
            "dscs_": [{self.name: {
                "N_": dict(self.dims),
                "dataStageParam_": {"0": stage},
                "primaryDsInfo_": info,
                "labeledDs_": labeled,
                "scheduleTree_": schedule,
                "computeOp_": compute,
            }}],
        }

    def _hbm_allocate(self, name: str, busy: Sequence[int]) -> dict[str, Any]:
        """Per-core start address of the core's slice: symbolic slot + byte offset, and the affine fold."""
        data = {str(c): {"slot": name, "offset": self.slice_offset(name, self.slices[c])} for c in busy}
        folds = []
        base = self.slice_offset(name, {k: (0, 0) for k in self.dims})
        for dim, count in self.division.splits.items():
            if count > 1 and busy:
                step = {k: (0, 0) for k in self.dims}
                lo, hi = self.slices[busy[0]].get(dim, (0, 0))
                span = hi - lo
                if dim in self.slices[busy[0]]:
                    step[dim] = (span, span)
                folds.append({"dim": dim, "affine": {"alpha": self.slice_offset(name, step) - base, "beta": base}})
        return {"nodeType_": "allocate", "name_": name, "component_": "hbm",
                "startAddressCoreCorelet_": {"dim_prop_func": folds, "data_": data}}

    def slice_offset(self, name: str, ranges: Mapping[str, tuple[int, int]]) -> int:
        """Byte offset in ``name``'s device copy of the first element of a core's slice."""
        op, buf = self.operands.get(name), self.buffers.get(name)
        if op is None or buf is None or not buf.shape:
            return 0
        layout = buf.layout if buf.layout is not None else StickLayout.default(buf.shape, buf.dtype)
        index = [min(ranges[a][0], n - 1) if a is not None and a in ranges else 0 for a, n in zip(op.axes, buf.shape)]
        return layout.device_offset(layout.device_coords(index)) * op.itemsize


# --- generate_kernel ----------------------------------------------------------------------------------

def generate_kernel(kernel: FusedKernel, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
                    options: CompileOptions) -> KernelSpec:
    """Plan and emit one fused kernel: division, tile sizes that fit LX, LX plan, per-core programs."""
    if kernel.is_fallback:
        raise ValueError(f"kernel {kernel.name!r} holds a Fallback node; fallbacks run on the host and never "
                         "reach codegen - split them out before generate_kernel")
    if kernel.rule not in KNOWN_RULES:
        raise ValueError(f"kernel {kernel.name!r} has unknown fusion rule {kernel.rule!r}; rules are {KNOWN_RULES}")
    if not kernel.nodes:
        raise ValueError(f"kernel {kernel.name!r} has no nodes")
    missing = sorted({b for n in kernel.nodes for b in (*n.inputs, n.output)} - set(buffers))
    if missing:
        raise ValueError(f"kernel {kernel.name!r} uses buffer(s) {missing} missing from the buffers mapping")
    matmuls = [n for n in kernel.nodes if isinstance(n, MatMul)]
    if kernel.rule == "mlp" or len(matmuls) >= 2:
        return _mlp_spec(kernel, buffers, cfg, options)
    if matmuls:
        return _matmul_spec(kernel, buffers, cfg, options)
    return _row_spec(kernel, buffers, cfg, options)


def _fits(cfg: SpyreConfig, options: CompileOptions, name: str) -> Callable[[list[LXBuffer]], bool]:
    """Does a tile's buffer list fit LX under the chosen allocator?"""

    def fits(bufs: list[LXBuffer]) -> bool:
        try:
            plan_scratchpad(bufs, cfg.lx_budget_bytes, options.lx_allocator, name)
        except LXOverflowError:
            return False
        return True
    return fits


def _partners(division: WorkDivision, core: int) -> tuple[int, list[int], int] | None:
    red = division.split_reduction_dim
    if red is None:
        return None
    s = division.slice_of_core()[core]
    return division.slice_coords(s)[red], [division.core_of_slice[q] for q in division.partners(s)], core


def _per_core(slices: Sequence[Mapping[str, tuple[int, int]]], division: WorkDivision | None, cfg: SpyreConfig,
              emit: Callable[[dict[str, int], tuple[int, list[int], int] | None], CoreProgram]) -> list[CoreProgram]:
    """Every core's program. Cores with the same slice extents and no partners run the very same ops
    (one shared program), which keeps codegen and the analytic simulator linear in distinct work."""
    programs = [CoreProgram() for _ in range(cfg.cores)]
    shared: dict[tuple, CoreProgram] = {}
    for c, ranges in enumerate(slices):
        if not ranges:
            continue
        extent = {d: hi - lo for d, (lo, hi) in ranges.items()}
        partners = _partners(division, c) if division is not None else None
        if partners is not None:
            programs[c] = emit(extent, partners)
            continue
        key = tuple(sorted(extent.items()))
        if key not in shared:
            shared[key] = emit(extent, None)
        programs[c] = shared[key]
    return programs


def _slots(kernel: FusedKernel) -> list[str]:
    seen: list[str] = []
    for b in [*kernel.inputs, *kernel.outputs]:
        if b not in seen:
            seen.append(b)
    return seen


def _spec(kernel: FusedKernel, division: WorkDivision, bufs: list[LXBuffer], programs: list[CoreProgram],
          slices: list[dict[str, tuple[int, int]]], cfg: SpyreConfig, options: CompileOptions,
          buffers: Mapping[str, BufferInfo], dims: Mapping[str, int], tiles: Mapping[str, int],
          operands: dict[str, Operand], weights: Sequence[str] = ()) -> KernelSpec:
    """Place the steady-state buffers in LX and bundle everything into a KernelSpec."""
    plan = plan_scratchpad(bufs, cfg.lx_budget_bytes, options.lx_allocator, kernel.name)
    slots = _slots(kernel)
    return KernelSpec(
        name=kernel.name, rule=kernel.rule, ops=[n.op for n in kernel.nodes], division=division, lx_plan=plan,
        tile_kernel=Kernel.from_programs(kernel.name, programs, cfg.cores), address_slots=slots, slices=slices,
        cfg=cfg, dims=dict(dims), tiles=dict(tiles), operands=operands,
        buffers={b: buffers[b] for b in slots}, units={n.op: "pt" if isinstance(n, MatMul) else "sfp"
                                                       for n in kernel.nodes},
        roles=_roles(kernel, buffers, weights))


def _roles(kernel: FusedKernel, buffers: Mapping[str, BufferInfo], weights: Sequence[str]) -> dict[str, str]:
    """SuperDSC role of every address slot: OUTPUT, KERNEL (weights and constants) or INPUT."""
    roles = {}
    for b in _slots(kernel):
        if b in kernel.outputs:
            roles[b] = "OUTPUT"
        elif b in weights or buffers[b].role == "constant":
            roles[b] = "KERNEL"
        else:
            roles[b] = "INPUT"
    return roles


def _itemsize(buf: BufferInfo) -> int:
    return torch.empty((), dtype=buf.dtype).element_size() if buf.dtype != torch.bool else 2


# --- non-matmul kernels -----------------------------------------------------------------------------

def _reduced_dims(node: IRNode, buffers: Mapping[str, BufferInfo]) -> tuple[str, ...]:
    """The dims a reduction folds: its ``reduction_dims``, or, when those are missing, the dims its output
    shape no longer has (all of them for a scalar result, the size-1 ones of a keepdim result)."""
    if not isinstance(node, Reduction) or node.reduction_dims:
        return tuple(node.reduction_dims)
    out = buffers[node.output].shape
    if math.prod(out) == 1:
        return tuple(node.dims)
    if len(out) == len(node.dims):
        return tuple(d for d, n in zip(node.dims, out) if n == 1 and node.dims[d] > 1)
    return ()


def _row_spec(kernel: FusedKernel, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
              options: CompileOptions) -> KernelSpec:
    anchor = kernel.anchor
    dims = dict(anchor.dims)
    names = list(dims)
    reds = []
    for n in kernel.nodes:
        rn = renamed(n, names)
        reds += [rn[d] for d in _reduced_dims(n, buffers) if rn[d] not in reds]
    inner = names[-1] if names else ""
    col = tuple(d for d in names if d in reds or d == inner)
    operands: dict[str, Operand] = {}
    for n in kernel.nodes:
        rn = renamed(n, names)
        for b, is_out in [*((i, False) for i in n.inputs), (n.output, True)]:
            if b not in operands or is_out:
                axes = tuple(rn.get(a) if a else None for a in node_axes(n, buffers[b].shape, is_out))
                operands[b] = Operand(b, tuple(buffers[b].shape), axes, _itemsize(buffers[b]))
    for b in [*kernel.inputs, *kernel.outputs]:
        if b not in operands:
            operands[b] = Operand(b, tuple(buffers[b].shape), align_axes(buffers[b].shape, names, dims),
                                  _itemsize(buffers[b]))
    dtype = buffers[kernel.inputs[0]].dtype if kernel.inputs else torch.float16
    lone_reduction = len(kernel.nodes) == 1 and isinstance(anchor, Reduction)
    division = divide_iteration_space(dims, inner, reds, dtype, cfg, options.work_division,
                                      k_fast=options.k_fast_placement, allow_reduction_split=lone_reduction)
    eps = cfg.elems_per_stick(dtype)
    slices = slice_ranges(division, dims, (inner,), eps, cfg.cores)
    copy_only = kernel.rule == "restickify" or all(n.op in ("copy", "clone", "restickify") for n in kernel.nodes)
    k = RowKernel(kernel.name, [] if copy_only else list(kernel.nodes), dims, col, operands,
                  list(kernel.inputs), list(kernel.outputs), copy_only, frozenset(reds),
                  division.split_reduction_dim is not None)
    busy = [c for c, s in enumerate(slices) if s]
    extent = {d: hi - lo for d, (lo, hi) in slices[busy[0]].items()} if busy else dict(dims)
    tile = row_tile_shape(k, extent, cfg, options.double_buffer, _fits(cfg, options, kernel.name))
    programs = _per_core(slices, division, cfg, lambda e, partners: emit_rows(
        k, e, {d: min(tile[d], e[d]) for d in e}, cfg, options.double_buffer, partners))
    bufs = row_lx_buffers(k, tile, cfg, options.double_buffer)
    return _spec(kernel, division, bufs, programs, slices, cfg, options, buffers, dims, tile, operands)


# --- matmul (+ epilogue) -----------------------------------------------------------------------------

def _out_operand(b: str, buffers: Mapping[str, BufferInfo], sizes: Mapping[str, int],
                 dims: Sequence[str] = ("B", "M", "N")) -> Operand:
    return Operand(b, tuple(buffers[b].shape), align_axes(buffers[b].shape, list(dims), sizes), _itemsize(buffers[b]))


def _matmul_spec(kernel: FusedKernel, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
                 options: CompileOptions) -> KernelSpec:
    mm = next(n for n in kernel.nodes if isinstance(n, MatMul))
    epilogue = [n for n in kernel.nodes if n is not mm]
    bad = [n.name for n in epilogue if not isinstance(n, Pointwise)]
    if bad:
        raise ValueError(f"kernel {kernel.name!r}: a matmul epilogue may only hold pointwise nodes, got {bad}")
    a, b = mm.inputs[0], mm.inputs[1]
    sizes = {"B": mm.b, "M": mm.m, "N": mm.n, "K": mm.k}
    dtype = buffers[a].dtype
    division = divide_matmul(mm.b, mm.m, mm.n, mm.k, dtype, cfg, options.work_division, options.k_fast_placement)
    eps = cfg.elems_per_stick(dtype)
    slices = slice_ranges(division, sizes, ("N", "K"), eps, cfg.cores)
    operands = {a: Operand(a, tuple(buffers[a].shape), align_axes(buffers[a].shape, ["B", "M", "K"], sizes),
                           _itemsize(buffers[a])),
                b: Operand(b, tuple(buffers[b].shape), align_axes(buffers[b].shape, ["B", "K", "N"], sizes),
                           _itemsize(buffers[b]))}
    for n in kernel.nodes:
        for name in [*n.inputs, n.output]:
            operands.setdefault(name, _out_operand(name, buffers, sizes))
    mk = MatmulKernel(kernel.name, a, b, mm.output, _itemsize(buffers[a]), _itemsize(buffers[b]), epilogue,
                      operands, [o for o in kernel.outputs])
    busy = [c for c, s in enumerate(slices) if s]
    ext = {d: hi - lo for d, (lo, hi) in slices[busy[0]].items()}
    k_split = division.split_reduction_dim is not None
    tiles = choose_matmul_tiles(mk, ext["M"], ext["N"], ext["K"], cfg, options.double_buffer, k_split,
                                _fits(cfg, options, kernel.name))
    programs = _per_core(slices, division, cfg, lambda e, partners: emit_matmul(
        mk, e["B"], e["M"], e["N"], e["K"], tiles, cfg, options.double_buffer, partners))
    bufs = matmul_lx_buffers(mk, *tiles, cfg, options.double_buffer, k_split)
    tile_dims = {"B": 1, "M": tiles[0], "N": tiles[1], "K": tiles[2]}
    return _spec(kernel, division, bufs, programs, slices, cfg, options, buffers, sizes, tile_dims, operands, [b])


# --- fused MLP ----------------------------------------------------------------------------------------

def _mlp_division(gate: MatMul, has_down: bool, dtype: torch.dtype, cfg: SpyreConfig,
                  options: CompileOptions) -> WorkDivision:
    """Split the intermediate dim I first; split rows only while that shortens the modeled critical path.

    Every core re-reads the weights of its I-slice once per row slice, and the weights dominate an MLP's
    traffic: a row split divides each core's MACs but multiplies weight reads. ``planned`` picks the row
    split ``m`` minimising ``max(compute per core, all DRAM bytes / bandwidth)``; ``naive`` splits I alone.
    With a down projection the I-slices hold partial sums of the output, so I is the reduced dim
    (partners adjacent under K-fast placement).
    """
    eps = cfg.elems_per_stick(dtype)
    i_sticks = -(-gate.n // eps)
    n = max(d for d in range(1, min(i_sticks, cfg.cores) + 1) if i_sticks % d == 0)
    item = dtype.itemsize
    weights = gate.k * gate.n * item * (3 if has_down else 2)
    macs = gate.m * gate.n * gate.k * (3 if has_down else 2)
    mac_per_us = cfg.macs_per_cycle_per_core * cfg.clock_hz / 1e6

    def critical_path_us(m: int) -> float:
        rows_eff = min(1.0, gate.m / m / cfg.pe_rows)
        compute = macs / (n * m) / (mac_per_us * rows_eff)
        dram = (m * weights + n * gate.m * gate.k * item) / cfg.dram_bandwidth * 1e6
        return max(compute, dram)

    m = 1
    if options.work_division == "planned":
        options_m = [d for d in range(1, cfg.cores // n + 1) if gate.m % d == 0]
        m = min(options_m, key=lambda d: (critical_path_us(d), d))
    reason = (f"MLP: the intermediate dim I takes {n} cores ({i_sticks} sticks), rows {m} (modeled critical path "
              f"{critical_path_us(m):.1f} us; weights are re-read once per row slice, so I is split first)")
    splits = {"N": n, "M": m, "K": 1} if has_down else {"K": 1, "M": m, "N": n}
    red = "N" if has_down else None
    return WorkDivision(splits, placement(splits, red, options.k_fast_placement), options.work_division, reason,
                        None, ("N",) if has_down else ("K",))


def _mlp_spec(kernel: FusedKernel, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
              options: CompileOptions) -> KernelSpec:
    matmuls = [n for n in kernel.nodes if isinstance(n, MatMul)]
    pointwise = [n for n in kernel.nodes if isinstance(n, Pointwise)]
    if len(matmuls) not in (2, 3) or matmuls[0].inputs[0] != matmuls[1].inputs[0] or not pointwise:
        raise ValueError(f"kernel {kernel.name!r}: an mlp kernel is gate and up matmuls sharing their input, "
                         f"pointwise nodes, and optionally a down matmul; got {[n.op for n in kernel.nodes]}")
    if len(pointwise) + len(matmuls) != len(kernel.nodes):
        raise ValueError(f"kernel {kernel.name!r}: an mlp kernel holds only matmuls and pointwise nodes")
    gate, up = matmuls[0], matmuls[1]
    down = matmuls[2] if len(matmuls) == 3 else None
    h = pointwise[-1].output
    if down is not None and down.inputs[0] != h:
        raise ValueError(f"kernel {kernel.name!r}: the down matmul must consume the product {h!r}")
    x = gate.inputs[0]
    dtype = buffers[x].dtype
    sizes = {"B": 1, "M": gate.m, "N": gate.n, "K": gate.k}
    division = _mlp_division(gate, down is not None, dtype, cfg, options)
    eps = cfg.elems_per_stick(dtype)
    slices = slice_ranges(division, sizes, ("N", "K"), eps, cfg.cores)
    out = down.output if down is not None else h
    out_cols = down.n if down is not None else 0
    operands: dict[str, Operand] = {}
    for n in pointwise:
        for name in [*n.inputs, n.output]:
            operands.setdefault(name, _out_operand(name, buffers, sizes))
    if down is not None:
        operands[out] = _out_operand(out, buffers, {"M": gate.m, "O": down.n}, ("M", "O"))
        operands[down.inputs[1]] = _out_operand(down.inputs[1], buffers, {"N": gate.n, "O": down.n}, ("N", "O"))
    operands[x] = _out_operand(x, buffers, sizes, ("M", "K"))
    for w in (gate.inputs[1], up.inputs[1]):
        operands[w] = _out_operand(w, buffers, sizes, ("K", "N"))
    w_item = _itemsize(buffers[gate.inputs[1]])
    mk = MlpKernel(kernel.name, x, gate.inputs[1], up.inputs[1], down.inputs[1] if down else None, gate.output,
                   up.output, pointwise, h, out, _itemsize(buffers[x]), w_item, operands, gate.k, out_cols)
    busy = [c for c, s in enumerate(slices) if s]
    ext = {d: hi - lo for d, (lo, hi) in slices[busy[0]].items()}
    reduce = down is not None and division.split_reduction_dim is not None
    tiles = choose_mlp_tiles(mk, ext["M"], ext["N"], cfg, options.double_buffer, reduce,
                             _fits(cfg, options, kernel.name))
    programs = _per_core(slices, division if down is not None else None, cfg, lambda e, partners: emit_mlp(
        mk, e["M"], e["N"], tiles, cfg, options.double_buffer, partners))
    whole_slice = tiles[1] >= -(-ext["N"] // eps) * eps
    bufs = mlp_lx_buffers(mk, *tiles, cfg, options.double_buffer, reduce, whole_slice)
    tile_dims = {"B": 1, "M": tiles[0], "N": tiles[1], "K": tiles[2], "O": tiles[3]}
    weights = [gate.inputs[1], up.inputs[1]] + ([down.inputs[1]] if down else [])
    return _spec(kernel, division, bufs, programs, slices, cfg, options, buffers, sizes, tile_dims, operands,
                 weights)
