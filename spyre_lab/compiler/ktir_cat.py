"""``cat`` in a row kernel as KTIR: each piece loaded and computed at its own extent, joined by ``tensor.concat``.

The compiler's cat reads each piece whole along the cat dim (the piece's axis there runs along no kernel dim)
and the nodes before the cat run over the piece's extent of that dim. The text does the same: the cat dim
must be neither split across cores nor tiled (each core holds whole rows of it), each piece and each node
before the cat is written at its own extent of the dim, and ``tensor.concat`` joins the pieces in LX (one
SFU pass, as the compiler's cat node costs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from spyre_lab.compiler.ir import IRNode, Pointwise, Reduction
from spyre_lab.compiler.ktir_base import ident
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_probe import check_node
from spyre_lab.compiler.ktir_writer import type_text

RowWriter = Any  # compiler.ktir_rows.RowWriter, which imports this module


@dataclass
class Pieces:
    """The cat dim (None when the kernel has no cat) and each narrower node's extent of it."""

    dim: str | None = None
    nodes: dict[str, int] = field(default_factory=dict)      # node name -> its extent of the cat dim

    def of_node(self, n: IRNode) -> int | None:
        return self.nodes.get(n.name)

    def of_buffer(self, rows: RowWriter, b: str) -> int | None:
        if self.dim is None:
            return None
        sizes, _, _, axes = rows.view_of(b, rows.dims)
        k = sizes[axes.index(self.dim)] if self.dim in axes else None
        return k if k is not None and k < rows.spec.dims[self.dim] else None

    @contextlib.contextmanager
    def extent(self, rows: RowWriter, k: int | None) -> Iterator[None]:
        """Write what follows at extent ``k`` of the cat dim (the whole tile when ``k`` is None)."""
        if k is None or self.dim is None:
            yield
            return
        full = rows.tile[self.dim]
        rows.tile[self.dim] = k
        try:
            yield
        finally:
            rows.tile[self.dim] = full


def cat_pieces(rows: RowWriter) -> Pieces:
    """Find the cat dim from the nodes that run over less of it than the kernel; refuse any other mismatch."""
    spec, dims = rows.spec, rows.dims
    pieces = Pieces()
    cats = [n for n in rows.nodes if n.op == "cat"]
    for n in rows.nodes:
        if not isinstance(n, (Pointwise, Reduction)) or list(n.dims) != dims:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: node {n.name} ({n.op}) runs over "
                                               f"{dict(n.dims)}, not the kernel's {dict(spec.dims)}")
        off = [d for d in dims if n.dims[d] not in (1, spec.dims[d])]   # 1: a reduced (kept) dim
        if not off or not cats:       # without a cat, a narrower node reads through a clipped view (a slice)
            continue
        if not isinstance(n, Pointwise) or len(off) != 1 or pieces.dim not in (None, off[0]):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: node {n.name} ({n.op}) runs over "
                                               f"{dict(n.dims)}, less than the kernel's {dict(spec.dims)} on "
                                               f"{off} (only a cat's pieces may, on one dim)")
        pieces.dim = off[0]
        pieces.nodes[n.name] = n.dims[off[0]]
    for n in cats:
        for b in n.inputs:
            if b not in rows.inputs:
                continue
            op = spec.operands[b]
            loose = [i for i, (a, size) in enumerate(zip(op.axes, op.shape)) if a is None and size > 1]
            if len(loose) == 1:
                dim = pieces.dim or dims[loose[0] - (len(op.axes) - len(dims))]
                pieces.dim = dim
                rows.axis_fix[b] = tuple(dim if i == loose[0] else a for i, a in enumerate(op.axes))
    return pieces


def check_cat_dim(rows: RowWriter) -> None:
    d = rows.pieces.dim
    if d is not None and (rows.chunk[d] != rows.spec.dims[d] or rows.tile[d] != rows.spec.dims[d]):
        raise KTIRUnsupported("export", 0, f"kernel {rows.spec.name}: cat along {d}, which is split or tiled "
                                           "(a piece would straddle tiles)")


def write_cat(rows: RowWriter, n: IRNode, args: list, dtype: torch.dtype) -> tuple[str, tuple[bool, ...]]:
    """``tensor.concat`` of the pieces along the cat dim, each typed at its own extent."""
    d = rows.pieces.dim
    if d is None or len({a[1] for a in args}) != 1 or not all(a[1][rows.dims.index(d)] for a in args):
        raise KTIRUnsupported("export", 0, f"node {n.name} (cat): its pieces must share their dims and run along "
                                           "the cat dim")
    axis = rows.dims.index(d)
    check_node(n, lambda *xs: torch.cat(xs, dim=axis), rows._probes(n))
    present = args[0][1]
    full = rows._full(present)
    producers = {m.output: m for m in rows.nodes}
    widths = []
    for b in n.inputs:
        m = producers.get(b)
        widths.append((rows.pieces.of_node(m) if m is not None else rows.pieces.of_buffer(rows, b)) or full[axis])
    if sum(widths) != full[axis]:
        raise KTIRUnsupported("export", 0, f"node {n.name} (cat): pieces {widths} do not fill {d} = {full[axis]}")
    types = [type_text((*full[:axis], k, *full[axis + 1:]), dtype) for k in widths]
    out = rows.w.fresh(ident(n.output))
    rows.w.line(f"{out} = tensor.concat dim({axis}) {', '.join(a[0] for a in args)} : ({', '.join(types)}) -> "
                f"{type_text(full, dtype)}")
    return out, present
