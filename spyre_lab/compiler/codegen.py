"""Codegen: one fused kernel -> a :class:`KernelSpec` (division, LX plan, per-core tile programs, SuperDSC).

``generate_kernel`` is where kernel planning comes together, in the order torch-spyre runs it:
work division picks each core's slice (:mod:`~spyre_lab.compiler.work_division`); the cores that then
need the same bytes of an operand at the same step form its DRAM broadcast group; tile sizes shrink
until a steady-state tile's buffers fit LX, placed by the scratchpad planner
(:mod:`~spyre_lab.compiler.scratchpad`); and every core gets its tile program
(:mod:`~spyre_lab.compiler.tiling_rows`, :mod:`~spyre_lab.compiler.tiling_matmul`,
:mod:`~spyre_lab.compiler.tiling_mlp`), the list of loads, PT/SFU ops, ring transfers and stores the
simulator runs. Inputs read through views are tiled by the node's iteration space, through the view's
strides (:func:`~spyre_lab.compiler.tiling_common.view_operand`). A scheduler weighing one fused kernel against
several prices each with :func:`~spyre_lab.compiler.fusion_cost.estimate_us`.
"""

from __future__ import annotations

from collections.abc import Mapping

from spyre_lab.compiler.codegen_attention import plan_attention
from spyre_lab.compiler.codegen_matmul import plan_matmul
from spyre_lab.compiler.codegen_mlp import plan_mlp
from spyre_lab.compiler.codegen_rows import plan_rows
from spyre_lab.compiler.ir import BufferInfo, NodeGroup
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.plan_memo import planned_once
from spyre_lab.compiler.rules import KNOWN_RULES, tiling_family
from spyre_lab.device.config import SpyreConfig

__all__ = ["KNOWN_RULES", "KernelSpec", "generate_kernel"]

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
    return planned_once(kernel, buffers, cfg, options, _plan_family)


def _plan_family(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
                 options: CompileOptions) -> KernelSpec:
    """Hand ``kernel`` to its tiling family's planner (the rules table says which family a rule's kernels use)."""
    return _PLANNERS[tiling_family(kernel)](kernel, buffers, cfg, options)

_PLANNERS = {"rows": plan_rows, "matmul": plan_matmul, "mlp": plan_mlp, "attention": plan_attention}
"""Tiling family (a column of the rules table) -> its planner."""
