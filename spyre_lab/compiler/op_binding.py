"""The compute a LoopIR node carries: an ATen op with its tensor arguments left open.

Lowering runs each op once on fake tensors to learn its shape; the node it emits must later run the same op on
real device buffers at every launch. ``bind`` keeps the op and its non-tensor arguments and leaves a ``Slot`` for
each tensor, so a launch only fills the slots. Matmuls accumulate in fp32 (``matmul_fp32``); ``LastFp32`` keeps
the fp32 copy of a weight that comes back unchanged launch after launch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.compiler.core_operands import SHARE_LIMIT_BYTES
from spyre_lab.compiler.same_tensor import SameTensorCache

__all__ = ["LastFp32", "Slot", "bind", "matmul_fp32"]


class Slot:
    """Placeholder for the i-th tensor argument of an op call."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def bind(op: Callable, args: tuple, kwargs: dict) -> Callable[..., torch.Tensor]:
    """``op`` with its tensor arguments left open: ``call(*tensors)`` fills the slots in order.

    Called once per node per launch, so it does little: an ``OpOverload`` is called through its torch function
    where that is the same call (:data:`_TORCH_FUNCTIONS`), else through the ``_op`` its ``__call__`` forwards
    to, and slots that are plain arguments or keyword values are filled in place (only a
    slot inside a list or dict needs the arguments rebuilt)."""
    if type(op) is torch._ops.OpOverload:
        op = _TORCH_FUNCTIONS.get(str(op)) or op._op
    flat, spec = tree_flatten((args, kwargs))
    slots = [(pos, a.i) for pos, a in enumerate(flat) if isinstance(a, Slot)]
    top = [(pos, a.i) for pos, a in enumerate(args) if isinstance(a, Slot)]
    top_kw = [(k, v.i) for k, v in kwargs.items() if isinstance(v, Slot)]
    if len(top) + len(top_kw) == len(slots):
        def call_flat(*tensors: torch.Tensor) -> torch.Tensor:
            filled = list(args)
            for pos, i in top:
                filled[pos] = tensors[i]
            if top_kw:
                return op(*filled, **{**kwargs, **{k: tensors[i] for k, i in top_kw}})
            return op(*filled, **kwargs)
        return call_flat

    def call(*tensors: torch.Tensor) -> torch.Tensor:
        filled = list(flat)
        for pos, i in slots:
            filled[pos] = tensors[i]
        a, k = tree_unflatten(filled, spec)
        return op(*a, **k)
    return call


_TORCH_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    f"aten.{name}.{overload}": getattr(torch, name)
    for names, overload in (
        (("add", "sub", "mul", "div"), "Tensor"),
        (("neg", "abs", "reciprocal", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "relu", "erf"), "default"),
    )
    for name in names
}
"""Overloads called through their torch function: ``torch.add`` parses its arguments and calls ``add.Tensor``
unboxed, at about half the host cost of the boxed ``OpOverload`` call, with the same result. Only overloads the
torch function resolves to whatever a node passes them: the arithmetic ``.Tensor`` forms (a number where the schema
has a Tensor becomes the same 0-dim wrapped number either way) and the one-tensor ``.default`` forms. Not the
comparisons (``torch.eq(t, 2.0)`` calls ``eq.Scalar``) nor ``maximum`` (``torch.maximum`` refuses a number).
``tests/compiler/test_op_binding.py`` checks each resolves to its overload."""


def matmul_fp32(out_dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    left, right = LastFp32(), LastFp32()

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(left(a), right(b)).to(out_dtype)
    return mm


class LastFp32(SameTensorCache):
    """``t.float()``, keeping the last copy made while the very same tensor comes back unchanged: a matmul node
    reads its weight through the same view at every launch, and converting it again gives the same values.
    Copies larger than ``SHARE_LIMIT_BYTES`` are not kept (they would double what the weights hold)."""

    __slots__ = ()

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        value = self.get(t)
        if value is None:
            value = t.float()
            if value is not t and value.numel() * value.element_size() <= SHARE_LIMIT_BYTES:
                self.keep(t, value)
            else:
                self.forget()
        return value
