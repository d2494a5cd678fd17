"""The MLP family's planner: gate, up, SiLU x mul and optionally down in one kernel -> a KernelSpec.

The intermediate dim and the rows are divided over the cores by the MLP cost model
(:func:`~spyre_lab.compiler.work_division.divide_mlp`), which asks this planner how many row tiles a
candidate split needs (each re-reads the core's weight slice) (:mod:`~spyre_lab.compiler.tiling_mlp`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from spyre_lab.compiler.ir import BufferInfo, MatMul, NodeGroup, Pointwise
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.spec_common import bundle_spec, fits_lx, itemsize, out_operand, per_core_programs
from spyre_lab.compiler.tiling_common import Operand, share_group
from spyre_lab.compiler.tiling_mlp import MlpTiling, choose_mlp_tiles, emit_mlp, mlp_lx_buffers
from spyre_lab.compiler.work_division import divide_mlp, slice_ranges
from spyre_lab.device.config import SpyreConfig


def plan_mlp(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
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
    programs = per_core_programs(slices, division if down is not None else None, cfg, lambda e, partners: emit_mlp(
        mk, e["M"], e["N"], tiles, cfg, options.double_buffer, partners))
    whole_slice = tiles[1] >= -(-ext["N"] // eps) * eps
    bufs = mlp_lx_buffers(mk, *tiles, cfg, options.double_buffer, reduce, whole_slice)
    tile_dims = {"B": 1, "M": tiles[0], "N": tiles[1], "K": tiles[2], "O": tiles[3]}
    weights = [gate.inputs[1], up.inputs[1]] + ([down.inputs[1]] if down else [])
    return bundle_spec(kernel, division, bufs, programs, slices, cfg, options, buffers, sizes, tile_dims, mk.operands,
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
            operands.setdefault(b, out_operand(b, buffers, sizes))
    if down is not None:
        operands[out] = out_operand(out, buffers, {"M": gate.m, "O": down.n}, ("M", "O"))
        operands[down.inputs[1]] = out_operand(down.inputs[1], buffers, {"N": gate.n, "O": down.n}, ("N", "O"))
    operands[x] = out_operand(x, buffers, sizes, ("M", "K"))
    for w in (gate.inputs[1], up.inputs[1]):
        operands[w] = out_operand(w, buffers, sizes, ("K", "N"))
    return MlpTiling(name, x, gate.inputs[1], up.inputs[1], down.inputs[1] if down else None, gate.output,
                     up.output, pointwise, h, out, itemsize(buffers[x]), itemsize(buffers[gate.inputs[1]]),
                     operands, gate.k, down.n if down is not None else 0)


def _mlp_tile_chooser(mk: MlpTiling, cfg: SpyreConfig, options: CompileOptions,
                      name: str) -> Callable[[int, int, bool], tuple[int, int, int, int]]:
    """``tiles_for(rows, i_cols, reduce)``: the MLP tiles that fit LX for one core's slice, memoized
    (work division asks for many candidate splits, several of which share a slice shape)."""
    fits = fits_lx(cfg, options, name)
    chosen: dict[tuple[int, int, bool], tuple[int, int, int, int]] = {}
    fitting: dict[tuple, bool] = {}

    def tiles_for(rows: int, i_cols: int, reduce: bool) -> tuple[int, int, int, int]:
        if (rows, i_cols, reduce) not in chosen:
            chosen[rows, i_cols, reduce] = choose_mlp_tiles(mk, rows, i_cols, cfg, options.double_buffer, reduce,
                                                            fits, fitting)
        return chosen[rows, i_cols, reduce]

    return tiles_for
