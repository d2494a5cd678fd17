"""Row kernels as KTIR: pointwise chains, reductions, softmax and norms over the kernel's dims.

Each core walks its slice in the compiler's tiles with ``scf.for``, loads every DRAM operand through a
memory view and an access tile, runs the kernel's nodes as ``arith`` / ``math`` / ``linalg.reduce`` on
tensors (reductions innermost), and stores the DRAM outputs. Scalar operands the compiler folded into a
node are recovered by evaluating the node (``x * c`` at x = 1) and checked on random values.
"""

from __future__ import annotations

import math

import torch

from spyre_lab.compiler.ir import IRNode, Reduction
from spyre_lab.compiler.ktir_base import KernelWriter, collapse_groups, float_text, ident
from spyre_lab.compiler.ktir_cat import cat_pieces, piece_at, write_cat
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.ktir_layout import loop_end
from spyre_lab.compiler.ktir_probe import (
    buffer_types,
    check_node,
    clamp_bounds,
    probe,
    same_values,
    scalar_of,
    threshold,
    torch_binary,
    torch_unary,
)
from spyre_lab.compiler.ktir_writer import NAMES, Writer, type_text

BINARY = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
          "maximum": "arith.maximumf", "minimum": "arith.minimumf"}
UNARY = {"exp": ["math.exp"], "log": ["math.log"], "sqrt": ["math.sqrt"], "rsqrt": ["math.rsqrt"],
         "tanh": ["math.tanh"], "neg": ["arith.negf"], "abs": ["math.absf"], "erf": ["math.erf"],
         "copy": [], "restickify": []}
COMPARE = {"gt": "ogt", "lt": "olt", "ge": "oge", "le": "ole", "eq": "oeq", "ne": "une"}
REDUCE = {"sum": "arith.addf", "mean": "arith.addf", "amax": "arith.maximumf", "amin": "arith.minimumf"}
INFINITY_BITS = {torch.float16: ("0xFC00", "0x7C00"), torch.float32: ("0xFF800000", "0x7F800000")}


def reduce_init(kind: str, dtype: torch.dtype) -> str:
    """The reduction's identity as a constant of ``dtype``: 0.0, or -inf / +inf as the dtype's bit pattern."""
    if kind not in ("amax", "amin"):
        return "0.0"
    if dtype not in INFINITY_BITS:
        raise KTIRUnsupported("export", 0, f"{kind} over {dtype}: its -inf / +inf identity is written for f16 and "
                                           "f32 only")
    return INFINITY_BITS[dtype][kind == "amin"]


class RowWriter(KernelWriter):
    """Pointwise, reduction, softmax and norm kernels: every node over the kernel's dims, reductions innermost."""

    def body(self) -> None:
        spec, w = self.spec, self.w
        self.dims = list(spec.dims)
        self.pieces = cat_pieces(self)
        self.dtypes, self.shapes = buffer_types(spec, self.nodes, self.inputs)
        reduced = {d for n in self.nodes if isinstance(n, Reduction) for d in n.reduction_dims}
        starts = self.slice_starts(self.dims)
        tile = {d: spec.dims[d] if d in reduced else self.tile_size(d) for d in self.dims}
        split = [d for d in reduced if self.chunk[d] != spec.dims[d]]
        if split and not (len(self.nodes) == 1 and isinstance(self.nodes[0], Reduction) and len(split) == 1
                          and self.nodes[0].op in REDUCE and self.outputs == [self.nodes[0].output]):
            raise KTIRUnsupported("export", 0, f"kernel {spec.name} splits a reduced dim across cores; the "
                                               "partial results would meet over the ring (written for one sum, "
                                               "mean, amax or amin alone, not yet here)")
        for d in split:            # each core reduces its own slice; the partners' partials meet below
            tile[d] = self.chunk[d]
        ends = self._plan_tiles(tile, reduced, starts)
        views = {b: self._view(b, ends) for b in [*self.inputs, *self.outputs]}
        loops = [d for d in self.dims if tile[d] < self.chunk[d]]
        at = dict(starts)
        self.tile = tile
        values: dict[str, tuple[str, tuple[bool, ...]]] = {}
        for b in self._resident(loops, reduced):     # loaded once per core and kept in LX, as the plan does
            with self.pieces.extent(self, self.pieces.of_buffer(self, b)):
                values[b] = self._load(b, views[b], piece_at(self, b, at))
        for d in loops:
            iv, step = w.fresh(f"{d}_i"), w.index(tile[d])
            hi = ends.get(d) or w.fresh(f"{d}_end")
            if d not in ends:
                self.slice_end(hi, d, starts[d])
            w.line(f"scf.for {iv} = {starts[d]} to {hi} step {step} {{")
            w.depth += 1
            at[d] = iv
        self.at = at
        for b in self.inputs:
            if b in values:
                continue
            with self.pieces.extent(self, self.pieces.of_buffer(self, b)):
                values[b] = self._load(b, views[b], piece_at(self, b, at))
        for n in self.nodes:
            with self.pieces.extent(self, self.pieces.of_node(n)):
                values[n.output] = self._node(n, values)
            if n.output in self.outputs and split:
                self._store_total(n.output, values[n.output], views[n.output], at, split[0], starts[split[0]])
            elif n.output in self.outputs:
                self._store(n.output, values[n.output], views[n.output], at)
        for _ in loops:
            w.line("scf.yield")
            w.depth -= 1
            w.line(loop_end(spec))

    def _store_total(self, b: str, value: tuple[str, tuple[bool, ...]], view: str, at: dict[str, str], d: str,
                     start: str) -> None:
        """A reduction split along ``d``: the partners of one output tile fold their partials (sums, each already
        divided by the full count for a mean; or maxima / minima), and the partner with ``d``'s first slice alone
        stores."""
        w = self.w
        name, present = value
        kind = self.nodes[0].op
        total = self._reduce_partners(name, type_text(self._full(present), self._dtype(b)), d, REDUCE[kind],
                                      reduce_init(kind, self._dtype(b)))
        first = w.fresh(f"{d}_first")
        w.line(f"{first} = arith.cmpi eq, {start}, {w.index(0)} : index")
        w.line(f"scf.if {first} {{")
        w.depth += 1
        self._store(b, (total, present), view, at)
        w.line("scf.yield")
        w.depth -= 1
        w.line("}")

    # --- buffers ---------------------------------------------------------------------------------
    def _plan_tiles(self, tile: dict[str, int], reduced: set[str], starts: dict[str, str]) -> dict[str, str]:
        """The compiler's own tile on each dim whose core slices it does not divide (its last tile of a slice runs
        short); returns those dims' slice ends, where the memory views stop so that last tile is clipped."""
        ends = {}
        for d in self.dims:
            plan = max(1, min(self.spec.tiles.get(d, self.chunk[d]), self.chunk[d]))
            if d in reduced or plan == tile[d] or self.chunk[d] % plan == 0:
                continue
            tile[d], ends[d] = plan, self.w.fresh(f"{d}_end")
            self.slice_end(ends[d], d, starts[d])
        return ends

    def _view(self, b: str, ends: dict[str, str]) -> str:
        """``b``'s memory view; on a dim in ``ends`` its size is this core's slice end (an index value)."""
        shape, strides, offset, axes = self.view_of(b, self.dims)
        if not set(axes) & set(ends):
            return self.make_view(b, self._dtype(b), self.dims)
        sizes = [ends.get(a, n) for a, n in zip(axes, shape)]
        return self.w.memory_view(self.ptr[b], shape, self._dtype(b), ident(b), strides or (1,), offset, sizes)

    def _resident(self, loops: list[str], reduced: set[str]) -> list[str]:
        """Inputs that run along no row dim (a weight row, a scalar: only the innermost and reduced dims) while the
        innermost dim stays whole in a tile: the compiler's plan loads them once per core."""
        if not self.dims or self.dims[-1] in loops:
            return []
        cols = {self.dims[-1], *reduced}
        return [b for b in self.inputs if set(self._axes(b)) <= cols]

    def _shape(self, b: str) -> tuple[int, ...]:
        return self.view_of(b, self.dims)[0]

    def _dtype(self, b: str) -> torch.dtype:
        dtype = self.dtypes[b]
        if dtype not in NAMES or not (dtype.is_floating_point or dtype == torch.bool):
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: {b} is {dtype}; floats and masks only")
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
        return w, dtype, tile, w.access(view, shape or (1,), dtype, idx, tile, ident(b))

    def _load(self, b: str, view: str, at: dict[str, str]) -> tuple[str, tuple[bool, ...]]:
        w, dtype, tile, acc = self._access(b, view, at)
        name = w.fresh(ident(b))
        w.line(f"{name} = ktdp.load {acc} : {w.tile_type(tile)} -> {type_text(tuple(tile), dtype)}")
        present = tuple(d in self._axes(b) for d in self.dims)
        full = self._full(present)
        return self._reshape(name, tuple(tile), full, dtype, f"{ident(b)}_nd"), present

    def _store(self, b: str, value: tuple[str, tuple[bool, ...]], view: str, at: dict[str, str]) -> None:
        name, present = value
        w, dtype, tile, acc = self._access(b, view, at)
        full = self._full(present)
        name = self._reshape(name, full, tuple(tile), dtype, f"{ident(b)}_flat")
        w.line(f"ktdp.store {name}, {acc} : {type_text(tuple(tile), dtype)}, {w.tile_type(tile)}")

    def _reshape(self, name: str, src: tuple[int, ...], dst: tuple[int, ...], dtype: torch.dtype, hint: str) -> str:
        """``name`` between a tile's own shape and its full-rank form (one group: only size-1 dims differ)."""
        if src == dst:
            return name
        w, out = self.w, self.w.fresh(hint)
        group = f"[[{', '.join(str(i) for i in range(max(len(src), len(dst))))}]]" if src and dst else "[]"
        if len(dst) > len(src):
            w.line(f"{out} = tensor.expand_shape {name} {group} output_shape {list(dst)} : "
                   f"{type_text(src, dtype)} into {type_text(dst, dtype)}")
        else:
            w.line(f"{out} = tensor.collapse_shape {name} {group} : {type_text(src, dtype)} into "
                   f"{type_text(dst, dtype)}")
        return out

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
        if n.op in COMPARE:
            return self._compare(n, args)
        if n.op == "cat":
            return write_cat(self, n, args, dtype)
        if n.op == "where" and len(args) == 3:
            check_node(n, torch.where, self._probes(n))
            present = tuple(any(a[1][i] for a in args) for i in range(len(self.dims)))
            names = [self._broadcast(a, present, self._dtype(b)) for a, b in zip(args, n.inputs)]
            out = self.w.fresh(ident(n.output))
            full = self._full(present)
            self.w.line(f"{out} = arith.select {', '.join(names)} : {type_text(full, torch.bool)}, "
                        f"{type_text(full, dtype)}")
            return out, present
        if n.op == "clamp" and len(args) == 1:
            return self._clamp(n, args[0], dtype)
        if n.op in ("relu", "gelu") and len(args) == 1:
            return self._activation(n, args[0], dtype)
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
        w.line(f"{s} = arith.constant {float_text(c)} : {NAMES[dtype]}")
        w.line(f"{t} = tensor.splat {s} : {type_text(self._full(present), dtype)}")
        return t, present

    def _emit(self, opname: str, args: list, dtype: torch.dtype, n: IRNode) -> tuple[str, tuple[bool, ...]]:
        present = tuple(any(a[1][i] for a in args) for i in range(len(self.dims)))
        full = self._full(present)
        names = [self._broadcast(a, present, dtype) for a in args]
        out = self.w.fresh(ident(n.output))
        self.w.line(f"{out} = {opname} {', '.join(names)} : {type_text(full, dtype)}")
        return out, present

    def _broadcast(self, value: tuple[str, tuple[bool, ...]], present: tuple[bool, ...], dtype: torch.dtype) -> str:
        name, have = value
        if have == present:
            return name
        w = self.w
        src = tuple(self.tile[d] for d, h in zip(self.dims, have) if h)
        flat = w.fresh(f"{name[1:]}_c")
        groups = collapse_groups(have)
        w.line(f"{flat} = tensor.collapse_shape {name} {groups} : {type_text(self._full(have), dtype)} into "
               f"{type_text(src, dtype)}")
        init, out = w.fresh("bcast_init"), w.fresh(f"{name[1:]}_b")
        full = self._full(present)
        w.line(f"{init} = tensor.empty() : {type_text(full, dtype)}")
        added = [i for i, h in enumerate(have) if not h]
        w.line(f"{out} = linalg.broadcast ins({flat} : {type_text(src, dtype)}) outs({init} : "
               f"{type_text(full, dtype)}) dimensions = {added}")
        return out

    def _reduce(self, n: Reduction, arg: tuple[str, tuple[bool, ...]], dtype: torch.dtype, kind: str = ""):
        kind = kind or n.op
        if kind == "var":
            return self._var(n, arg, dtype)
        if kind not in REDUCE:
            raise KTIRUnsupported("export", 0, f"kernel {self.spec.name}: reduction {n.op} is not written out yet")
        w = self.w
        name, have = arg
        red = [i for i, d in enumerate(self.dims) if d in n.reduction_dims]
        kept = tuple(h and i not in red for i, h in enumerate(have))
        full_in = self._full(have)
        out_shape = tuple(full_in[i] for i in range(len(self.dims)) if i not in red)
        init_s, init = w.fresh("init"), w.fresh("init_t")
        w.line(f"{init_s} = arith.constant {reduce_init(kind, dtype)} : {NAMES[dtype]}")
        w.line(f"{init} = tensor.splat {init_s} : {type_text(out_shape, dtype)}")
        r = w.fresh(ident(n.output))
        w.line(f"{r} = linalg.reduce {{ {REDUCE[kind]} }} ins({name} : {type_text(full_in, dtype)}) "
               f"outs({init} : {type_text(out_shape, dtype)}) dimensions = {red}")
        full = self._full(kept)
        nd = w.fresh(f"{ident(n.output)}_nd")
        groups = collapse_groups(tuple(i not in red for i in range(len(self.dims))))
        w.line(f"{nd} = tensor.expand_shape {r} {groups} output_shape {list(full)} : "
               f"{type_text(out_shape, dtype)} into {type_text(full, dtype)}")
        value = (nd, kept)
        if kind == "mean":
            count = math.prod(self.spec.dims[d] for d in n.reduction_dims)
            value = self._emit("arith.divf", [value, self._splat(float(count), kept, dtype)], dtype, n)
        return value

    def _var(self, n: Reduction, arg: tuple[str, tuple[bool, ...]], dtype: torch.dtype):
        """var(x) = sum((x - mean x)^2) / (count - correction), the correction (0 or 1) read off the node."""
        x = self._probes(n)[0].float()
        axes = [i for i, d in enumerate(n.dims) if d in n.reduction_dims]
        count = math.prod(self.spec.dims[d] for d in n.reduction_dims)
        got = probe(n, self._probes(n)[0])
        correction = next((c for c in (0, 1) if x.dim() == len(n.dims) and count > c
                           and same_values(got, torch.var(x, dim=axes, correction=c))), None)
        if correction is None:
            raise KTIRUnsupported("export", 0, f"node {n.name} (var) is not a plain variance over "
                                               f"{list(n.reduction_dims)}")
        mean = self._reduce(n, arg, dtype, kind="mean")
        centered = self._emit("arith.subf", [arg, mean], dtype, n)
        square = self._emit("arith.mulf", [centered, centered], dtype, n)
        total = self._reduce(n, square, dtype, kind="sum")
        return self._emit("arith.divf", [total, self._splat(float(count - correction), total[1], dtype)], dtype, n)

    def _cast(self, n: IRNode, arg, dtype):
        src = self._dtype(n.inputs[0])
        if src == dtype:
            return arg
        check_node(n, lambda x: x.to(dtype), self._probes(n))
        name, present = arg
        full = self._full(present)
        out = self.w.fresh(ident(n.output))
        op = "arith.extf" if src.itemsize < dtype.itemsize else "arith.truncf"
        self.w.line(f"{out} = {op} {name} : {type_text(full, src)} to {type_text(full, dtype)}")
        return out, present

    def _pow(self, n: IRNode, arg, dtype):
        x = self._probes(n)[0]
        two = float(probe(n, torch.full_like(x, 2.0)).flatten()[0])
        c = math.log2(two) if two > 0 else float("nan")
        if not (c == c and same_values(probe(n, x), x.float().pow(round(c, 6)))):
            raise KTIRUnsupported("export", 0, f"node {n.name} (pow) is not x ** c")
        # math.powf even for a square: the compiler's plan runs pow on the SFU's transcendental path
        return self._emit("math.powf", [arg, self._splat(round(c, 6), arg[1], dtype)], dtype, n)

    def _compare(self, n: IRNode, args: list) -> tuple[str, tuple[bool, ...]]:
        """``a > b`` as ``arith.cmpf ogt`` (a mask, i1); a one-input compare's threshold is read off the node."""
        src = self._dtype(n.inputs[0])
        fn = getattr(torch, n.op)
        if len(args) == 2:
            check_node(n, fn, self._probes(n))
        elif len(args) == 1:
            c = threshold(n, fn, self._probes(n)[0])
            args = [args[0], self._splat(c, args[0][1], src)]
        else:
            raise KTIRUnsupported("export", 0, f"node {n.name} ({n.op}) compares {len(args)} tensors")
        present = tuple(any(a[1][i] for a in args) for i in range(len(self.dims)))
        names = [self._broadcast(a, present, src) for a in args]
        out = self.w.fresh(ident(n.output))
        self.w.line(f"{out} = arith.cmpf {COMPARE[n.op]}, {', '.join(names)} : {type_text(self._full(present), src)}")
        return out, present

    def _activation(self, n: IRNode, arg, dtype):
        """relu(x) = max(x, 0); gelu(x) = x * (1 + erf(x / sqrt 2)) / 2 (the exact form, checked on probes)."""
        check_node(n, {"relu": torch.relu, "gelu": torch.nn.functional.gelu}[n.op], self._probes(n))
        if n.op == "relu":
            return self._emit("arith.maximumf", [arg, self._splat(0.0, arg[1], dtype)], dtype, n)
        scaled = self._emit("arith.mulf", [arg, self._splat(1 / math.sqrt(2.0), arg[1], dtype)], dtype, n)
        erf = self._emit("math.erf", [scaled], dtype, n)
        one_plus = self._emit("arith.addf", [erf, self._splat(1.0, arg[1], dtype)], dtype, n)
        half = self._emit("arith.mulf", [arg, self._splat(0.5, arg[1], dtype)], dtype, n)
        return self._emit("arith.mulf", [half, one_plus], dtype, n)

    def _clamp(self, n: IRNode, arg, dtype):
        """clamp(x, lo, hi) = min(max(x, lo), hi), each bound read off the node (a side left open writes no op)."""
        lo, hi = clamp_bounds(n, self._probes(n)[0])
        value = arg
        if lo is not None:
            value = self._emit("arith.maximumf", [value, self._splat(lo, arg[1], dtype)], dtype, n)
        if hi is not None:
            value = self._emit("arith.minimumf", [value, self._splat(hi, arg[1], dtype)], dtype, n)
        return value

    def _sigmoid(self, n: IRNode, arg, dtype):
        """sigmoid(x) = 1 / (1 + exp(-x)); silu(x) = x * sigmoid(x)."""
        neg = self._emit("arith.negf", [arg], dtype, n)
        e = self._emit("math.exp", [neg], dtype, n)
        one = self._splat(1.0, arg[1], dtype)
        den = self._emit("arith.addf", [one, e], dtype, n)
        if n.op == "sigmoid":
            return self._emit("arith.divf", [one, den], dtype, n)
        return self._emit("arith.divf", [arg, den], dtype, n)
