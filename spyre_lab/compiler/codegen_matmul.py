"""The matmul family's planner: a matmul and its pointwise epilogue -> a KernelSpec.

Work division picks each core's B/M/N/K slice (:func:`~spyre_lab.compiler.work_division.divide_matmul`);
operands read through views are tiled through their strides; the epilogue runs on each output tile
while it is still in LX (:mod:`~spyre_lab.compiler.tiling_matmul`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spyre_lab.compiler.ir import BufferInfo, InputView, IRNode, MatMul, NodeGroup, Pointwise
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.spec_common import bundle_spec, fits_lx, itemsize, out_operand, per_core_programs
from spyre_lab.compiler.tiling_common import Operand, align_axes, share_group, view_operand
from spyre_lab.compiler.tiling_matmul import MatmulTiling, choose_matmul_tiles, emit_matmul, matmul_lx_buffers
from spyre_lab.compiler.work_division import divide_matmul, slice_ranges
from spyre_lab.device.config import SpyreConfig


def _viewed(node: IRNode, views: Sequence[InputView | None], i: int, buffers: Mapping[str, BufferInfo],
            sizes: Mapping[str, int]) -> Operand | None:
    """Input ``i`` of ``node`` through its view, when it has one whose every moving axis is a dim of ``sizes``."""
    view = views[i] if i < len(views) else None
    if view is None or any(n > 1 and st > 0 and a not in sizes for n, st, a in zip(view.shape, view.strides,
                                                                                      view.axes)):
        return None
    return view_operand(node.inputs[i], view, sizes, itemsize(buffers[node.inputs[i]]))


def plan_matmul(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
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
                    itemsize(buffers[a])),
                b: _viewed(mm, views, 1, buffers, sizes) or Operand(
                    b, tuple(buffers[b].shape), align_axes(buffers[b].shape, ["B", "K", "N"], sizes),
                    itemsize(buffers[b]))}
    for n in kernel.nodes:
        for name in [*n.inputs, n.output]:
            operands.setdefault(name, out_operand(name, buffers, sizes))
    splits = division.splits
    shares = {x: share_group(operands[x].dims, splits) for x in (a, b)}
    shares.update({x: share_group(operands[x].dims, splits, exclude=("K",)) for n in epilogue for x in n.inputs})
    mk = MatmulTiling(kernel.name, a, b, mm.output, itemsize(buffers[a]), itemsize(buffers[b]), epilogue,
                      operands, list(kernel.outputs), shares, division.cores_used, splits["K"])
    busy = [c for c, s in enumerate(slices) if s]
    ext = {d: hi - lo for d, (lo, hi) in slices[busy[0]].items()}
    k_split = division.split_reduction_dim is not None
    tiles = choose_matmul_tiles(mk, ext["M"], ext["N"], ext["K"], cfg, options.double_buffer, k_split,
                                fits_lx(cfg, options, kernel.name), ext["B"])
    programs = per_core_programs(slices, division, cfg, lambda e, partners: emit_matmul(
        mk, e["B"], e["M"], e["N"], e["K"], tiles, cfg, options.double_buffer, partners))
    bufs = matmul_lx_buffers(mk, *tiles, cfg, options.double_buffer, k_split)
    tile_dims = {"B": 1, "M": tiles[0], "N": tiles[1], "K": tiles[2]}
    return bundle_spec(kernel, division, bufs, programs, slices, cfg, options, buffers, sizes, tile_dims, operands, [b])
