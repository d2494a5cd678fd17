"""The attention family's planner: one Attention node -> a KernelSpec.

Heads and query rows go over the cores (row ranges balanced by the unmasked keys of a constant mask),
the tallest query tile that fits LX stays resident, and K/V tiles stream through it
(:mod:`~spyre_lab.compiler.tiling_attention`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from spyre_lab.compiler.ir import BufferInfo, InputView, MatMul, NodeGroup
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.spec_common import bundle_spec, fits_lx, itemsize, out_operand
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
from spyre_lab.compiler.tiling_common import Operand, view_operand
from spyre_lab.compiler.work_division import WorkDivision
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps


def plan_attention(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
                    options: CompileOptions) -> KernelSpec:
    """Heads and query rows over the cores, the tallest query tile that fits LX, K/V tiles streamed through it."""
    node = kernel.nodes[0]
    if len(kernel.nodes) != 1 or not isinstance(node, Attention):
        raise ValueError(f"kernel {kernel.name!r}: an attention kernel holds exactly one Attention node")
    d = node.dims
    item = itemsize(buffers[node.inputs[0]])
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
                                              fits_lx(cfg, options, kernel.name),
                                              max(s["M"][1] - s["M"][0] for s in slices if s),
                                              sum(1 for s in slices if s))
    division = WorkDivision(dict(splits), tuple(range(math.prod(splits.values()))), "attention", f"{why}; {tile_why}")
    programs = [emit_attention(shape, s["B"], s["M"], tq, tk, cfg, options.double_buffer) if s else CoreOps()
                for s in slices]
    operands: dict[str, Operand] = {}
    for i, r in enumerate(node_reads(node)):           # Q [B,M,K], K^T [B,K,N], V [B,N,E] (named as its matmul did)
        shape_b, item_b = tuple(buffers[r.buffer].shape), itemsize(buffers[r.buffer])
        axes = tuple({"K": "N", "N": "E"}.get(a, a) if i == 2 and a else a for a in r.axes)
        op = None
        if i < 3 and not r.is_identity:
            m = r.meta
            op = view_operand(r.buffer, InputView(tuple(m.shape), tuple(m.stride()), m.storage_offset(), axes), d,
                              item_b)
        elif i < 3 and len(axes) == len(shape_b):
            op = Operand(r.buffer, shape_b, axes, item_b)
        operands.setdefault(r.buffer, op or Operand(r.buffer, shape_b, (None,) * len(shape_b), item_b))
    operands[node.output] = out_operand(node.output, buffers, d, ("B", "M", "E"))
    bufs = attention_lx_buffers(shape, tq, tk, cfg, options.double_buffer)
    spec = bundle_spec(kernel, division, bufs, programs, slices, cfg, options, buffers, d,
                 {"B": 1, "M": tq, "N": tk, "K": d["K"], "E": d["E"]}, operands)
    spec.ops = [n.op for n in node.members]
    spec.units = {n.op: "pt" if isinstance(n, MatMul) else "sfp" for n in node.members}
    return spec
