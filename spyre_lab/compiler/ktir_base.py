"""What every KTIR kernel writer shares: the function header, the tile-id work division, memory views.

A kernel's grid is its busy cores; ``ktdp.get_compute_tile_id`` gives each core its number and an
``affine.apply`` turns it into the first index of the core's slice on every split dim (checked against the
compiler's slices on every core). A read through a free view (transpose, expand, reshape) is its own
memory view over the base buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from spyre_lab.compiler.ir import IRNode
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_layout import stick_layout
from spyre_lab.compiler.ktir_writer import Writer

KernelSpec = Any  # compiler.kernel_spec.KernelSpec; not imported, since kernel_spec.to_ktir imports the writers


class KernelWriter:
    """One kernel's text: subclasses write ``body()`` between the header and ``return``."""

    def __init__(self, spec: KernelSpec, nodes: Sequence[IRNode]) -> None:
        self.spec, self.nodes, self.w = spec, list(nodes), Writer()
        produced = {n.output for n in nodes}
        self.inputs = [b for b in spec.address_slots if b not in produced]
        self.outputs = [b for b in spec.address_slots if b in produced]
        for b in self.outputs:
            if spec.operands[b].strides:
                raise KTIRUnsupported("export", 0, f"kernel {spec.name} writes {b} through a view; not written out yet")
        self.busy = [c for c, s in enumerate(spec.slices) if s] or zero_dim_core(spec)
        if not self.busy:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name} runs on no core (it moves no data); a KTIR "
                                               "grid needs at least one tile")
        if self.busy != list(range(len(self.busy))):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: busy cores {self.busy} are not 0..n-1")
        self.ptr = {b: self.w.fresh(ident(b)) for b in spec.address_slots}   # SSA names are defined once
        self.axis_fix: dict[str, tuple[str | None, ...]] = {}   # a cat piece's whole axis runs along the cat dim

    def view_of(self, b: str, order: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...], int, tuple[str, ...]]:
        """(sizes, strides, offset, axes) of ``b``'s memory view, its axes in the kernel's dim ``order``.

        A read through a free view (transpose, expand, reshape) is its own memory view: the view's strides
        over the base buffer, permuted so the loaded tile's dims follow the kernel's; size-1 axes drop out."""
        op = self.spec.operands[b]
        op_axes = self.axis_fix.get(b, op.axes)
        strides = list(op.strides)
        if not strides:
            acc = 1
            for n in reversed(op.shape):
                strides.insert(0, acc)
                acc *= n
        strides, offset = stick_layout(self.spec, b, strides, op.offset)   # whole 128-byte sticks per row
        axes = []
        for a, n, st in zip(op_axes, op.shape, strides):
            if a is None and n > 1:
                raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: {b} has an axis of {n} that runs along "
                                                   "no kernel dim")
            if a is not None:
                axes.append((order.index(a), a, n, st))
        if len({a for _, a, _, _ in axes}) != len(axes):
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: {b} runs two axes along one dim")
        axes.sort()
        if not axes:
            return (1,), (1,), offset, ()
        return (tuple(n for _, _, n, _ in axes), tuple(st for _, _, _, st in axes), offset,
                tuple(a for _, a, _, _ in axes))

    def make_view(self, b: str, dtype: torch.dtype, order: Sequence[str]) -> str:
        shape, strides, offset, _ = self.view_of(b, order)
        return self.w.memory_view(self.ptr[b], shape, dtype, ident(b), strides or (1,), offset)

    def header(self) -> list[str]:
        args = ", ".join(f"{self.ptr[b]}: index" for b in self.spec.address_slots)
        grid = f"attributes {{grid = [{len(self.busy)}]}}"
        return ["module {", f"  func.func @{ident(self.spec.name)}({args}) {grid} {{"]

    def text(self) -> str:
        self.body()
        self.w.line("return")
        return "\n".join([f"// {self.spec.name} ({self.spec.rule}): {' -> '.join(self.spec.ops)}",
                          f"// work division {dict(self.spec.division.splits)} on {len(self.busy)} cores; "
                          f"tiles {dict(self.spec.tiles)}", *self.header(), *self.w.lines, "  }", "}", ""])

    def slice_starts(self, dims: Sequence[str]) -> dict[str, str]:
        """Each dim's first index on this core, as an affine function of the tile id (checked on every core).

        The tile id counts the split dims in some order (the compiler may place a split reduction's
        partners next to each other): the first order that gives every core's slice is written, and
        ``self.maps[d] = (period, count, chunk)`` says how ``d``'s slice index runs along the tile id."""
        w = self.w
        tid = w.fresh("tile_id")
        w.line(f"{tid} = ktdp.get_compute_tile_id : index")
        chunk, count = {}, {}
        for d in dims:
            lows = sorted({self.spec.slices[c][d][0] for c in self.busy})
            chunk[d] = lows[1] - lows[0] if len(lows) > 1 else self.spec.dims[d]
            count[d] = len(lows)
        split = [d for d in dims if count[d] > 1]
        maps = next((m for order in itertools.permutations(split) if self._fits(m := self._maps(order, count, chunk))),
                    None)
        if maps is None:
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: the cores' slices of {split} are not an "
                                               "affine function of the tile id")
        starts = {}
        for d in dims:
            if d not in maps:
                starts[d] = w.index(0)
                continue
            p, s, q = maps[d]
            name = w.fresh(f"{d}_start")
            w.line(f"{name} = affine.apply affine_map<(t) -> (((t floordiv {p}) mod {s}) * {q})>({tid})")
            starts[d] = name
        self.chunk, self.maps, self.tile_id = chunk, maps, tid
        return starts

    @staticmethod
    def _maps(order: Sequence[str], count: dict[str, int], chunk: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        period, maps = 1, {}
        for d in reversed(list(order)):
            maps[d] = (period, count[d], chunk[d])
            period *= count[d]
        return maps

    def _fits(self, maps: dict[str, tuple[int, int, int]]) -> bool:
        for c in self.busy:
            for d, (p, s, q) in maps.items():
                lo, hi = self.spec.slices[c][d]
                if lo != (c // p) % s * q or hi != min(lo + q, self.spec.dims[d]):
                    return False
        return True

    def slice_end(self, name: str, d: str, start: str) -> None:
        """``name`` = the end of this core's slice of ``d``: clipped to the dim when the last slice is shorter."""
        n, q = self.spec.dims[d], self.chunk[d]
        if n % q:
            self.w.line(f"{name} = affine.min affine_map<(s) -> (s + {q}, {n})>({start})")
        else:
            self.w.line(f"{name} = arith.addi {start}, {self.w.index(q)} : index")

    def tile_size(self, d: str, ragged: bool = False) -> int:
        """The compiler's tile on ``d``, shrunk to a divisor of the core's chunk so tiles never cross slices.

        With ``ragged`` the compiler's tile stays when only the dim's last tile runs short (the memory view's
        coordinate set clips it, as the compiler pads that tile to whole sticks)."""
        q = self.chunk[d]
        t = max(1, min(self.spec.tiles.get(d, q), q))
        if ragged and all(self.spec.slices[c][d][0] % t == 0 and (self.spec.slices[c][d][1] % t == 0
                                                                   or self.spec.slices[c][d][1] == self.spec.dims[d])
                          for c in self.busy):
            return t
        while q % t:
            t -= 1
        return t


    def _reduce_partners(self, partial: str, acc_t: str, dim: str = "K", combiner: str = "arith.addf",
                         identity: str = "0.0") -> str:
        """The ``dim`` partners of this output tile fold their partials (``ktdp.inter_tile_produce`` /
        ``inter_tile_reduce``, through ``combiner`` from ``identity``: summed unless told); the partner with
        ``dim``'s first slice gets the total."""
        w = self.w
        p, s, _ = self.maps[dim]
        cores = len(self.busy)
        if p == 1:     # partners are consecutive tile ids: group g = i floordiv s
            members = f"i - {s} * g >= 0, -i + {s} * g + {s - 1} >= 0"
            first = f"i - {s} * g == 0"
            groups = cores // s
        elif p * s == cores:    # partners are p tile ids apart: group g = i mod p
            members = f"(i - g) mod {p} == 0, i - g >= 0, -i + g + {p * (s - 1)} >= 0"
            first = "i - g == 0"
            groups = p
        else:
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: {dim} partners {p} tile ids apart in groups "
                                               f"of {s} on {cores} cores are not one affine set")
        future = f"!ktdp.tile_future<{acc_t}, groups = affine_set<(g) : (g >= 0, -g + {groups - 1} >= 0)>>"
        fut, g = w.fresh("partials"), w.fresh("group")
        w.line(f"{fut} = ktdp.inter_tile_produce producer_tiles_per_group = affine_set<(i)[g] : ({members})>")
        w.line(f"    : {acc_t} -> {future} {{")
        w.line(f"  ^bb0({g}: index):")
        w.line(f"    ktdp.yield_partial {partial} : {acc_t}")
        w.line("}")
        zero, empty, ident_t = w.fresh("psum_zero"), w.fresh("psum_empty"), w.fresh("psum_identity")
        elem = acc_t[acc_t.rindex("x") + 1:-1]
        w.line(f"{zero} = arith.constant {identity} : {elem}")
        w.line(f"{empty} = tensor.empty() : {acc_t}")
        w.line(f"{ident_t} = linalg.fill ins({zero} : {elem}) outs({empty} : {acc_t}) -> {acc_t}")
        total, lhs, rhs, s_ = w.fresh("total"), w.fresh("lhs"), w.fresh("rhs"), w.fresh("psum")
        w.line(f"{total} = ktdp.inter_tile_reduce({fut}) consumer_tiles_per_group = affine_set<(i)[g] : ({first})>, "
               f"identity({ident_t} : {acc_t})")
        w.line(f"    : {future} -> {acc_t} {{")
        w.line(f"  ^bb0({lhs}: {acc_t}, {rhs}: {acc_t}):")
        w.line(f"    {s_} = {combiner} {lhs}, {rhs} : {acc_t}")
        w.line(f"    ktdp.yield_reduced {s_} : {acc_t}")
        w.line("}")
        return total

def zero_dim_core(spec: KernelSpec) -> list[int]:
    """A kernel over no dims (``total + 1`` on a 0-d sum) still reads and writes its one element: one core does it.

    The compiler's plan lists no busy core for it (its one slice is the empty dict), so its modeled time is the
    launch alone; the text runs it on tile 0, as the real stack must (docs/ktir.md)."""
    return [0] if not spec.dims and spec.slices else []


def collapse_groups(present: tuple[bool, ...]) -> str:
    """Reassociation between the full-rank form and the present dims (size-1 dims join a neighbour)."""
    keep = [i for i, p in enumerate(present) if p]
    if not keep:
        return "[]"
    groups: list[list[int]] = [[] for _ in keep]
    k = 0
    for i in range(len(present)):
        groups[k].append(i)
        if present[i] and k < len(keep) - 1 and i >= keep[k]:
            k += 1
    return str(groups).replace(" ", "").replace(",", ", ")


def ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"v{out}"


def float_text(c: float) -> str:
    text = repr(float(c))
    return text if "e" in text or "." in text else text + ".0"
