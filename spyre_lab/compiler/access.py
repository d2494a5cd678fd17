"""What lowering produces: reads through free views, each node's access, and the lowered program.

A ``Read`` is how a node sees one input: a base buffer through a chain of views (permute, expand,
slice...). Layout propagation decides from its strides whether the device can stream it as is or needs
a restickify; codegen tiles it by the node's iteration space; the executor replays the views on real
tensors. ``Access`` collects a node's reads, ``Lowered`` the whole lowering result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from spyre_lab.compiler.ir import Graph


@dataclass(frozen=True)
class Read:
    """How a node reads one input: a base buffer seen through a chain of free views.

    ``steps`` are ``(aten_op, args)`` applied in order; ``meta`` is the viewed tensor on the meta
    device (its strides tell layout propagation which base axis the stick lands on); ``axes`` names
    the node dim each axis of the viewed tensor runs along (None: not aligned with a dim).
    """

    buffer: str
    steps: tuple[tuple[object, tuple], ...]
    meta: torch.Tensor = field(compare=False)
    axes: tuple[str | None, ...] = ()
    _strided: dict[tuple, tuple | None] = field(default_factory=dict, compare=False, repr=False)
    _last: list = field(default_factory=lambda: [None], compare=False, repr=False)

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` seen through the steps. A chain of views of a CPU tensor is one strided window of its storage,
        fixed by the tensor's sizes and strides: found once per layout by running the steps, then taken in
        one ``as_strided`` call (the same sizes, strides, offset and storage, so the same tensor to any op).
        The last window is kept: the same tensor, laid out the same, gets the same view again (a weight read
        at every launch)."""
        if not self.steps:
            return t
        key = (t.shape, t.stride(), t.dtype, t.is_cpu)
        window = self._strided.get(key, _UNSEEN)
        if window is not None and window is not _UNSEEN:
            offset = t.storage_offset()
            last = self._last[0]
            if last is not None and last[0] is t and last[1] == key and last[2] == offset:
                return last[3]
            size, stride, delta = window
            view = t.as_strided(size, stride, offset + delta)
            self._last[0] = (t, key, offset, view)
            return view
        out = t
        for op, args in self.steps:
            out = op(out, *args)
        if window is _UNSEEN:
            self._strided[key] = _window(t, out)
        return out

    @property
    def is_identity(self) -> bool:
        return not self.steps

    def describe(self) -> str:
        return self.buffer + "".join(f".{op.__name__.split('.')[0]}{list(args)}" for op, args in self.steps)


_UNSEEN = object()


def _window(t: torch.Tensor, out: torch.Tensor) -> tuple | None:
    """``out``'s (sizes, strides, offset from ``t``'s) if it is a plain strided view of ``t``'s storage, else None
    (a step copied, changed the dtype, or set a conj/neg bit that ``as_strided`` would not carry)."""
    plain = (type(t) is torch.Tensor and type(out) is torch.Tensor and t.device.type == "cpu"
             and out.device == t.device and out.dtype == t.dtype and t.numel() > 0 and out.numel() > 0
             and not (out.is_conj() or out.is_neg() or t.is_conj() or t.is_neg()))
    if not plain or out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        return None
    return tuple(out.shape), out.stride(), out.storage_offset() - t.storage_offset()


@dataclass
class Access:
    """Per node: its input reads and the node dim of each output axis (for tile-by-tile execution)."""

    reads: list[Read]
    out_axes: tuple[str | None, ...]
    op_fn: Callable[..., torch.Tensor] = field(repr=False)


@dataclass
class Lowered:
    """The lowering result: the LoopIR graph plus what the executor needs to run it."""

    graph: Graph
    constants: dict[str, torch.Tensor]
    access: dict[str, Access]
    outputs: list[Read]
    input_names: list[str]
    fallback_ops: list[str]
    mutations: list[tuple[str, Read]] = field(default_factory=list)   # graph input <- value, written after the run


def compose(reads: Sequence[Read], fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` applied to its inputs seen through ``reads``' views: a node's ``compute`` on base buffers."""

    if all(r.is_identity for r in reads):
        return fn                               # the inputs are the operands
    applies = [r.apply for r in reads]

    def compute(*inputs: torch.Tensor) -> torch.Tensor:
        return fn(*[apply(x) for apply, x in zip(applies, inputs)])
    return compute
