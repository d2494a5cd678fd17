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

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        for op, args in self.steps:
            t = op(t, *args)
        return t

    @property
    def is_identity(self) -> bool:
        return not self.steps

    def describe(self) -> str:
        return self.buffer + "".join(f".{op.__name__.split('.')[0]}{list(args)}" for op, args in self.steps)


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

    def compute(*inputs: torch.Tensor) -> torch.Tensor:
        return fn(*(r.apply(x) for r, x in zip(reads, inputs)))
    return compute
