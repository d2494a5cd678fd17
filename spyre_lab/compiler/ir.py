"""LoopIR: the compiler's graph between ATen and kernels.

Lowering turns each ATen op into one node over a *named iteration space* (like Inductor's
``Pointwise``/``Reduction`` IR nodes, plus ``MatMul`` because Spyre runs matmuls on a different
unit than everything else, and ``Fallback`` for what the device cannot run). Nodes read and
write named buffers. The scheduler (``fusion.py``) then groups nodes into ``NodeGroup``s;
everything after that (layouts, work division, scratchpad planning, codegen) works on those.

Each node carries ``compute``: the exact CPU torch computation of the node, so the executor's
numbers never depend on how the compiler chose to fuse, divide or tile.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from spyre_lab.device.layout import StickLayout

BufferRole = Literal["input", "output", "intermediate", "constant"]

TRANSCENDENTAL_OPS = frozenset({
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "pow", "reciprocal",
    "sin", "cos", "erf", "softplus",
})
"""Pointwise ops the SFU runs in several passes (``SpyreConfig.transcendental_factor``)."""


@dataclass
class BufferInfo:
    """A tensor the graph reads or writes. ``layout`` is filled in by layout propagation."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    role: BufferRole
    layout: StickLayout | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class InputView:
    """How a node reads one input through free views (permute, expand, unsqueeze, slice, reshape).

    ``shape`` is the viewed tensor's, ``strides`` and ``offset`` are in elements of the base buffer
    (row-major), and ``axes`` names the node dim each viewed axis runs along (None: none). Codegen
    tiles the input by these, so a transposed or broadcast read moves the bytes it really touches.
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    axes: tuple[str | None, ...]


@dataclass
class IRNode:
    """One operation over a named iteration space.

    ``dims`` maps dim name -> extent, outermost first; the last entry of ``dims`` that is not a
    reduction dim is the stick dim unless ``stick_dim`` says otherwise.
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    output: str
    dims: dict[str, int]
    compute: Callable[..., torch.Tensor] = field(repr=False)
    reduction_dims: tuple[str, ...] = ()
    stick_dim: str | None = None

    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def iteration_points(self) -> int:
        return math.prod(self.dims.values()) if self.dims else 1


@dataclass
class Pointwise(IRNode):
    """Elementwise op: one output element per iteration point. Views that need data movement
    (a restickify) are Pointwise ``copy`` nodes; views that are free never become nodes."""

    @property
    def transcendental(self) -> bool:
        return self.op in TRANSCENDENTAL_OPS


@dataclass
class Reduction(IRNode):
    """Reduction over ``reduction_dims`` (sum, mean, amax, amin, argmax, ...)."""


@dataclass
class MatMul(IRNode):
    """``C[b,m,n] = sum_k A[b,m,k] * B[b,k,n]`` on the PE arrays (mm, bmm, addmm, linear)."""

    b: int = 1
    m: int = 1
    n: int = 1
    k: int = 1

    @property
    def macs(self) -> int:
        return self.b * self.m * self.n * self.k


@dataclass
class Fallback(IRNode):
    """An op the device does not run: executed on the host CPU, with DMA copies around it."""

    reason: str = ""


@dataclass
class NodeGroup:
    """One device kernel (a SuperDSC bundle): nodes fused by a named rule.

    ``inputs``/``outputs`` travel through DRAM; ``lx_resident`` intermediates never leave LX.
    ``input_views`` maps a node's name to how it reads each of its inputs through free views (one entry
    per input, None for a plain read); a node missing from it reads every input plainly.
    """

    name: str
    nodes: list[IRNode]
    rule: str
    inputs: list[str]
    outputs: list[str]
    lx_resident: list[str] = field(default_factory=list)
    decision: str = ""
    """Why the scheduler formed this kernel when it weighed alternatives (e.g. fused vs separate MLP)."""
    input_views: dict[str, tuple[InputView | None, ...]] = field(default_factory=dict, repr=False, kw_only=True)

    def views_of(self, node: IRNode) -> tuple[InputView | None, ...]:
        """How ``node`` reads its inputs (an empty tuple: all plain reads)."""
        return self.input_views.get(node.name, ())

    @property
    def is_fallback(self) -> bool:
        return any(isinstance(n, Fallback) for n in self.nodes)

    @property
    def anchor(self) -> IRNode:
        """The node whose iteration space the kernel is divided over: its matmul, else its largest node."""
        matmuls = [n for n in self.nodes if isinstance(n, MatMul)]
        if matmuls:
            return max(matmuls, key=lambda n: n.macs)
        return max(self.nodes, key=lambda n: n.iteration_points)


@dataclass
class Graph:
    """A lowered program: buffers, nodes in topological order, graph inputs and outputs."""

    buffers: dict[str, BufferInfo]
    nodes: list[IRNode]
    inputs: list[str]
    outputs: list[str]
