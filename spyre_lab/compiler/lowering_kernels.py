"""How each kind of device op becomes LoopIR nodes: pointwise, reduction, softmax and matmul.

``lowering`` decides *which* kind an ATen call is (or that it is a view, a constant or a host fallback); this
module builds the nodes for the device kinds: their iteration-space dims, the axes each read is indexed by, and
the compute each node carries. ``KernelLowerings`` is a mixin of the lowering pass: it uses the pass's buffer
bookkeeping (``_tensor_reads``, ``_emit``) and is never used on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from spyre_lab.compiler.access import Read
from spyre_lab.compiler.ir import MatMul, Pointwise, Reduction
from spyre_lab.compiler.lowering_errors import LoweringError
from spyre_lab.compiler.op_binding import bind, matmul_fp32
from spyre_lab.compiler.op_tables import MULTI_OUTPUT_NAMES

__all__ = ["FakeNode", "KernelLowerings", "broadcast_axes", "dim_names"]

aten = torch.ops.aten


def dim_names(n: int) -> tuple[str, ...]:
    """The names of a rank-``n`` iteration space: ``d0``, ``d1``, ...; reads name the axes they index by them."""
    return tuple(f"d{i}" for i in range(n))


def broadcast_axes(shape: Sequence[int], out_dims: Sequence[str]) -> tuple[str | None, ...]:
    """Right-align an input against the output dims (numpy broadcasting)."""
    pad = len(out_dims) - len(shape)
    return tuple(out_dims[pad + i] if pad + i >= 0 else None for i in range(len(shape)))


@dataclass
class FakeNode:
    """Stands in for an fx.Node when one ATen op lowers to several LoopIR nodes."""

    name: str
    val: torch.Tensor
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.meta["val"] = self.val


class KernelLowerings:
    """The device-kind node builders of the lowering pass (mixed into it; see the module docstring)."""

    def _pointwise(self, node: fx.Node, target, op: str, args, kwargs) -> Read:
        val = node.meta["val"]
        reads, sargs, skw = self._tensor_reads(args, kwargs, node.name)
        if op == "cast":          # the device buffer is where the value lives; drop host placement kwargs
            skw = {k: v for k, v in skw.items() if k not in ("device", "pin_memory", "layout", "memory_format")}
        dims = dict(zip(dim_names(val.dim()), val.shape))
        names = tuple(dims)
        reads = [Read(r.buffer, r.steps, r.meta, self._pointwise_axes(op, r, names, sargs)) for r in reads]
        return self._emit(Pointwise, node.name, op, reads, val.shape, val.dtype, bind(target, sargs, skw),
                          dims, names, stick_dim=names[-1] if names else None)

    @staticmethod
    def _pointwise_axes(op: str, r: Read, names: tuple[str, ...], sargs) -> tuple[str | None, ...]:
        if op in ("cat", "index_select"):
            gather_dim = sargs[1] if len(sargs) > 1 and isinstance(sargs[1], int) else -1
            axes = list(broadcast_axes(r.meta.shape, names)) if r.meta.dim() == len(names) else [None] * r.meta.dim()
            if (axes and op == "cat") or (op == "index_select" and r.meta.dim() == len(names)):
                axes[gather_dim % len(axes)] = None
            return tuple(axes)
        return broadcast_axes(r.meta.shape, names)

    def _reduction(self, node: fx.Node, target, packet: str, args, kwargs) -> object:
        src = args[0]
        if not isinstance(src, Read):
            raise LoweringError(f"{node.name}: reduction of a non-device value")
        rank = src.meta.dim()
        names = dim_names(rank)
        if packet == "topk":
            reduced = [args[2] if len(args) > 2 else kwargs.get("dim", -1)]
        elif len(args) > 1 and isinstance(args[1], (int, list, tuple)) and packet not in ("prod",):
            reduced = [args[1]] if isinstance(args[1], int) else list(args[1])
        elif "dim" in kwargs and kwargs["dim"] is not None:
            reduced = [kwargs["dim"]] if isinstance(kwargs["dim"], int) else list(kwargs["dim"])
        else:
            reduced = list(range(rank))
        if not reduced and packet in ("sum", "mean", "amax", "amin", "prod", "var", "var_mean", "any", "all"):
            reduced = list(range(rank))                   # dim=[] reduces every dim
        reduced_names = tuple(names[d % rank] for d in reduced) if rank else ()
        vals = node.meta["val"]
        outs = vals if isinstance(vals, (tuple, list)) else (vals,)
        reads, sargs, skw = self._tensor_reads(args, kwargs, node.name)
        reads = [Read(r.buffer, r.steps, r.meta, names if i == 0 else ()) for i, r in enumerate(reads)]
        fn = bind(target, sargs, skw)
        results = []
        for i, out in enumerate(outs):
            names_of = MULTI_OUTPUT_NAMES.get(packet, (f"{packet}_values", f"{packet}_indices"))
            op = packet if len(outs) == 1 else names_of[i]
            out_axes = self._reduced_out_axes(names, reduced_names, out.dim())
            pick = fn if len(outs) == 1 else (lambda *t, _i=i, _fn=fn: _fn(*t)[_i])
            name = node.name if len(outs) == 1 else f"{node.name}_{i}"
            stick = [d for d in names if d not in reduced_names]
            results.append(self._emit(Reduction, name, op, reads, out.shape, out.dtype, pick,
                                      dict(zip(names, src.meta.shape)), out_axes, reduction_dims=reduced_names,
                                      stick_dim=stick[-1] if stick else None))
        return results[0] if len(outs) == 1 else tuple(results)

    @staticmethod
    def _reduced_out_axes(names, reduced, out_rank: int) -> tuple[str | None, ...]:
        kept = [d for d in names if d not in reduced]
        if out_rank == len(names):                               # keepdim
            return tuple(None if d in reduced else d for d in names)
        return tuple(kept[-out_rank:]) if out_rank else ()

    def _softmax(self, node: fx.Node, args) -> Read:
        """softmax -> amax, sub, exp, sum, div (torch-spyre's decomposition); the scheduler may fuse them back."""
        x, dim = args[0], args[1]
        if not isinstance(x, Read):
            return torch.softmax(x, dim)
        dim = dim % x.meta.dim()
        steps = [
            ("amax", aten.amax.default, (x, [dim], True)),
            ("sub", aten.sub.Tensor, (x, "amax")),
            ("exp", aten.exp.default, ("sub",)),
            ("sum", aten.sum.dim_IntList, ("exp", [dim], True)),
            ("div", aten.div.Tensor, ("exp", "sum")),
        ]
        env: dict[str, Read] = {}
        dtype = node.meta["val"].dtype
        for op, target, a in steps:
            a = tuple(env[v] if isinstance(v, str) else v for v in a)
            fake = FakeNode(f"{node.name}_{op}", target(*[v.meta if isinstance(v, Read) else v for v in a]))
            fake.meta["val"] = fake.meta["val"].to(dtype) if op != "amax" else fake.meta["val"]
            if op in ("amax", "sum"):
                env[op] = self._reduction(fake, target, op, a, {})
            else:
                env[op] = self._pointwise(fake, target, op, a, {})
        return env["div"]

    def _matmul(self, node: fx.Node, packet: str, args, kwargs) -> Read:
        val = node.meta["val"]
        bias = None
        if packet in ("addmm", "baddbmm"):
            bias, a, b = args[0], args[1], args[2]
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        else:
            a, b = args[0], args[1]
        reads, _, _ = self._tensor_reads((a, b), {}, node.name)
        ra, rb = reads
        if ra.meta.dim() == 2:
            (m, k), n, bsz = ra.meta.shape, rb.meta.shape[-1], 1
            ra = Read(ra.buffer, ra.steps, ra.meta, ("M", "K"))
            rb = Read(rb.buffer, rb.steps, rb.meta, ("K", "N"))
            out_axes: tuple[str, ...] = ("M", "N")
        else:
            bsz, m, k = ra.meta.shape
            n = rb.meta.shape[-1]
            ra = Read(ra.buffer, ra.steps, ra.meta, ("B", "M", "K"))
            rb = Read(rb.buffer, rb.steps, rb.meta, ("B", "K", "N"))
            out_axes = ("B", "M", "N")
        mm_name = node.name if bias is None else f"{node.name}_mm"
        dims = {"B": bsz, "M": m, "N": n, "K": k}
        out = self._emit(MatMul, mm_name, "matmul", [ra, rb], val.shape, val.dtype, matmul_fp32(val.dtype), dims,
                         out_axes, reduction_dims=("K",), stick_dim="N", b=bsz, m=m, n=n, k=k)
        if bias is None:
            return out
        fake = FakeNode(node.name, val)
        if beta == 1 and alpha == 1:
            return self._pointwise(fake, aten.add.Tensor, "add", (out, bias), {})
        return self._scaled_add(fake, out, bias, alpha, beta)

    def _scaled_add(self, fake, out: Read, bias, alpha, beta) -> Read:
        def fn(c: torch.Tensor, bias_t: torch.Tensor) -> torch.Tensor:
            return (c.float() * alpha + bias_t.float() * beta).to(c.dtype)
        reads, _, _ = self._tensor_reads((out, bias), {}, fake.name)
        val = fake.meta["val"]
        names = dim_names(val.dim())
        reads = [Read(r.buffer, r.steps, r.meta, broadcast_axes(r.meta.shape, names)) for r in reads]
        return self._emit(Pointwise, fake.name, "add", reads, val.shape, val.dtype, fn,
                          dict(zip(names, val.shape)), names, stick_dim=names[-1])
