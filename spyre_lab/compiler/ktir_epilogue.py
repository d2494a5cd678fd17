"""A matmul's pointwise epilogue as KTIR: the row writer's compute, run on the finished output tile.

The compiler runs the epilogue on each output tile while it is still in LX; the text does the same inside
the matmul's tile loops, after the accumulator is rounded (the compiler's matmul node gives the epilogue
its rounded values too): the epilogue's other inputs are loaded as ``[1, tm, tn]`` tiles of the output's
B x M x N space, its nodes are written as the row kernels' ``arith`` / ``math`` ops, and its DRAM outputs
are stored.
"""

from __future__ import annotations

from typing import Any

from spyre_lab.compiler.ktir_probe import buffer_types
from spyre_lab.compiler.ktir_rows import RowWriter
from spyre_lab.compiler.ktir_writer import type_text

MatmulWriter = Any  # compiler.ktir_matmul.MatmulWriter, which imports this module


def write_epilogue(mm: MatmulWriter, c: str, rounded: str, views: dict[str, str], at: dict[str, str],
                   tile: dict[str, int]) -> None:
    """Write ``mm``'s epilogue nodes on the output tile ``rounded`` (``c``'s value) at ``at``."""
    epilogue = mm.nodes[1:]
    rows = RowWriter(mm.spec, epilogue)
    rows.w, rows.ptr = mm.w, mm.ptr
    rows.dims = ["B", "M", "N"]
    rows.tile = {"B": 1, "M": tile["M"], "N": tile["N"]}
    rows.dtypes, rows.shapes = buffer_types(mm.spec, mm.nodes, mm.inputs)
    dtype = rows._dtype(c)
    full = (1, tile["M"], tile["N"])
    nd = mm.w.fresh("c_tile_3d")
    mm.w.line(f"{nd} = tensor.expand_shape {rounded} [[0, 1], [2]] output_shape {list(full)} : "
              f"{type_text(full[1:], dtype)} into {type_text(full, dtype)}")
    values = {c: (nd, (True, True, True))}
    produced = {n.output for n in mm.nodes}
    for n in epilogue:
        for b in n.inputs:
            if b not in values and b not in produced:
                values[b] = rows._load(b, views[b], at)
        values[n.output] = rows._node(n, values)
        if n.output in mm.outputs:
            rows._store(n.output, values[n.output], views[n.output], at)
