"""The cores' own matmuls in one ``bmm`` call, where that call is each core's call, bit for bit.

A K-split matmul is emulated core by core: every core multiplies its fp32 operands (``core_operands``) with
its own ``torch.matmul``. A decode step has many such kernels of a few 64-wide slices each, so the per-core
calls, not the arithmetic, are what the host pays for. ``torch.bmm`` over the cores' operands stacked along a
new first axis computes every core's product in one call -- but only where it computes what each core's own
call computes: on the CPU, ATen runs a batched product item by item through the same GEMM, hands it to the
BLAS as one batch, or uses its own small-matrix loop, depending on sizes, strides and dtype, and the BLAS
may pick a different kernel for a batch item than for the same matrix alone (with MKL, a 1 x 64 by 64 x 46
item differs in the last bit from its own product). So each layout (the cores' operands' sizes and strides,
the number of cores, the thread count: what those choices depend on, never the values) is probed once on
random values against real per-core products, and stacked only where every item agreed bit for bit.
Elsewhere the cores keep their own calls.

The stack is made from the source in one conversion: where the cores' slices of a 2-D fp16/bf16 operand are
tiles of one size on a grid, the source converted to fp32 and viewed tile-major holds every core's slice with
the values its own conversion gives (widening is exact). A core's own operand is a fresh conversion (dense,
aligned); so is every item of a fresh stack, at the stack's offsets, which are the offsets the probe saw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spyre_lab.compiler.core_operands import EXACT_WIDENING, SHARE_LIMIT_BYTES, Ranges, narrowed
from spyre_lab.compiler.same_tensor import SameTensorCache

_EXACT: dict[tuple, bool] = {}
"""Per layout (operand sizes and strides, cores, threads): does ``bmm`` give every core's own product?"""

PROBE_SEED = 0


def batch_is_exact(a: tuple[tuple[int, ...], tuple[int, ...]], b: tuple[tuple[int, ...], tuple[int, ...]],
                   cores: int) -> bool:
    """Does ``torch.bmm`` of ``cores`` stacked fp32 items give, item by item, exactly what ``torch.matmul`` gives
    a core's own operands: fresh tensors with the sizes and strides ``a`` and ``b``? Probed once per layout on
    random values."""
    key = (a, b, cores, torch.get_num_threads())
    exact = _EXACT.get(key)
    if exact is None:
        g = torch.Generator().manual_seed(PROBE_SEED)
        sa = torch.randn(cores, *a[0], generator=g).half().float()     # values any fp16 source could give
        sb = torch.randn(cores, *b[0], generator=g).half().float()
        own = torch.stack([torch.matmul(_fresh(a, sa[c]), _fresh(b, sb[c])) for c in range(cores)])
        exact = _EXACT[key] = torch.equal(torch.bmm(sa, sb), own)
    return exact


def _fresh(layout: tuple[tuple[int, ...], tuple[int, ...]], values: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(layout[0], layout[1], dtype=values.dtype).copy_(values)


@dataclass(frozen=True)
class Tiles:
    """How to make every core's fp32 operand, stacked in core order, from one 2-D source: the cores' slices are
    tiles of shape ``tile`` on a ``grid``; the source is converted once, viewed tile-major, and the cores' tiles
    picked (``index``; None: the cores take the tiles in grid order). ``own`` is a core's own operand's sizes
    and strides (what the probe compares against)."""

    grid: tuple[int, ...]
    tile: tuple[int, ...]
    index: torch.Tensor | None
    own: tuple[tuple[int, ...], tuple[int, ...]]

    @staticmethod
    def of(x: torch.Tensor, ranges: Sequence[Ranges]) -> Tiles | None:
        """The tiling of the cores' ``ranges`` (in stack order) of ``x``, if they are tiles of one shape on a grid
        of a 2-D fp16/bf16 source; else None."""
        if x.dim() != 2 or x.dtype not in EXACT_WIDENING or not x.numel() or x.numel() * 4 > SHARE_LIMIT_BYTES:
            return None                        # (a large source: its fp32 stack would be held while the cores run)
        grid, tile, coords = [], [], []
        for axis, size in enumerate(x.shape):
            spans = [r[axis] or (0, size) for r in ranges]
            step = spans[0][1] - spans[0][0]
            if step <= 0 or size % step or any(b - a != step or a % step for a, b in spans):
                return None
            grid.append(size // step)
            tile.append(step)
            coords.append([a // step for a, _ in spans])
        picks = [i * grid[1] + j for i, j in zip(*coords)]
        index = None if picks == list(range(math.prod(grid))) else torch.tensor(picks)
        own = narrowed(x, ranges[0]).float()
        return Tiles(tuple(grid), tuple(tile), index, (tuple(own.shape), own.stride()))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        (g0, g1), (s0, s1) = self.grid, self.tile
        if g1 == 1 or s0 == 1:                # whole rows, or tiles of one row: tile-major is row-major
            tiles = x.float().reshape(g0 * g1, s0, s1)
        else:
            tiles = x.float().reshape(g0, s0, g1, s1).permute(0, 2, 1, 3).reshape(g0 * g1, s0, s1)
        if self.index is not None:
            tiles = tiles.index_select(0, self.index)
        if tiles.stride() != (s0 * s1, s1, 1):      # a view of the conversion: the stack must be a fresh, dense one
            tiles = torch.empty(tiles.shape).copy_(tiles)
        return tiles


KEPT_SOURCES = 8
"""Sources whose stacks one operand of a kernel keeps. A program piece that runs once per layer reads another
layer's weight at each launch, so one kept source would never be the next one; a few cover a small model's
layers (a large model's weights are over ``SHARE_LIMIT_BYTES`` and not stacked)."""


class KeptStacks:
    """What was made from the last few sources of one operand (a stack and its tiling), each handed back while
    its very source comes back unchanged (``same_tensor``); the oldest is dropped for a new one."""

    __slots__ = ("entries", "next")

    def __init__(self) -> None:
        self.entries = [SameTensorCache() for _ in range(KEPT_SOURCES)]
        self.next = 0

    def get(self, source: torch.Tensor) -> Any:
        for entry in self.entries:
            if entry.source is source:
                return entry.get(source)
        return None

    def keep(self, source: torch.Tensor, made: Any) -> None:
        for entry in self.entries:
            if entry.source is source:         # changed since: what is made now replaces it
                entry.keep(source, made)
                return
        self.entries[self.next].keep(source, made)
        self.next = (self.next + 1) % KEPT_SOURCES
