"""KernelSpec -> KTIR: a planned kernel written as the real stack's Kernel Tile IR.

Work division is expressed through the tile id, as torch-spyre's emitter does: the function's grid is the
kernel's busy cores, ``ktdp.get_compute_tile_id`` gives each core its number, and an ``affine.apply``
turns it into the first index of the core's slice on every split dim. Each core then walks its slice in
the compiler's tiles with ``scf.for``, loads every DRAM operand through a memory view and an access tile,
runs the kernel's nodes as ``arith`` / ``math`` / ``linalg.reduce`` / ``linalg.matmul`` on tensors, and
stores the DRAM outputs. A last tile that runs past the tensor is clipped by the memory view's
coordinate set. Scalar operands the compiler folded into a node are recovered by evaluating the node
(``x * c`` at x = 1) and checked on random values; a kernel or op outside what this writer covers raises
:class:`~spyre_lab.ktir.errors.KTIRUnsupported` naming it, never a half-written kernel.

The writers, one idea each: :mod:`ktir_base` (header, tile-id division, views), :mod:`ktir_rows` (row kernels),
:mod:`ktir_matmul` (matmuls, K split folded with ``ktdp.inter_tile_produce`` / ``inter_tile_reduce``) and
:mod:`ktir_epilogue` (a matmul's pointwise epilogue on its output tile) and :mod:`ktir_attention` (fused attention's
online softmax over key tiles).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spyre_lab.compiler.ir import IRNode, MatMul
from spyre_lab.compiler.ktir_attention import AttentionWriter
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_matmul import MatmulWriter
from spyre_lab.compiler.ktir_mlp import MlpWriter
from spyre_lab.compiler.ktir_rows import RowWriter

KernelSpec = Any  # compiler.kernel_spec.KernelSpec; not imported, since kernel_spec.to_ktir imports this module


def kernel_to_ktir(spec: KernelSpec, nodes: Sequence[IRNode]) -> str:
    """The kernel as one KTIR ``func.func`` inside a module."""
    if not nodes:
        raise KTIRUnsupported("export", 0, f"kernel {spec.name}: pass the kernel's LoopIR nodes (program.kernels[i]"
                                           ".nodes); a KernelSpec alone does not hold its compute")
    matmuls = sum(isinstance(n, MatMul) for n in nodes)
    if spec.rule == "attention":
        body = AttentionWriter(spec, nodes)
    elif matmuls == 3 and spec.rule == "mlp":
        body = MlpWriter(spec, nodes)
    elif matmuls:
        body = MatmulWriter(spec, nodes)
    else:
        body = RowWriter(spec, nodes)
    return body.text()
