"""Codegen: one fused kernel -> a :class:`KernelSpec` (division, LX plan, per-core tile programs, SuperDSC).

``generate_kernel`` is where kernel planning comes together, in the order torch-spyre runs it:
work division picks each core's slice (:mod:`~spyre_lab.compiler.work_division`); the cores that then
need the same bytes of an operand at the same step form its DRAM broadcast group; tile sizes shrink
until a steady-state tile's buffers fit LX, placed by the scratchpad planner
(:mod:`~spyre_lab.compiler.scratchpad`); and every core gets its tile program
(:mod:`~spyre_lab.compiler.tiling_rows`, :mod:`~spyre_lab.compiler.tiling_matmul`,
:mod:`~spyre_lab.compiler.tiling_mlp`), the list of loads, PT/SFU ops, ring transfers and stores the
simulator runs. Inputs read through views are tiled by the node's iteration space, through the view's
strides (:func:`~spyre_lab.compiler.tiling_common.view_operand`). :func:`estimate_us` is the modeled
time of a kernel, for a scheduler weighing one fused kernel against several.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch

from spyre_lab.compiler.ir import BufferInfo, InputView, IRNode, MatMul, NodeGroup, Pointwise, Reduction
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.scratchpad import LXBuffer, plan_scratchpad
from spyre_lab.compiler.tiling_attention import (
    Attention,
    AttentionShape,
    attention_lx_buffers,
    block_state_fn,
    choose_attention_tiles,
    divide_attention,
    emit_attention,
    node_reads,
    row_ranges,
    unmasked_keys,
)
from spyre_lab.compiler.tiling_common import (
    Operand,
    PartnerInfo,
    align_axes,
    node_axes,
    renamed,
    share_group,
    view_operand,
)
from spyre_lab.compiler.tiling_matmul import MatmulTiling, choose_matmul_tiles, emit_matmul, matmul_lx_buffers
from spyre_lab.compiler.tiling_mlp import MlpTiling, choose_mlp_tiles, emit_mlp, mlp_lx_buffers
from spyre_lab.compiler.tiling_rows import RowTiling, emit_rows, row_lx_buffers, row_tile_shape
from spyre_lab.compiler.work_division import (
    WorkDivision,
    divide_iteration_space,
    divide_matmul,
    divide_mlp,
    ring_hops,
    slice_ranges,
)
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, LXOverflowError, OpKind, TileProgram

__all__ = ["KNOWN_RULES", "KernelSpec", "estimate_us", "generate_kernel"]

KNOWN_RULES = ("single", "pointwise_chain", "reduction_fusion", "matmul_epilogue", "softmax", "mlp", "restickify",
               "attention")


# --- generate_kernel ----------------------------------------------------------------------------------

def generate_kernel(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
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
    if kernel.rule == "attention":
        return _attention_spec(kernel, buffers, cfg, options)
    matmuls = [n for n in kernel.nodes if isinstance(n, MatMul)]
    if kernel.rule == "mlp" or len(matmuls) >= 2:
        return _mlp_spec(kernel, buffers, cfg, options)
    if matmuls:
        return _matmul_spec(kernel, buffers, cfg, options)
    return _row_spec(kernel, buffers, cfg, options)


def _live_bytes_bound(bufs: Sequence[LXBuffer]) -> int:
    """A lower bound on any LX plan's peak: at each step, the buffers alive then that have no in-place parent
    all need addresses of their own. (Tile choosers try many sizes; most fail this cheap test.)"""
    owners = [b for b in bufs if b.in_place_parent is None]
    steps = {b.start for b in owners}
    return max((sum(b.size for b in owners if b.start <= s <= b.end) for s in steps), default=0)


def _fits(cfg: SpyreConfig, options: CompileOptions, name: str) -> Callable[[list[LXBuffer]], bool]:
    """Does a tile's buffer list fit LX under the chosen allocator?"""
    budget = cfg.lx_budget_bytes

    def fits(bufs: list[LXBuffer]) -> bool:
        if _live_bytes_bound(bufs) > budget:
            return False
        try:
            plan_scratchpad(bufs, cfg.lx_budget_bytes, options.lx_allocator, name)
        except LXOverflowError:
            return False
        return True
    return fits


def _partners(division: WorkDivision, core: int) -> PartnerInfo | None:
    red = division.split_reduction_dim
    if red is None:
        return None
    s = division.slice_of_core()[core]
    return division.slice_coords(s)[red], [division.core_of_slice[q] for q in division.partners(s)], core


def _per_core(slices: Sequence[Mapping[str, tuple[int, int]]], division: WorkDivision | None, cfg: SpyreConfig,
              emit: Callable[[dict[str, int], PartnerInfo | None], CoreOps],
              reuse_partners: bool = True) -> list[CoreOps]:
    """Every core's program. Cores with the same slice extents and no partners run the very same ops
    (one shared program), which keeps codegen and the analytic simulator linear in distinct work. Partners
    of a split reduction with the same extents and rank differ only in whom their ring ops talk to: they
    get the first such core's ops with those peers swapped."""
    programs = [CoreOps() for _ in range(cfg.cores)]
    shared: dict[tuple, CoreOps] = {}
    templates: dict[tuple, tuple[CoreOps, PartnerInfo]] = {}
    for c, ranges in enumerate(slices):
        if not ranges:
            continue
        extent = {d: hi - lo for d, (lo, hi) in ranges.items()}
        key = tuple(sorted(extent.items()))
        partners = _partners(division, c) if division is not None else None
        if partners is not None:
            rank_key = (key, partners[0], len(partners[1]))
            if reuse_partners and rank_key in templates:
                programs[c] = _repartnered(*templates[rank_key], partners, cfg.cores)
            else:
                programs[c] = emit(extent, partners)
                templates[rank_key] = (programs[c], partners)
            continue
        if key not in shared:
            shared[key] = emit(extent, None)
        programs[c] = shared[key]
    return programs


def _repartnered(template: CoreOps, source: PartnerInfo, target: PartnerInfo, cores: int) -> CoreOps:
    """``template`` (emitted for partner ``source``) as the program of ``target``, a partner of the same rank
    in another group: the same op objects, except ring transfers go to ``target``'s partners."""
    peer = dict(zip(source[1], target[1]))
    ops = []
    for op in template.ops:
        if op.kind is OpKind.RING_SEND:
            op = replace(op, peer=peer[op.peer], hops=ring_hops(target[2], peer[op.peer], cores))
        elif op.kind is OpKind.RING_RECV:
            op = replace(op, peer=peer[op.peer])
        ops.append(op)
    return CoreOps(ops)


def _slots(kernel: NodeGroup) -> list[str]:
    seen: list[str] = []
    for b in [*kernel.inputs, *kernel.outputs]:
        if b not in seen:
            seen.append(b)
    return seen


def _spec(kernel: NodeGroup, division: WorkDivision, bufs: list[LXBuffer], programs: list[CoreOps],
          slices: list[dict[str, tuple[int, int]]], cfg: SpyreConfig, options: CompileOptions,
          buffers: Mapping[str, BufferInfo], dims: Mapping[str, int], tiles: Mapping[str, int],
          operands: dict[str, Operand], weights: Sequence[str] = ()) -> KernelSpec:
    """Place the steady-state buffers in LX and bundle everything into a KernelSpec."""
    plan = plan_scratchpad(bufs, cfg.lx_budget_bytes, options.lx_allocator, kernel.name)
    slots = _slots(kernel)
    return KernelSpec(
        name=kernel.name, rule=kernel.rule, ops=[n.op for n in kernel.nodes], division=division, lx_plan=plan,
        tile_kernel=TileProgram.from_programs(kernel.name, programs, cfg.cores), address_slots=slots, slices=slices,
        cfg=cfg, dims=dict(dims), tiles=dict(tiles), operands=operands,
        buffers={b: buffers[b] for b in slots}, units={n.op: "pt" if isinstance(n, MatMul) else "sfp"
                                                       for n in kernel.nodes},
        roles=_roles(kernel, buffers, weights))


def _roles(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], weights: Sequence[str]) -> dict[str, str]:
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


def _input_operand(node: IRNode, views: Sequence[InputView | None], i: int, rn: Mapping[str, str],
                   buffers: Mapping[str, BufferInfo], dims: Mapping[str, int]) -> Operand:
    """Input ``i`` of ``node`` in the kernel's dims: through its view when it has one (a transposed or
    expanded read is tiled by the node's iteration space), else the buffer's dims aligned to the node's."""
    b = node.inputs[i]
    item = _itemsize(buffers[b])
    view = views[i] if i < len(views) else None
    if view is not None:
        moved = InputView(view.shape, view.strides, view.offset, tuple(rn.get(a) if a else None for a in view.axes))
        op = view_operand(b, moved, dims, item)
        if op is not None:
            return op
    axes = tuple(rn.get(a) if a else None for a in node_axes(node, buffers[b].shape, False))
    return Operand(b, tuple(buffers[b].shape), axes, item)


def _row_spec(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
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
        for i, b in enumerate(n.inputs):
            if b not in operands:
                operands[b] = _input_operand(n, kernel.views_of(n), i, rn, buffers, dims)
        axes = tuple(rn.get(a) if a else None for a in node_axes(n, buffers[n.output].shape, True))
        operands[n.output] = Operand(n.output, tuple(buffers[n.output].shape), axes, _itemsize(buffers[n.output]))
    for b in [*kernel.inputs, *kernel.outputs]:
        if b not in operands:
            operands[b] = Operand(b, tuple(buffers[b].shape), align_axes(buffers[b].shape, names, dims),
                                  _itemsize(buffers[b]))
    dtype = buffers[kernel.inputs[0]].dtype if kernel.inputs else torch.float16
    lone_reduction = len(kernel.nodes) == 1 and isinstance(anchor, Reduction)
    division = divide_iteration_space(dims, inner, reds, dtype, cfg, options.work_division,
                                      k_fast=options.k_fast_placement, allow_reduction_split=lone_reduction,
                                      uneven=options.uneven_splits)
    eps = cfg.elems_per_stick(dtype)
    slices = slice_ranges(division, dims, (inner,), eps, cfg.cores)
    copy_only = kernel.rule == "restickify" or all(n.op in ("copy", "clone", "restickify") for n in kernel.nodes)
    k = RowTiling(kernel.name, [] if copy_only else list(kernel.nodes), dims, col, operands,
                  list(kernel.inputs), list(kernel.outputs), copy_only, frozenset(reds),
                  division.split_reduction_dim is not None,
                  shares={b: share_group(operands[b].dims, division.splits) for b in kernel.inputs},
                  lx_pin_reductions=options.lx_pin_reductions, lx_in_place=options.lx_in_place,
                  lx_clone_inputs=options.lx_clone_inputs)
    busy = [c for c, s in enumerate(slices) if s]
    extent = {d: hi - lo for d, (lo, hi) in slices[busy[0]].items()} if busy else dict(dims)
    tile = row_tile_shape(k, extent, cfg, options.double_buffer, _fits(cfg, options, kernel.name))
    programs = _per_core(slices, division, cfg, lambda e, partners: emit_rows(
        k, e, {d: min(tile[d], e[d]) for d in e}, cfg, options.double_buffer, partners))
    bufs = row_lx_buffers(k, tile, cfg, options.double_buffer)
    return _spec(kernel, division, bufs, programs, slices, cfg, options, buffers, dims, tile, operands)


# --- fused attention ---------------------------------------------------------------------------------

def _attention_spec(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
                    options: CompileOptions) -> KernelSpec:
    """Heads and query rows over the cores, the tallest query tile that fits LX, K/V tiles streamed through it."""
    node = kernel.nodes[0]
    if len(kernel.nodes) != 1 or not isinstance(node, Attention):
        raise ValueError(f"kernel {kernel.name!r}: an attention kernel holds exactly one Attention node")
    d = node.dims
    item = _itemsize(buffers[node.inputs[0]])
    streamed = sum(1 for x in node.extras if x not in node.const_extras)
    shape = AttentionShape(kernel.name, d["B"], d["M"], d["N"], d["K"], d["E"], item, len(node.extras),
                           len(node.score_ops), block_state_fn(node.const_extras, streamed, node.additive_only),
                           unmasked_keys(node.const_extras, node.additive_only))
    splits, why = divide_attention(shape, cfg.cores)
    per_head = math.ceil(d["B"] / splits["B"])
    ranges = {"B": [(min(d["B"], i * per_head), min(d["B"], (i + 1) * per_head)) for i in range(splits["B"])],
              "M": row_ranges(shape, splits["M"])}
    slices: list[dict[str, tuple[int, int]]] = []
    for bi in ranges["B"]:
        for mi in ranges["M"]:
            slices.append({"B": bi, "M": mi} if bi[1] > bi[0] and mi[1] > mi[0] else {})
    slices += [{} for _ in range(cfg.cores - len(slices))]
    keys = shape.row_keys or [d["N"]] * d["M"]
    busiest = max((s["M"] for s in slices if s), key=lambda r: (sum(keys[r[0]:r[1]]), r[1] - r[0]))
    tq, tk, tile_why = choose_attention_tiles(shape, busiest, cfg, options.double_buffer,
                                              _fits(cfg, options, kernel.name),
                                              max(s["M"][1] - s["M"][0] for s in slices if s),
                                              sum(1 for s in slices if s))
    division = WorkDivision(dict(splits), tuple(range(math.prod(splits.values()))), "attention", f"{why}; {tile_why}")
    programs = [emit_attention(shape, s["B"], s["M"], tq, tk, cfg, options.double_buffer) if s else CoreOps()
                for s in slices]
    operands: dict[str, Operand] = {}
    for i, r in enumerate(node_reads(node)):           # Q [B,M,K], K^T [B,K,N], V [B,N,E] (named as its matmul did)
        shape_b, item_b = tuple(buffers[r.buffer].shape), _itemsize(buffers[r.buffer])
        axes = tuple({"K": "N", "N": "E"}.get(a, a) if i == 2 and a else a for a in r.axes)
        op = None
        if i < 3 and not r.is_identity:
            m = r.meta
            op = view_operand(r.buffer, InputView(tuple(m.shape), tuple(m.stride()), m.storage_offset(), axes), d,
                              item_b)
        elif i < 3 and len(axes) == len(shape_b):
            op = Operand(r.buffer, shape_b, axes, item_b)
        operands.setdefault(r.buffer, op or Operand(r.buffer, shape_b, (None,) * len(shape_b), item_b))
    operands[node.output] = _out_operand(node.output, buffers, d, ("B", "M", "E"))
    bufs = attention_lx_buffers(shape, tq, tk, cfg, options.double_buffer)
    spec = _spec(kernel, division, bufs, programs, slices, cfg, options, buffers, d,
                 {"B": 1, "M": tq, "N": tk, "K": d["K"], "E": d["E"]}, operands)
    spec.ops = [n.op for n in node.members]
    spec.units = {n.op: "pt" if isinstance(n, MatMul) else "sfp" for n in node.members}
    return spec


# --- matmul (+ epilogue) -----------------------------------------------------------------------------

def _out_operand(b: str, buffers: Mapping[str, BufferInfo], sizes: Mapping[str, int],
                 dims: Sequence[str] = ("B", "M", "N")) -> Operand:
    return Operand(b, tuple(buffers[b].shape), align_axes(buffers[b].shape, list(dims), sizes), _itemsize(buffers[b]))


def _viewed(node: IRNode, views: Sequence[InputView | None], i: int, buffers: Mapping[str, BufferInfo],
            sizes: Mapping[str, int]) -> Operand | None:
    """Input ``i`` of ``node`` through its view, when it has one whose every moving axis is a dim of ``sizes``."""
    view = views[i] if i < len(views) else None
    if view is None or any(n > 1 and st > 0 and a not in sizes for n, st, a in zip(view.shape, view.strides,
                                                                                      view.axes)):
        return None
    return view_operand(node.inputs[i], view, sizes, _itemsize(buffers[node.inputs[i]]))


def _matmul_spec(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
                 options: CompileOptions) -> KernelSpec:
    mm = next(n for n in kernel.nodes if isinstance(n, MatMul))
    epilogue = [n for n in kernel.nodes if n is not mm]
    bad = [n.name for n in epilogue if not isinstance(n, Pointwise)]
    if bad:
        raise ValueError(f"kernel {kernel.name!r}: a matmul epilogue may only hold pointwise nodes, got {bad}")
    a, b = mm.inputs[0], mm.inputs[1]
    sizes = {"B": mm.b, "M": mm.m, "N": mm.n, "K": mm.k}
    dtype = buffers[a].dtype
    division = divide_matmul(mm.b, mm.m, mm.n, mm.k, dtype, cfg, options.work_division, options.k_fast_placement,
                             uneven=options.uneven_splits)
    eps = cfg.elems_per_stick(dtype)
    slices = slice_ranges(division, sizes, ("N", "K"), eps, cfg.cores)
    views = kernel.views_of(mm)
    operands = {a: _viewed(mm, views, 0, buffers, sizes) or Operand(
                    a, tuple(buffers[a].shape), align_axes(buffers[a].shape, ["B", "M", "K"], sizes),
                    _itemsize(buffers[a])),
                b: _viewed(mm, views, 1, buffers, sizes) or Operand(
                    b, tuple(buffers[b].shape), align_axes(buffers[b].shape, ["B", "K", "N"], sizes),
                    _itemsize(buffers[b]))}
    for n in kernel.nodes:
        for name in [*n.inputs, n.output]:
            operands.setdefault(name, _out_operand(name, buffers, sizes))
    splits = division.splits
    shares = {x: share_group(operands[x].dims, splits) for x in (a, b)}
    shares.update({x: share_group(operands[x].dims, splits, exclude=("K",)) for n in epilogue for x in n.inputs})
    mk = MatmulTiling(kernel.name, a, b, mm.output, _itemsize(buffers[a]), _itemsize(buffers[b]), epilogue,
                      operands, list(kernel.outputs), shares, division.cores_used, splits["K"])
    busy = [c for c, s in enumerate(slices) if s]
    ext = {d: hi - lo for d, (lo, hi) in slices[busy[0]].items()}
    k_split = division.split_reduction_dim is not None
    tiles = choose_matmul_tiles(mk, ext["M"], ext["N"], ext["K"], cfg, options.double_buffer, k_split,
                                _fits(cfg, options, kernel.name), ext["B"])
    programs = _per_core(slices, division, cfg, lambda e, partners: emit_matmul(
        mk, e["B"], e["M"], e["N"], e["K"], tiles, cfg, options.double_buffer, partners))
    bufs = matmul_lx_buffers(mk, *tiles, cfg, options.double_buffer, k_split)
    tile_dims = {"B": 1, "M": tiles[0], "N": tiles[1], "K": tiles[2]}
    return _spec(kernel, division, bufs, programs, slices, cfg, options, buffers, sizes, tile_dims, operands, [b])


# --- fused MLP ----------------------------------------------------------------------------------------

def _mlp_spec(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
              options: CompileOptions) -> KernelSpec:
    """A fused MLP: check its shape, lay out its operands, divide it, pick tiles that fit LX, emit per core."""
    gate, up, down, pointwise = _mlp_parts(kernel)
    mk = _mlp_kernel(kernel.name, gate, up, down, pointwise, buffers)
    dtype = buffers[gate.inputs[0]].dtype
    eps = cfg.elems_per_stick(dtype)
    tiles_for = _mlp_tile_chooser(mk, cfg, options, kernel.name)

    def row_tiles(i_split: int, row_split: int) -> int:
        """Row tiles per core under an (I, rows) split: each one re-reads the core's weight slice."""
        rows, i_cols = gate.m // row_split, -(-gate.n // eps) // i_split * eps
        tm = tiles_for(rows, i_cols, down is not None and i_split > 1)[0]
        return -(-rows // tm)

    division = divide_mlp(gate.m, gate.n, gate.k, down is not None, dtype, cfg, options.work_division,
                          options.k_fast_placement, down.n if down is not None else None, row_tiles)
    sizes = {"B": 1, "M": gate.m, "N": gate.n, "K": gate.k}
    slices = slice_ranges(division, sizes, ("N", "K"), eps, cfg.cores)
    mk.shares = {b: share_group(mk.operands[b].dims, division.splits) for b in kernel.inputs}
    busy = [c for c, s in enumerate(slices) if s]
    ext = {d: hi - lo for d, (lo, hi) in slices[busy[0]].items()}
    reduce = down is not None and division.split_reduction_dim is not None
    tiles = tiles_for(ext["M"], ext["N"], reduce)
    programs = _per_core(slices, division if down is not None else None, cfg, lambda e, partners: emit_mlp(
        mk, e["M"], e["N"], tiles, cfg, options.double_buffer, partners))
    whole_slice = tiles[1] >= -(-ext["N"] // eps) * eps
    bufs = mlp_lx_buffers(mk, *tiles, cfg, options.double_buffer, reduce, whole_slice)
    tile_dims = {"B": 1, "M": tiles[0], "N": tiles[1], "K": tiles[2], "O": tiles[3]}
    weights = [gate.inputs[1], up.inputs[1]] + ([down.inputs[1]] if down else [])
    return _spec(kernel, division, bufs, programs, slices, cfg, options, buffers, sizes, tile_dims, mk.operands,
                 weights)


def _mlp_parts(kernel: NodeGroup) -> tuple[MatMul, MatMul, MatMul | None, list[Pointwise]]:
    """Gate, up, optional down matmul and the pointwise nodes of an mlp kernel, or an error naming what is off."""
    matmuls = [n for n in kernel.nodes if isinstance(n, MatMul)]
    pointwise = [n for n in kernel.nodes if isinstance(n, Pointwise)]
    if len(matmuls) not in (2, 3) or matmuls[0].inputs[0] != matmuls[1].inputs[0] or not pointwise:
        raise ValueError(f"kernel {kernel.name!r}: an mlp kernel is gate and up matmuls sharing their input, "
                         f"pointwise nodes, and optionally a down matmul; got {[n.op for n in kernel.nodes]}")
    if len(pointwise) + len(matmuls) != len(kernel.nodes):
        raise ValueError(f"kernel {kernel.name!r}: an mlp kernel holds only matmuls and pointwise nodes")
    down = matmuls[2] if len(matmuls) == 3 else None
    h = pointwise[-1].output
    if down is not None and down.inputs[0] != h:
        raise ValueError(f"kernel {kernel.name!r}: the down matmul must consume the product {h!r}")
    return matmuls[0], matmuls[1], down, pointwise


def _mlp_kernel(name: str, gate: MatMul, up: MatMul, down: MatMul | None, pointwise: list[Pointwise],
                buffers: Mapping[str, BufferInfo]) -> MlpTiling:
    """The MLP's operands in its dims: x[M,K], gate and up weights [K,N], the product [M,N], down [N,O]."""
    x, h = gate.inputs[0], pointwise[-1].output
    sizes = {"B": 1, "M": gate.m, "N": gate.n, "K": gate.k}
    out = down.output if down is not None else h
    operands: dict[str, Operand] = {}
    for n in pointwise:
        for b in [*n.inputs, n.output]:
            operands.setdefault(b, _out_operand(b, buffers, sizes))
    if down is not None:
        operands[out] = _out_operand(out, buffers, {"M": gate.m, "O": down.n}, ("M", "O"))
        operands[down.inputs[1]] = _out_operand(down.inputs[1], buffers, {"N": gate.n, "O": down.n}, ("N", "O"))
    operands[x] = _out_operand(x, buffers, sizes, ("M", "K"))
    for w in (gate.inputs[1], up.inputs[1]):
        operands[w] = _out_operand(w, buffers, sizes, ("K", "N"))
    return MlpTiling(name, x, gate.inputs[1], up.inputs[1], down.inputs[1] if down else None, gate.output,
                     up.output, pointwise, h, out, _itemsize(buffers[x]), _itemsize(buffers[gate.inputs[1]]),
                     operands, gate.k, down.n if down is not None else 0)


def _mlp_tile_chooser(mk: MlpTiling, cfg: SpyreConfig, options: CompileOptions,
                      name: str) -> Callable[[int, int, bool], tuple[int, int, int, int]]:
    """``tiles_for(rows, i_cols, reduce)``: the MLP tiles that fit LX for one core's slice, memoized
    (work division asks for many candidate splits, several of which share a slice shape)."""
    fits = _fits(cfg, options, name)
    chosen: dict[tuple[int, int, bool], tuple[int, int, int, int]] = {}
    fitting: dict[tuple, bool] = {}

    def tiles_for(rows: int, i_cols: int, reduce: bool) -> tuple[int, int, int, int]:
        if (rows, i_cols, reduce) not in chosen:
            chosen[rows, i_cols, reduce] = choose_mlp_tiles(mk, rows, i_cols, cfg, options.double_buffer, reduce,
                                                            fits, fitting)
        return chosen[rows, i_cols, reduce]

    return tiles_for


# --- cost comparison ------------------------------------------------------------------------------

def estimate_us(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
                options: CompileOptions) -> float:
    """Modeled time (analytic simulator, launch included) of ``kernel`` as ``generate_kernel`` would plan it.

    A scheduler deciding whether to fuse compares ``estimate_us(fused)`` with the sum over the kernels it
    would run instead: fusion saves DRAM round trips and launches but may run on fewer cores (a fused MLP
    splits its intermediate dim, whose stick count may not divide the cores as well as a plain matmul's).
    """
    return generate_kernel(kernel, buffers, cfg, options).simulate("analytic").time_us
