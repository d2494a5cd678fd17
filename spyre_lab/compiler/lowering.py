"""Lowering: an ATen FX graph becomes LoopIR (``Pointwise``, ``Reduction``, ``MatMul``, ``Fallback``).

This is the stage Inductor calls ``GraphLowering``: every ATen op is turned into one node over a
named iteration space, reading and writing named buffers. Three things never become nodes:

* **views** (view, permute, expand, slice, ...) are folded into the *reads* of their consumers, the
  way Inductor folds them into indexing; layout propagation later decides whether the device can
  read through a view for free or needs a restickify.
* **constants**: values that depend on no graph input (the causal mask SDPA builds from ``arange``,
  ``full``, ``scalar_tensor``) are computed once at compile time, like torch-spyre's
  ``dedup_and_promote_constants``.
* **shape-only ops** (``full_like``, ``zeros_like``) depend on a shape, never on data, so they fold too.

This module is the pass itself: it walks the graph, keeps the buffers, and decides what each call becomes.
The node builders for the device kinds live in ``lowering_kernels``, the bound compute in ``op_binding``.

Every node's ``compute`` is the real CPU torch computation of the op on fp16 device buffers:
elementwise and reduction ops call the ATen op itself (CPU fp16 kernels compute in fp32 and round
once), matmuls accumulate explicitly in fp32. Ops the device does not run become ``Fallback`` nodes
(host CPU, with a one-time warning naming the op) -- never a wrong answer.
"""

from __future__ import annotations

import functools
import itertools
import operator
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_map

from spyre_lab.compiler.access import Access, Lowered, Read, compose
from spyre_lab.compiler.ir import BufferInfo, Fallback, Graph, IRNode
from spyre_lab.compiler.lowering_errors import LoweringError
from spyre_lab.compiler.lowering_kernels import FakeNode, KernelLowerings
from spyre_lab.compiler.op_binding import LastFp32, Slot, bind
from spyre_lab.compiler.op_tables import (
    DEVICE_POINTWISE,
    DEVICE_REDUCTIONS,
    HOST_ONLY_REASON,
    MATMUL_OPS,
    SHAPE_ONLY_OPS,
    SPLIT_OPS,
    VIEW_OPS,
    decomposition_table,
)
from spyre_lab.user_line import warn_at_user_line

__all__ = ["Access", "LastFp32", "Lowered", "LoweringError", "Read", "decomposition_table", "lower"]

aten = torch.ops.aten


_WARNED: set[str] = set()


def _warn_fallback(op: str, reason: str) -> None:
    if op not in _WARNED:
        _WARNED.add(op)
        warn_at_user_line(f"spyre: aten.{op} runs on the host CPU (Fallback): {reason}")


# --- the lowering pass ---------------------------------------------------------------------------

class _Lowerer(KernelLowerings):
    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.buffers: dict[str, BufferInfo] = {}
        self.nodes: list[IRNode] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.access: dict[str, Access] = {}
        self.env: dict[fx.Node, object] = {}
        self.inputs: list[str] = []
        self.fallback_ops: list[str] = []
        self.mutations: list[tuple[str, Read]] = []
        self._names = itertools.count()
        self._constant_names: dict[int, str] = {}
        self._constant_sources: list[torch.Tensor] = []

    # values in env: Read (device value), torch.Tensor (constant), python scalars, or tuples thereof
    def run(self) -> Lowered:
        outputs: list[Read] = []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                if val is None or isinstance(val, (int, float, bool, torch.SymInt)):
                    self.env[node] = val          # a size Dynamo passed in; make_fx already specialised on it
                    continue
                if not isinstance(val, torch.Tensor):
                    raise LoweringError(f"graph input {node.name} is {type(val).__name__}, not a tensor; spyre "
                                        "compiles static shapes: use torch.compile(..., dynamic=False)")
                self._check_static(node.name, val)
                self.buffers[node.name] = BufferInfo(node.name, tuple(val.shape), val.dtype, "input")
                self.inputs.append(node.name)
                self.env[node] = self._base_read(node.name, val)
            elif node.op == "get_attr":
                self.env[node] = getattr(self.gm, node.target).detach()
            elif node.op == "call_function":
                self.env[node] = self._lower_call(node)
            elif node.op == "output":
                for out in torch.utils._pytree.tree_leaves(node.args[0]):
                    if isinstance(out, fx.Node):             # None / python constants stay with the caller
                        outputs.append(self._as_read(self.env[out], out.name))
        kept = outputs + [value for _, value in self.mutations]
        for r in kept:
            if r.buffer in self.buffers and self.buffers[r.buffer].role == "intermediate":
                self.buffers[r.buffer].role = "output"
        graph = Graph(self.buffers, self.nodes, self.inputs, list(dict.fromkeys(r.buffer for r in kept)))
        return Lowered(graph, self.constants, self.access, outputs, self.inputs, sorted(set(self.fallback_ops)),
                       self.mutations)

    @staticmethod
    def _check_static(name: str, val: torch.Tensor) -> None:
        if any(not isinstance(s, int) for s in val.shape):
            raise LoweringError(f"{name} has symbolic shape {tuple(val.shape)}; spyre programs are static "
                                "dataflow: compile with dynamic=False (a new shape recompiles)")

    def _base_read(self, buffer: str, val: torch.Tensor) -> Read:
        meta = torch.empty(tuple(val.shape), dtype=val.dtype, device="meta")
        return Read(buffer, (), meta)

    def _as_read(self, value: object, name: str) -> Read:
        """Graph outputs and device inputs must be device values; constants become constant buffers."""
        if isinstance(value, Read):
            return value
        if isinstance(value, torch.Tensor):
            return self._constant_buffer(value, name)
        raise LoweringError(f"{name} is a {type(value).__name__}, expected a tensor")

    def _constant_buffer(self, t: torch.Tensor, hint: str, share: bool = True) -> Read:
        """One constant buffer per constant tensor (the same tensor used twice shares its buffer; ``share=False``:
        a buffer of its own, for a fill the lowering keeps once per shape and hands out several times)."""
        name = self._constant_names.get(id(t)) if share else None
        if name is None:
            name = f"const_{hint}"
            while name in self.buffers:
                name = f"const_{hint}_{next(self._names)}"
            if share:
                self._constant_names[id(t)] = name
            self._constant_sources.append(t)            # keeps id(t) from being reused during lowering
            self.constants[name] = t.contiguous()
            self.buffers[name] = BufferInfo(name, tuple(t.shape), t.dtype, "constant")
        return self._base_read(name, self.constants[name])

    # --- dispatch -----------------------------------------------------------------------------
    def _lower_call(self, node: fx.Node) -> object:
        target = node.target
        if target is operator.getitem:
            seq, idx = self.env[node.args[0]], node.args[1]
            return seq[idx]
        if not isinstance(target, torch._ops.OpOverload):
            raise LoweringError(f"{node.name}: expected an ATen op, got {target}; compile_graph lowers to ATen first")
        packet = target.overloadpacket.__name__
        if packet == "copy_" and isinstance(self.env.get(node.args[0]), Read) and self.env[node.args[0]].is_identity \
                and self.env[node.args[0]].buffer in self.inputs:
            # functionalization turns an in-place update of a graph input into copy_(input, new_value)
            value = self._as_read(self.env[node.args[1]], node.name)
            self.mutations.append((self.env[node.args[0]].buffer, value))
            return self.env[node.args[0]]
        if packet.endswith("_") and packet[:-1] in DEVICE_POINTWISE and hasattr(aten, packet[:-1]):
            # an in-place op left by a decomposition (rms_norm's ``add_``): its result is what flows on
            pure = getattr(aten, packet[:-1])
            target, packet = getattr(pure, target._overloadname, pure.default), packet[:-1]
        args = tree_map(lambda a: self.env[a] if isinstance(a, fx.Node) else a, node.args)
        kwargs = tree_map(lambda a: self.env[a] if isinstance(a, fx.Node) else a, node.kwargs)
        val = node.meta.get("val")
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        if not any(isinstance(a, Read) for a in leaves):
            if torch.Tag.nondeterministic_seeded in target.tags:
                return self._fallback(node, target, packet, args, kwargs, "random op")
            return target(*args, **kwargs)                       # constant folding at compile time
        if packet in SHAPE_ONLY_OPS:
            return self._shape_only(node, target, args, kwargs)
        if isinstance(val, torch.Tensor):
            self._check_static(node.name, val)
        if packet not in VIEW_OPS and packet not in SPLIT_OPS:
            empty = self._zero_size(node, target, args, kwargs, val)
            if empty is not None:
                return empty
        if packet not in VIEW_OPS and packet not in SPLIT_OPS and _touches_host_only_dtype(val, leaves):
            return self._fallback(node, target, packet, args, kwargs, HOST_ONLY_DTYPE_REASON)
        if packet in VIEW_OPS:
            return self._view(target, args, kwargs)
        if packet in SPLIT_OPS:
            return self._split(packet, args, kwargs)
        if packet == "_softmax" or packet == "softmax":
            return self._softmax(node, args)
        if packet in MATMUL_OPS:
            return self._matmul(node, packet, args, kwargs)
        if packet == "cat":
            args = (self._without_empty_pieces(args[0], val), *args[1:])
        if packet in DEVICE_POINTWISE and isinstance(val, torch.Tensor):
            return self._pointwise(node, target, DEVICE_POINTWISE[packet], args, kwargs)
        if packet in DEVICE_REDUCTIONS:
            return self._reduction(node, target, packet, args, kwargs)
        reason = HOST_ONLY_REASON.get(packet, "no Spyre lowering for this op")
        return self._fallback(node, target, packet, args, kwargs, reason)

    @staticmethod
    def _zero_size(node: fx.Node, target, args, kwargs, val) -> torch.Tensor | None:
        """A result with no elements, or one computed from inputs with no elements (``x[:, 4:] + 1``, a model's
        empty rotary slice), holds nothing that depends on data: it folds to a constant at compile time, as
        a device kernel over an empty iteration space would do no work."""
        if isinstance(val, torch.Tensor) and val.numel() == 0:
            return torch.empty(tuple(val.shape), dtype=val.dtype)
        reads = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Read)]
        if not reads or any(r.meta.numel() for r in reads) or torch.Tag.nondeterministic_seeded in target.tags:
            return None
        a, k = tree_map(lambda v: torch.empty(tuple(v.meta.shape), dtype=v.meta.dtype) if isinstance(v, Read)
                        else v, (args, kwargs))
        # The fold runs one decomposed op on placeholders at compile time: its notices (var()'s "degrees of
        # freedom is <= 0" for a std over nothing) name that op, not the user's call, so they are not passed on.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return target(*a, **k)             # e.g. the sum over an empty dim: zeros

    @staticmethod
    def _without_empty_pieces(pieces, val) -> list:
        """cat's pieces without those that hold no elements (they add nothing; a kernel cannot tile them)."""
        kept = [p for p in pieces if not (isinstance(p, (Read, torch.Tensor)) and _numel(p) == 0
                                          and _dtype(p) == val.dtype)]
        return kept or list(pieces[:1])

    def _shape_only(self, node: fx.Node, target, args, kwargs) -> Read:
        val = node.meta["val"]
        if target.overloadpacket in (aten.empty_like, aten.new_empty, aten.empty_strided, aten.empty):
            t = torch.zeros(tuple(val.shape), dtype=val.dtype)
        else:
            fill = {aten.zeros_like: 0, aten.ones_like: 1, aten.new_zeros: 0, aten.new_ones: 1}.get(
                target.overloadpacket)
            if fill is None:
                fill = args[1] if target.overloadpacket is aten.full_like else args[2]
            t = _filled(tuple(val.shape), fill, val.dtype)
        return self._constant_buffer(t, node.name, share=False)

    def _view(self, target, args, kwargs) -> Read:
        src = args[0]
        if isinstance(src, torch.Tensor):
            return target(*args, **kwargs)
        rest = tuple(args[1:])
        if kwargs:
            raise LoweringError(f"view op {target} with keyword arguments {kwargs} is not supported")
        if target.overloadpacket is aten.reshape:
            target = aten.view.default
        op = target
        try:
            meta = op(src.meta, *rest)
        except RuntimeError:
            if op not in (aten.view.default, aten._unsafe_view.default):
                raise
            # Eager kept a layout the device buffers do not (``x.t().add_(1)`` leaves eager's sum transposed in
            # memory, so flattening it is a view there): copy to a contiguous buffer, then view that.
            src = self._contiguous_copy(src)
            meta = op(src.meta, *rest)
        return Read(src.buffer, (*src.steps, (op, rest)), meta)

    def _contiguous_copy(self, src: Read) -> Read:
        val = torch.empty(tuple(src.meta.shape), dtype=src.meta.dtype, device="meta")
        fake = FakeNode(f"{src.buffer}_contiguous", val)
        return self._pointwise(fake, aten.clone.default, "copy", (src,), {"memory_format": torch.contiguous_format})

    def _split(self, packet: str, args, kwargs) -> list[Read]:
        """split / split_with_sizes / unbind return views, so each piece is a slice (or select) read of the
        source: a fused QKV projection splits into q, k, v without a kernel."""
        src, rest = args[0], dict(zip(("sizes", "dim"), args[1:])) | kwargs
        if isinstance(src, torch.Tensor):
            return list(getattr(aten, packet)(*args, **kwargs))
        dim = rest.get("dim", 0) % src.meta.dim()
        if packet == "unbind":
            return [self._view(aten.select.int, (src, dim, i), {}) for i in range(src.meta.shape[dim])]
        extent, sizes = src.meta.shape[dim], rest["sizes"]
        if isinstance(sizes, int):                       # split(t, size): equal pieces, the last one shorter
            sizes = [min(sizes, extent - start) for start in range(0, extent, sizes)]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [self._view(aten.slice.Tensor, (src, dim, start, start + size), {})
                for start, size in zip(starts, sizes)]

    def _tensor_reads(self, args, kwargs, hint: str) -> tuple[list[Read], tuple, dict]:
        """Replace every tensor argument with a slot; constants become constant buffers."""
        reads: list[Read] = []
        floating_reads = [a.meta for a in tree_flatten((args, kwargs))[0]
                          if isinstance(a, Read) and a.meta.dtype.is_floating_point]
        floating_operand = bool(floating_reads)
        # With no dimensioned floating operand, a 0-dim float32 constant would promote a 0-dim fp16 result to
        # float32 (eager's scalar never does): then the constant takes the operands' dtype.
        immediate_dtype = (None if any(m.dim() for m in floating_reads) or not floating_reads
                           else functools.reduce(torch.promote_types, (m.dtype for m in floating_reads)))

        def slot(a: object) -> object:
            if (floating_operand and isinstance(a, torch.Tensor) and not isinstance(a, Read) and a.dim() == 0
                    and a.dtype.is_floating_point and a.device.type == "cpu"):
                # A 0-dim float constant next to a floating device operand (``x * 0.177`` reaches a one-op
                # compile as mul(x, tensor(0.177)); triu, nan_to_num and ``x[mask] = 0.0`` make them too): an
                # immediate operand of the kernel. It stays a 0-dim host tensor, not a Python number, because
                # ops such as where, maximum and index_put take a Tensor there; CPU kernels read a 0-dim host
                # operand at full precision, as they read a Python number, and the dimensioned operand sets the
                # result dtype (see immediate_dtype where there is none). A constant buffer would round it to the
                # card's fp16 first.
                return a if immediate_dtype is None else a.to(immediate_dtype)
            if isinstance(a, torch.Tensor) and a.dim() == 0 and a.numel() == 1 and not isinstance(a, Read):
                reads.append(self._constant_buffer(a, f"{hint}_{len(reads)}"))
                return Slot(len(reads) - 1)
            if isinstance(a, (Read, torch.Tensor)):
                reads.append(self._as_read(a, f"{hint}_{len(reads)}"))
                return Slot(len(reads) - 1)
            return a

        return reads, tree_map(slot, args), tree_map(slot, kwargs)

    def _emit(self, cls: type[IRNode], name: str, op: str, reads: list[Read], out_shape: Sequence[int],
              out_dtype: torch.dtype, op_fn: Callable, dims: dict[str, int], out_axes: tuple[str | None, ...],
              **extra) -> Read:
        out = name
        while out in self.buffers:                    # "max" -> max_0, max_1 may meet an FX node named max_1
            out = f"{name}_{next(self._names)}"
        self.buffers[out] = BufferInfo(out, tuple(out_shape), out_dtype, "intermediate")
        node = cls(name=f"{op}:{out}", op=op, inputs=tuple(r.buffer for r in reads), output=out, dims=dims,
                   compute=compose(reads, op_fn), **extra)
        self.nodes.append(node)
        self.access[node.name] = Access(reads, out_axes, op_fn)
        return self._base_read(out, torch.empty(tuple(out_shape), dtype=out_dtype, device="meta"))


    def _fallback(self, node: fx.Node, target, packet: str, args, kwargs, reason: str) -> object:
        _warn_fallback(packet, reason)
        self.fallback_ops.append(packet)
        reads, sargs, skw = self._tensor_reads(args, kwargs, node.name)
        reads = [Read(r.buffer, r.steps, r.meta, ()) for r in reads]
        fn = bind(target, sargs, skw)
        vals = node.meta.get("val")
        outs = vals if isinstance(vals, (tuple, list)) else (vals,)
        results = []
        for i, out in enumerate(outs):
            if not isinstance(out, torch.Tensor):
                raise LoweringError(f"{node.name}: host fallback of aten.{packet} returns {type(out).__name__}")
            self._check_static(node.name, out)
            pick = fn if len(outs) == 1 else (lambda *t, _i=i, _fn=fn: _fn(*t)[_i])
            name = node.name if len(outs) == 1 else f"{node.name}_{i}"
            results.append(self._emit(Fallback, name, packet, reads, out.shape, out.dtype, pick, {},
                                      (None,) * out.dim(), reason=reason))
        return results[0] if len(outs) == 1 else tuple(results)


HOST_ONLY_DTYPES = (torch.float64,)
"""Dtypes the card has no format for: a float64 tensor on spyre is held as fp16 (the runtime's storage policy), and
float64 arithmetic runs on the host."""
HOST_ONLY_DTYPE_REASON = "the card has no float64 format: float64 arithmetic runs on the host"


def _touches_host_only_dtype(val: object, leaves: Sequence[object]) -> bool:
    values = [*(val if isinstance(val, (tuple, list)) else (val,)), *leaves]
    return any(_dtype(v) in HOST_ONLY_DTYPES for v in values if isinstance(v, (Read, torch.Tensor)))


_FILLS: dict[tuple, torch.Tensor] = {}


def _filled(shape: tuple[int, ...], fill: object, dtype: torch.dtype) -> torch.Tensor:
    """``torch.full(shape, fill)``, made once per (shape, fill, dtype): SDPA's masked-row test fills a
    [B, H, M, N] float32 zero tensor per layer (128 MB at 32 heads x 1024^2), the same in every layer.
    Constants are never written, so every buffer filled alike may hold the one tensor."""
    key = (shape, repr(fill), dtype)
    if key not in _FILLS:
        if len(_FILLS) >= 8:
            _FILLS.clear()
        _FILLS[key] = torch.full(shape, fill, dtype=dtype)
    return _FILLS[key]


def _numel(value: Read | torch.Tensor) -> int:
    return value.meta.numel() if isinstance(value, Read) else value.numel()


def _dtype(value: Read | torch.Tensor) -> torch.dtype:
    return value.meta.dtype if isinstance(value, Read) else value.dtype



def lower(gm: fx.GraphModule) -> Lowered:
    """ATen FX graph (with ``meta['val']`` fake tensors on every node) -> LoopIR."""
    return _Lowerer(gm).run()

