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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from spyre_lab.compiler.ir import IRNode, MatMul, Pointwise, Reduction
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_probe import (
    buffer_types,
    check_node,
    probe,
    same_values,
    scalar_of,
    torch_binary,
    torch_unary,
)
from spyre_lab.compiler.ktir_writer import NAMES, Writer, type_text

KernelSpec = Any  # compiler.kernel_spec.KernelSpec; not imported, since kernel_spec.to_ktir imports this module
BINARY = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
          "maximum": "arith.maximumf", "minimum": "arith.minimumf"}
UNARY = {"exp": ["math.exp"], "log": ["math.log"], "sqrt": ["math.sqrt"], "rsqrt": ["math.rsqrt"],
         "tanh": ["math.tanh"], "neg": ["arith.negf"], "abs": ["math.absf"], "erf": ["math.erf"],
         "copy": [], "restickify": []}
REDUCE = {"sum": "arith.addf", "mean": "arith.addf", "amax": "arith.maximumf", "amin": "arith.minimumf"}
REDUCE_INIT = {"sum": "0.0", "mean": "0.0", "amax": "0xFC00", "amin": "0x7C00"}


def kernel_to_ktir(spec: KernelSpec, nodes: Sequence[IRNode]) -> str:
    """The kernel as one KTIR ``func.func`` inside a module."""
    if not nodes:
        raise KTIRUnsupported("export", 0, f"kernel {spec.name}: pass the kernel's LoopIR nodes (program.kernels[i]"
                                           ".nodes); a KernelSpec alone does not hold its compute")
    if any(isinstance(n, MatMul) for n in nodes):
        body = _MatmulWriter(spec, nodes)
    else:
        body = _RowWriter(spec, nodes)
    return body.text()


class _Base:
    def __init__(self, spec: KernelSpec, nodes: Sequence[IRNode]) -> None:
        self.spec, self.nodes, self.w = spec, list(nodes), Writer()
        produced = {n.output for n in nodes}
        self.inputs = [b for b in spec.address_slots if b not in produced]
        self.outputs = [b for b in spec.address_slots if b in produced]
        for b in self.outputs:
            if spec.operands[b].strides:
                raise KTIRUnsupported("export", 0, f"kernel {spec.name} writes {b} through a view; not written out yet")
        self.busy = [c for c, s in enumerate(spec.slices) if s]
        if self.busy != list(range(len(self.busy))):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: busy cores {self.busy} are not 0..n-1")
        self.ptr = {b: self.w.fresh(_ident(b)) for b in spec.address_slots}   # SSA names are defined once

    def view_of(self, b: str, order: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...], int, tuple[str, ...]]:
        """(sizes, strides, offset, axes) of ``b``'s memory view, its axes in the kernel's dim ``order``.

        A read through a free view (transpose, expand, reshape) is its own memory view: the view's strides
        over the base buffer, permuted so the loaded tile's dims follow the kernel's; size-1 axes drop out."""
        op = self.spec.operands[b]
        strides = list(op.strides)
        if not strides:
            acc = 1
            for n in reversed(op.shape):
                strides.insert(0, acc)
                acc *= n
        axes = []
        for a, n, st in zip(op.axes, op.shape, strides):
            if a is None and n > 1:
                raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: {b} has an axis of {n} that runs along "
                                                   "no kernel dim")
            if a is not None:
                axes.append((order.index(a), a, n, st))
        if len({a for _, a, _, _ in axes}) != len(axes):
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: {b} runs two axes along one dim")
        axes.sort()
        if not axes:
            return (1,), (1,), op.offset, ()
        return (tuple(n for _, _, n, _ in axes), tuple(st for _, _, _, st in axes), op.offset,
                tuple(a for _, a, _, _ in axes))

    def make_view(self, b: str, dtype: torch.dtype, order: Sequence[str]) -> str:
        shape, strides, offset, _ = self.view_of(b, order)
        return self.w.memory_view(self.ptr[b], shape, dtype, _ident(b), strides or (1,), offset)

    def header(self) -> list[str]:
        args = ", ".join(f"{self.ptr[b]}: index" for b in self.spec.address_slots)
        grid = f"attributes {{grid = [{len(self.busy)}]}}"
        return ["module {", f"  func.func @{_ident(self.spec.name)}({args}) {grid} {{"]

    def text(self) -> str:
        self.body()
        self.w.line("return")
        return "\n".join([f"// {self.spec.name} ({self.spec.rule}): {' -> '.join(self.spec.ops)}",
                          f"// work division {dict(self.spec.division.splits)} on {len(self.busy)} cores; "
                          f"tiles {dict(self.spec.tiles)}", *self.header(), *self.w.lines, "  }", "}", ""])

    def slice_starts(self, dims: Sequence[str]) -> dict[str, str]:
        """Each dim's first index on this core, as an affine function of the tile id (checked on every core)."""
        w = self.w
        tid = w.fresh("tile_id")
        w.line(f"{tid} = ktdp.get_compute_tile_id : index")
        chunk, count = {}, {}
        for d in dims:
            lows = sorted({self.spec.slices[c][d][0] for c in self.busy})
            chunk[d] = lows[1] - lows[0] if len(lows) > 1 else self.spec.dims[d]
            count[d] = len(lows)
        period, starts = 1, {}
        maps = {}
        for d in reversed(list(dims)):
            maps[d] = (period, count[d], chunk[d])
            period *= count[d]
        for c in self.busy:
            for d in dims:
                p, s, q = maps[d]
                lo, hi = self.spec.slices[c][d]
                if lo != (c // p) % s * q or hi != min(lo + q, self.spec.dims[d]):
                    raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: core {c}'s slice of {d} "
                                                       f"[{lo}, {hi}) is not an affine function of its tile id")
        for d in dims:
            p, s, q = maps[d]
            if s == 1:
                starts[d] = w.index(0)
                continue
            name = w.fresh(f"{d}_start")
            w.line(f"{name} = affine.apply affine_map<(t) -> (((t floordiv {p}) mod {s}) * {q})>({tid})")
            starts[d] = name
        self.chunk = chunk
        return starts

    def tile_size(self, d: str) -> int:
        """The compiler's tile on ``d``, shrunk to a divisor of the core's chunk so tiles never cross slices."""
        q = self.chunk[d]
        t = max(1, min(self.spec.tiles.get(d, q), q))
        while q % t:
            t -= 1
        return t


class _RowWriter(_Base):
    """Pointwise, reduction, softmax and norm kernels: every node over the kernel's dims, reductions innermost."""

    def body(self) -> None:
        spec, w = self.spec, self.w
        self.dims = list(spec.dims)
        for n in self.nodes:
            if not isinstance(n, (Pointwise, Reduction)) or list(n.dims) != self.dims:
                raise KTIRUnsupported("export", 0, f"kernel {spec.name}: node {n.name} ({n.op}) runs over "
                                                   f"{dict(n.dims)}, not the kernel's {dict(spec.dims)}")
        self.dtypes, self.shapes = buffer_types(spec, self.nodes, self.inputs)
        reduced = {d for n in self.nodes if isinstance(n, Reduction) for d in n.reduction_dims}
        starts = self.slice_starts(self.dims)
        tile = {d: spec.dims[d] if d in reduced else self.tile_size(d) for d in self.dims}
        if any(self.chunk[d] != spec.dims[d] for d in reduced):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name} splits a reduced dim across cores; the "
                                               "partial results would meet over the ring (not written out yet)")
        views = {b: self.make_view(b, self._dtype(b), self.dims) for b in [*self.inputs, *self.outputs]}
        loops = [d for d in self.dims if tile[d] < self.chunk[d]]
        at = dict(starts)
        for d in loops:
            iv, hi, step = w.fresh(f"{d}_i"), w.fresh(f"{d}_end"), w.index(tile[d])
            w.line(f"{hi} = arith.addi {starts[d]}, {w.index(self.chunk[d])} : index")
            w.line(f"scf.for {iv} = {starts[d]} to {hi} step {step} {{")
            w.depth += 1
            at[d] = iv
        self.tile = tile
        values: dict[str, tuple[str, tuple[bool, ...]]] = {}
        for b in self.inputs:
            values[b] = self._load(b, views[b], at)
        for n in self.nodes:
            values[n.output] = self._node(n, values)
            if n.output in self.outputs:
                self._store(n.output, values[n.output], views[n.output], at)
        for _ in loops:
            w.line("scf.yield")
            w.depth -= 1
            w.line("}")

    # --- buffers ---------------------------------------------------------------------------------
    def _shape(self, b: str) -> tuple[int, ...]:
        return self.view_of(b, self.dims)[0]

    def _dtype(self, b: str) -> torch.dtype:
        dtype = self.dtypes[b]
        if dtype not in NAMES or not dtype.is_floating_point:
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: {b} is {dtype}; floats only")
        return dtype

    def _axes(self, b: str) -> tuple[str, ...]:
        return self.view_of(b, self.dims)[3]

    def _full(self, present: tuple[bool, ...]) -> tuple[int, ...]:
        return tuple(self.tile[d] if p else 1 for d, p in zip(self.dims, present))

    def _access(self, b: str, view: str, at: dict[str, str]) -> tuple[Writer, torch.dtype, list[int], str]:
        """``b``'s tile at ``at`` as an access tile of its memory view: (writer, dtype, tile shape, access)."""
        w, dtype, axes, shape = self.w, self._dtype(b), self._axes(b), self._shape(b)
        tile = [self.tile[a] for a in axes] or [1]
        idx = [at[a] for a in axes] or [w.index(0)]
        return w, dtype, tile, w.access(view, shape or (1,), dtype, idx, tile, _ident(b))

    def _load(self, b: str, view: str, at: dict[str, str]) -> tuple[str, tuple[bool, ...]]:
        w, dtype, tile, acc = self._access(b, view, at)
        name = w.fresh(_ident(b))
        w.line(f"{name} = ktdp.load {acc} : {w.tile_type(tile)} -> {type_text(tuple(tile), dtype)}")
        present = tuple(d in self._axes(b) for d in self.dims)
        full = self._full(present)
        if tuple(tile) != full:
            out = w.fresh(f"{_ident(b)}_nd")
            w.line(f"{out} = tensor.expand_shape {name} [[{', '.join(str(i) for i in range(len(full)))}]] "
                   f"output_shape {list(full)} : {type_text(tuple(tile), dtype)} into {type_text(full, dtype)}")
            name = out
        return name, present

    def _store(self, b: str, value: tuple[str, tuple[bool, ...]], view: str, at: dict[str, str]) -> None:
        name, present = value
        w, dtype, tile, acc = self._access(b, view, at)
        full = self._full(present)
        if tuple(tile) != full:
            flat = w.fresh(f"{_ident(b)}_flat")
            w.line(f"{flat} = tensor.collapse_shape {name} [[{', '.join(str(i) for i in range(len(full)))}]] : "
                   f"{type_text(full, dtype)} into {type_text(tuple(tile), dtype)}")
            name = flat
        w.line(f"ktdp.store {name}, {acc} : {type_text(tuple(tile), dtype)}, {w.tile_type(tile)}")

    # --- compute ---------------------------------------------------------------------------------
    def _node(self, n: IRNode, values: dict) -> tuple[str, tuple[bool, ...]]:
        dtype = self._dtype(n.output)
        args = [values[b] for b in n.inputs]
        if isinstance(n, Reduction):
            return self._reduce(n, args[0], dtype)
        if n.op in UNARY and len(args) == 1:
            value = args[0]
            for opname in UNARY[n.op]:
                value = self._emit(opname, [value], dtype, n)
            if UNARY[n.op]:  # a copy moves values through views the memory views already spell out
                check_node(n, lambda x: torch_unary(n.op, x), self._probes(n))
            return value
        if n.op == "cast" and len(args) == 1:
            return self._cast(n, args[0], dtype)
        if n.op == "pow" and len(args) == 1:
            return self._pow(n, args[0], dtype)
        if n.op in ("sigmoid", "silu"):
            return self._sigmoid(n, args[0], dtype)
        if n.op in BINARY and len(args) == 2:
            check_node(n, lambda x, y: torch_binary(n.op, x, y), self._probes(n))
            return self._emit(BINARY[n.op], args, dtype, n)
        if n.op in BINARY and len(args) == 1:
            c, swapped = scalar_of(n, self._probes(n)[0])
            k = self._splat(c, args[0][1], dtype)
            return self._emit(BINARY[n.op], [k, args[0]] if swapped else [args[0], k], dtype, n)
        raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: op {n.op} with {len(args)} tensor inputs is "
                                           "not written out yet")

    def _probes(self, n: IRNode) -> list[torch.Tensor]:
        """Random values in [0.5, 1.5) shaped and typed like the node's inputs, to check what it computes."""
        g = torch.Generator().manual_seed(len(self.w.lines))
        return [(torch.rand(self.shapes[b], generator=g) + 0.5).to(self.dtypes[b]) for b in n.inputs]

    def _splat(self, c: float, present: tuple[bool, ...], dtype: torch.dtype) -> tuple[str, tuple[bool, ...]]:
        w = self.w
        s, t = w.fresh("cst"), w.fresh("cst_t")
        w.line(f"{s} = arith.constant {_float(c)} : {NAMES[dtype]}")
        w.line(f"{t} = tensor.splat {s} : {type_text(self._full(present), dtype)}")
        return t, present

    def _emit(self, opname: str, args: list, dtype: torch.dtype, n: IRNode) -> tuple[str, tuple[bool, ...]]:
        present = tuple(any(a[1][i] for a in args) for i in range(len(self.dims)))
        full = self._full(present)
        names = [self._broadcast(a, present, dtype) for a in args]
        out = self.w.fresh(_ident(n.output))
        self.w.line(f"{out} = {opname} {', '.join(names)} : {type_text(full, dtype)}")
        return out, present

    def _broadcast(self, value: tuple[str, tuple[bool, ...]], present: tuple[bool, ...], dtype: torch.dtype) -> str:
        name, have = value
        if have == present:
            return name
        w = self.w
        src = tuple(self.tile[d] for d, h in zip(self.dims, have) if h)
        flat = w.fresh(f"{name[1:]}_c")
        groups = _collapse_groups(have)
        w.line(f"{flat} = tensor.collapse_shape {name} {groups} : {type_text(self._full(have), dtype)} into "
               f"{type_text(src, dtype)}")
        init, out = w.fresh("bcast_init"), w.fresh(f"{name[1:]}_b")
        full = self._full(present)
        w.line(f"{init} = tensor.empty() : {type_text(full, dtype)}")
        added = [i for i, h in enumerate(have) if not h]
        w.line(f"{out} = linalg.broadcast ins({flat} : {type_text(src, dtype)}) outs({init} : "
               f"{type_text(full, dtype)}) dimensions = {added}")
        return out

    def _reduce(self, n: Reduction, arg: tuple[str, tuple[bool, ...]], dtype: torch.dtype):
        if n.op not in REDUCE:
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: reduction {n.op} is not written out yet")
        w = self.w
        name, have = arg
        red = [i for i, d in enumerate(self.dims) if d in n.reduction_dims]
        kept = tuple(h and i not in red for i, h in enumerate(have))
        full_in = self._full(have)
        out_shape = tuple(full_in[i] for i in range(len(self.dims)) if i not in red)
        init_s, init = w.fresh("init"), w.fresh("init_t")
        w.line(f"{init_s} = arith.constant {REDUCE_INIT[n.op]} : {NAMES[dtype]}")
        w.line(f"{init} = tensor.splat {init_s} : {type_text(out_shape, dtype)}")
        r = w.fresh(_ident(n.output))
        w.line(f"{r} = linalg.reduce {{ {REDUCE[n.op]} }} ins({name} : {type_text(full_in, dtype)}) "
               f"outs({init} : {type_text(out_shape, dtype)}) dimensions = {red}")
        full = self._full(kept)
        nd = w.fresh(f"{_ident(n.output)}_nd")
        groups = _collapse_groups(tuple(i not in red for i in range(len(self.dims))))
        w.line(f"{nd} = tensor.expand_shape {r} {groups} output_shape {list(full)} : "
               f"{type_text(out_shape, dtype)} into {type_text(full, dtype)}")
        value = (nd, kept)
        if n.op == "mean":
            count = math.prod(self.spec.dims[d] for d in n.reduction_dims)
            value = self._emit("arith.divf", [value, self._splat(float(count), kept, dtype)], dtype, n)
        return value

    def _cast(self, n: IRNode, arg, dtype):
        src = self._dtype(n.inputs[0])
        if src == dtype:
            return arg
        check_node(n, lambda x: x.to(dtype), self._probes(n))
        name, present = arg
        full = self._full(present)
        out = self.w.fresh(_ident(n.output))
        op = "arith.extf" if src.itemsize < dtype.itemsize else "arith.truncf"
        self.w.line(f"{out} = {op} {name} : {type_text(full, src)} to {type_text(full, dtype)}")
        return out, present

    def _pow(self, n: IRNode, arg, dtype):
        x = self._probes(n)[0]
        two = float(probe(n, torch.full_like(x, 2.0)).flatten()[0])
        c = math.log2(two) if two > 0 else float("nan")
        if not (c == c and same_values(probe(n, x), x.float().pow(round(c, 6)))):
            raise KTIRUnsupported("export", 0, f"node {n.name} (pow) is not x ** c")
        if round(c, 6) == 2.0:
            return self._emit("arith.mulf", [arg, arg], dtype, n)
        return self._emit("math.powf", [arg, self._splat(round(c, 6), arg[1], dtype)], dtype, n)

    def _sigmoid(self, n: IRNode, arg, dtype):
        """sigmoid(x) = 1 / (1 + exp(-x)); silu(x) = x * sigmoid(x)."""
        neg = self._emit("arith.negf", [arg], dtype, n)
        e = self._emit("math.exp", [neg], dtype, n)
        one = self._splat(1.0, arg[1], dtype)
        den = self._emit("arith.addf", [one, e], dtype, n)
        if n.op == "sigmoid":
            return self._emit("arith.divf", [one, den], dtype, n)
        return self._emit("arith.divf", [arg, den], dtype, n)


class _MatmulWriter(_Base):
    """``C[m,n] = A[m,k] @ B[k,n]`` per core slice of M and N, tiles walked with an accumulator over K."""

    def body(self) -> None:
        spec, w = self.spec, self.w
        if len(self.nodes) != 1 or not isinstance(self.nodes[0], MatMul):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name} ({spec.rule}): a matmul with fused epilogue "
                                               "ops is not written out yet")
        node = self.nodes[0]
        if spec.dims.get("B", 1) != 1 or spec.division.splits.get("K", 1) > 1:
            raise KTIRUnsupported("export", 0, f"kernel {spec.name}: batched matmuls and K split across cores "
                                               "(partial sums over the ring) are not written out yet")
        a, b = node.inputs
        c = node.output
        for buf, axes in ((a, ("M", "K")), (b, ("K", "N")), (c, ("M", "N"))):
            if tuple(spec.operands[buf].axes) != axes:
                raise KTIRUnsupported("export", 0, f"kernel {spec.name}: {buf} has axes "
                                                   f"{spec.operands[buf].axes}, expected {axes}")
        dims = ("M", "N", "K")
        starts = self.slice_starts(dims)
        tm, tn = self.tile_size("M"), self.tile_size("N")
        tk = max(1, min(spec.tiles.get("K", spec.dims["K"]), spec.dims["K"]))
        dt = spec.buffers[c].dtype
        views = {x: self.make_view(x, spec.buffers[x].dtype, ("B", "M", "K", "N")) for x in (a, b, c)}
        shape = {x: self.view_of(x, ("B", "M", "K", "N"))[0] for x in (a, b, c)}
        mi, ni = w.fresh("m_i"), w.fresh("n_i")
        m_end, n_end = w.fresh("m_end"), w.fresh("n_end")
        w.line(f"{m_end} = arith.addi {starts['M']}, {w.index(self.chunk['M'])} : index")
        w.line(f"{n_end} = arith.addi {starts['N']}, {w.index(self.chunk['N'])} : index")
        zero, acc0 = w.fresh("zero"), w.fresh("acc0")
        w.line(f"{zero} = arith.constant 0.0 : f32")
        k0, k_end = w.index(0), w.index(spec.dims["K"])
        w.line(f"scf.for {mi} = {starts['M']} to {m_end} step {w.index(tm)} {{")
        w.depth += 1
        w.line(f"scf.for {ni} = {starts['N']} to {n_end} step {w.index(tn)} {{")
        w.depth += 1
        acc_t = type_text((tm, tn), torch.float32)
        w.line(f"{acc0} = tensor.splat {zero} : {acc_t}")
        ki, acc, out = w.fresh("k_i"), w.fresh("acc"), w.fresh("acc_out")
        w.line(f"{out} = scf.for {ki} = {k0} to {k_end} step {w.index(tk)} iter_args({acc} = {acc0}) -> ({acc_t}) {{")
        w.depth += 1
        ta = w.access(views[a], shape[a], spec.buffers[a].dtype, [mi, ki], [tm, tk], _ident(a))
        tb = w.access(views[b], shape[b], spec.buffers[b].dtype, [ki, ni], [tk, tn], _ident(b))
        va, vb, mm = w.fresh(_ident(a)), w.fresh(_ident(b)), w.fresh("partial")
        w.line(f"{va} = ktdp.load {ta} : {w.tile_type([tm, tk])} -> {type_text((tm, tk), spec.buffers[a].dtype)}")
        w.line(f"{vb} = ktdp.load {tb} : {w.tile_type([tk, tn])} -> {type_text((tk, tn), spec.buffers[b].dtype)}")
        w.line(f"{mm} = linalg.matmul ins({va}, {vb} : {type_text((tm, tk), spec.buffers[a].dtype)}, "
               f"{type_text((tk, tn), spec.buffers[b].dtype)}) outs({acc} : {acc_t}) -> {acc_t}")
        w.line(f"scf.yield {mm} : {acc_t}")
        w.depth -= 1
        w.line("}")
        res = w.fresh(_ident(c))
        w.line(f"{res} = arith.truncf {out} : {acc_t} to {type_text((tm, tn), dt)}")
        tc = w.access(views[c], shape[c], dt, [mi, ni], [tm, tn], _ident(c))
        w.line(f"ktdp.store {res}, {tc} : {type_text((tm, tn), dt)}, {w.tile_type([tm, tn])}")
        for _ in range(2):
            w.line("scf.yield")
            w.depth -= 1
            w.line("}")


def _collapse_groups(present: tuple[bool, ...]) -> str:
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


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"v{out}"


def _float(c: float) -> str:
    text = repr(float(c))
    return text if "e" in text or "." in text else text + ".0"
