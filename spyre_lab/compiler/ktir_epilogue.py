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


def write_epilogue(mm: MatmulWriter, epilogue: list, rounded: dict[str, str], views: dict[str, str],
                   at: dict[str, str], tile: dict[str, int]) -> str:
    """Write ``epilogue`` (pointwise nodes) on the output tiles ``rounded`` (buffer -> its 2-D tile value) at
    ``at``; store its DRAM outputs and return the last node's value as a 2-D tile."""
    rows = RowWriter(mm.spec, epilogue)
    rows.w, rows.ptr = mm.w, mm.ptr
    rows.dims = ["B", "M", "N"]
    rows.tile = {"B": 1, "M": tile["M"], "N": tile["N"]}
    rows.dtypes, rows.shapes = buffer_types(mm.spec, mm.nodes, mm.inputs)
    full = (1, tile["M"], tile["N"])
    values = {}
    for c, value in rounded.items():
        dtype = rows._dtype(c)
        nd = mm.w.fresh("c_tile_3d")
        mm.w.line(f"{nd} = tensor.expand_shape {value} [[0, 1], [2]] output_shape {list(full)} : "
                  f"{type_text(full[1:], dtype)} into {type_text(full, dtype)}")
        values[c] = (nd, (True, True, True))
    produced = {n.output for n in mm.nodes}
    for n in epilogue:
        for b in n.inputs:
            if b not in values and b not in produced:
                values[b] = rows._load(b, views[b], at)
        values[n.output] = rows._node(n, values)
        if n.output in mm.outputs:
            rows._store(n.output, values[n.output], views[n.output], at)
    last = epilogue[-1].output
    name = rows._broadcast(values[last], (True, True, True), rows._dtype(last))
    return rows._reshape(name, full, full[1:], rows._dtype(last), f"{last}_2d")
