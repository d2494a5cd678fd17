"""``cat`` in a row kernel as KTIR: each piece loaded and computed at its own extent, joined by ``tensor.concat``.

The compiler's cat reads each piece whole along the cat dim (the piece's axis there runs along no kernel dim)
and the nodes before the cat run over the piece's extent of that dim. The text does the same: each piece and
each node before the cat is written at its own extent of the dim, and ``tensor.concat`` joins the pieces in LX
(one SFU pass, as the compiler's cat node costs). When the plan splits or tiles the cat dim, a tile of the
output can fall inside one piece or straddle two: every core still loads the pieces whole (the cores of one
row share each load as one DRAM broadcast), joins them, and takes its own tile of the join at the tile's
offset with ``tensor.extract_slice`` (the join padded with zeros to the last tile's end, so a last short tile
reads inside it). The compiler's plan loads a piece whose axis runs along no kernel dim the same way, but a
piece whose axis does run along the cat dim at each core's own tile of it, unshared, so the text moves fewer
DRAM bytes than the plan charges (docs/ktir.md: up to 2% faster).
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


def piece_at(rows: RowWriter, b: str, at: dict[str, str]) -> dict[str, str]:
    """Where ``b``'s tile starts: a piece is read whole along the cat dim, from its first index."""
    if rows.pieces.dim is None or rows.pieces.of_buffer(rows, b) is None:
        return at
    return {**at, rows.pieces.dim: rows.w.index(0)}


def _padded_end(rows: RowWriter, d: str) -> int:
    """The end of the last tile any core takes along ``d`` (past the dim when the last tile runs short)."""
    t = rows.tile[d]
    return max(lo + -(-(hi - lo) // t) * t for lo, hi in (rows.spec.slices[c][d] for c in rows.busy))


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
    whole = rows.spec.dims[d]
    if sum(widths) != whole:
        raise KTIRUnsupported("export", 0, f"node {n.name} (cat): pieces {widths} do not fill {d} = {whole}")
    names = [a[0] for a in args]
    end = _padded_end(rows, d) if full[axis] < whole else whole
    if end > whole:     # zeros past the dim, so the last short tile's window stays inside the join
        pad = rows.w.fresh("cat_pad")
        widths.append(end - whole)
        rows.w.line(f"{pad} = arith.constant dense<0.0> : {type_text(_at(full, axis, end - whole), dtype)}")
        names.append(pad)
    types = [type_text(_at(full, axis, k), dtype) for k in widths]
    joined = type_text(_at(full, axis, end), dtype)
    out = rows.w.fresh(ident(n.output))
    rows.w.line(f"{out} = tensor.concat dim({axis}) {', '.join(names)} : ({', '.join(types)}) -> {joined}")
    if full[axis] == whole:
        return out, present
    tile = rows.w.fresh(f"{ident(n.output)}_tile")
    offsets = [rows.at[dim] if i == axis else "0" for i, dim in enumerate(rows.dims)]
    rows.w.line(f"{tile} = tensor.extract_slice {out}[{', '.join(offsets)}] [{', '.join(map(str, full))}] "
                f"[{', '.join('1' for _ in full)}] : {joined} to {type_text(full, dtype)}")
    return tile, present


def _at(shape: tuple[int, ...], axis: int, k: int) -> tuple[int, ...]:
    return (*shape[:axis], k, *shape[axis + 1:])
