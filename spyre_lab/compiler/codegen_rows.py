"""The row tiling family's planner: pointwise, reduction, softmax and restickify kernels -> a KernelSpec.

The kernel's anchor node gives the iteration space; reductions and the innermost dim stay whole in a
tile's columns, the other dims are divided over the cores and cut into row tiles that fit LX
(:mod:`~spyre_lab.compiler.tiling_rows`). Inputs read through views are tiled by the node's iteration
space, through the view's strides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from spyre_lab.compiler.ir import BufferInfo, InputView, IRNode, NodeGroup, Reduction
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.spec_common import bundle_spec, fits_lx, itemsize, per_core_programs
from spyre_lab.compiler.tiling_common import Operand, align_axes, node_axes, renamed, share_group, view_operand
from spyre_lab.compiler.tiling_rows import RowTiling, emit_rows, row_lx_buffers, row_tile_shape
from spyre_lab.compiler.work_division import divide_iteration_space, slice_ranges
from spyre_lab.device.config import SpyreConfig


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
    item = itemsize(buffers[b])
    view = views[i] if i < len(views) else None
    if view is not None:
        moved = InputView(view.shape, view.strides, view.offset, tuple(rn.get(a) if a else None for a in view.axes))
        op = view_operand(b, moved, dims, item)
        if op is not None:
            return op
    axes = tuple(rn.get(a) if a else None for a in node_axes(node, buffers[b].shape, False))
    return Operand(b, tuple(buffers[b].shape), axes, item)


def plan_rows(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
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
        operands[n.output] = Operand(n.output, tuple(buffers[n.output].shape), axes, itemsize(buffers[n.output]))
    for b in [*kernel.inputs, *kernel.outputs]:
        if b not in operands:
            operands[b] = Operand(b, tuple(buffers[b].shape), align_axes(buffers[b].shape, names, dims),
                                  itemsize(buffers[b]))
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
    tile = row_tile_shape(k, extent, cfg, options.double_buffer, fits_lx(cfg, options, kernel.name))
    programs = per_core_programs(slices, division, cfg, lambda e, partners: emit_rows(
        k, e, {d: min(tile[d], e[d]) for d in e}, cfg, options.double_buffer, partners))
    bufs = row_lx_buffers(k, tile, cfg, options.double_buffer)
    return bundle_spec(kernel, division, bufs, programs, slices, cfg, options, buffers, dims, tile, operands)
