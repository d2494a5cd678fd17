"""Each core's inputs to a split reduction, converted to fp32 once per group of cores instead of once per core.

When a matmul's K (or a reduction's reduced dim) is split across cores, the executor emulates every core: its
slice of each input, converted to fp32, then its own small matmul or reduction. Converting every core's slice
on its own costs one ATen call per core and input, more than the core's matmul. This module builds the same
operands with fewer calls, and only where the result is provably the same bit for bit.

Why a shared conversion can give the same numbers. A core's slice converted on its own is a fresh tensor:
dense strides in the order of its source's strides, at a 64-byte aligned address (the CPU allocator's
alignment). BLAS and ATen kernels may choose their blocking and vector path from the sizes, strides and
alignment they are given, so two operands give the same result only if all of those agree, not just the
values. Cores whose slices agree on every axis but the source's outermost one (largest stride) can be
converted together: the union of their slices along that axis, converted once, is a fresh tensor whose
inner strides do not depend on the outer extent, so each core's part of it has the strides its own
conversion would have. Where that part also starts a multiple of 64 bytes into the union, the kernel sees
the same sizes, strides, values (widening fp16/bf16 to fp32 is exact) and alignment as the per-core
operand: the same call. Each layout is checked once against real per-core conversions; cores whose
operand would differ in any way are converted one by one, as before.

(Computing one matmul over the union of the cores' N slices instead would save the per-core matmuls too,
but it is not exact: the BLAS picks its kernel and blocking from the shape. Measured with MKL on AVX-512,
29% of 18,600 split shapes differed in the last bit from the per-core products: every M split, and N slices
that are not a multiple of 16 columns. So each core keeps its own matmul call, or its own item of one
``bmm`` where ``batched_cores`` probed that to be the same product.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

Ranges = tuple[tuple[int, int] | None, ...]
"""Per axis of a tensor: the (start, end) a core narrows it to, or None for the whole axis."""

EXACT_WIDENING = (torch.float16, torch.bfloat16)
"""Dtypes whose every value fp32 holds exactly: converting a union or a slice gives the same values."""

ALIGNMENT = 64
"""Bytes: where a fresh CPU tensor starts (the allocator's alignment), and so a shared operand must too."""

SHARE_LIMIT_BYTES = 1 << 24
"""Sharing conversions pays where call overhead dominates (a decode step's small weights). A source whose fp32
copy is larger is converted core by core as each core needs it: its time goes into bytes, not calls, and
converting it whole at once would hold all of it in fp32 while the cores run."""


def narrowed(t: torch.Tensor, ranges: Ranges) -> torch.Tensor:
    """``t`` narrowed axis by axis to ``ranges`` (a view)."""
    for i, r in enumerate(ranges):
        if r is not None:
            t = t.narrow(i, r[0], r[1] - r[0])
    return t


def core_ranges(axes: Sequence[str | None], shape: Sequence[int], dims: dict[str, int],
                own: dict[str, tuple[int, int]]) -> Ranges:
    """How the per-core emulation narrows a read (axes named by node dims) to a core's slice ``own``: the axes
    that run along a split dim, at full extent (a broadcast axis of size 1 is read whole)."""
    return tuple(own[a] if a in own and shape[i] == dims[a] and own[a] != (0, dims[a]) else None
                 for i, a in enumerate(axes))


@dataclass(frozen=True)
class Cut:
    """Pieces (``ranges``) of a tensor of one shape. When every piece narrows the same single axis and no piece
    straddles another's edge, one ``tensor_split`` call gives them all (the same views ``narrow`` gives)."""

    ranges: tuple[Ranges, ...]
    axis: int | None = None
    indices: tuple[int, ...] = ()
    chunks: tuple[int, ...] = ()

    @staticmethod
    def of(shape: Sequence[int], ranges: Sequence[Ranges]) -> Cut:
        ranges = tuple(ranges)
        axes = {i for r in ranges for i, x in enumerate(r) if x is not None}
        if len(axes) != 1 or len(ranges) < 2:
            return Cut(ranges)
        axis = axes.pop()
        spans = [r[axis] or (0, shape[axis]) for r in ranges]
        edges = sorted({e for span in spans for e in span} | {0, shape[axis]})
        at = {e: i for i, e in enumerate(edges)}
        if any(at[b] != at[a] + 1 for a, b in spans):
            return Cut(ranges)
        return Cut(ranges, axis, tuple(edges[1:-1]), tuple(at[a] for a, _ in spans))

    def __call__(self, t: torch.Tensor) -> list[torch.Tensor]:
        if self.axis is None:
            return [narrowed(t, r) for r in self.ranges]
        pieces = t.tensor_split(self.indices, self.axis)
        return [pieces[i] for i in self.chunks]


@dataclass(frozen=True)
class SharedOperands:
    """How to make every core's operand from one source tensor: cut the source into a few pieces (converted to
    fp32 if ``convert``), cut each piece into the distinct views the cores take, and give each core its view
    (cores with the same slice share one)."""

    sources: Cut
    convert: bool
    views: tuple[Cut, ...]                  # per source piece
    picks: tuple[int, ...]                  # per core: its view, counting the pieces' views in order

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        views = []
        for piece, cut in zip(self.sources(x), self.views):
            views += cut(piece.float() if self.convert else piece)
        return [views[i] for i in self.picks]


@dataclass(frozen=True)
class OnDemand:
    """Every core's operand converted on its own when the core asks for it (a large source)."""

    ranges: tuple[Ranges, ...]

    def __call__(self, x: torch.Tensor) -> Sequence[torch.Tensor]:
        return _Converted(x, self.ranges)


class _Converted(Sequence):
    def __init__(self, x: torch.Tensor, ranges: tuple[Ranges, ...]) -> None:
        self.x, self.ranges = x, ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        return narrowed(self.x, self.ranges[j]).float()


def plan_operands(x: torch.Tensor, ranges: Sequence[Ranges], convert: bool) -> SharedOperands | OnDemand:
    """How to give each core exactly ``narrowed(x, ranges[core])`` -- then ``.float()`` if ``convert`` -- in
    sizes, strides, values and alignment. ``x`` is the real source: the shared layout is checked against real
    per-core conversions of it (once per source layout; the caller keeps the plan)."""
    whole = tuple(None for _ in range(x.dim()))
    if convert and x.dtype != torch.float32 and x.numel() * 4 > SHARE_LIMIT_BYTES:
        return OnDemand(tuple(ranges))
    if not convert or x.dtype == torch.float32:           # .float() of fp32 is the tensor itself: views of x
        convert = False
        wanted: dict[Ranges, dict[Ranges, Ranges]] = {whole: {r: r for r in ranges}}
    else:
        groups = _groups(x, ranges) if x.dtype in EXACT_WIDENING and x.numel() else {}
        wanted = {}
        for r in ranges:
            union, local = groups.get(r, (r, whole))       # not shared: the core's own conversion
            wanted.setdefault(union, {})[r] = local
    order = {r: j for j, r in enumerate(r for cores in wanted.values() for r in cores)}
    sources = Cut.of(x.shape, list(wanted))
    views = tuple(Cut.of(narrowed(x, union).shape, list(cores.values())) for union, cores in wanted.items())
    return SharedOperands(sources, convert, views, tuple(order[r] for r in ranges))


def _groups(x: torch.Tensor, ranges: Sequence[Ranges]) -> dict[Ranges, tuple[Ranges, Ranges]]:
    """Per core ranges that can share a conversion: the union to convert and the core's part of it."""
    sized = [i for i in range(x.dim()) if x.shape[i] > 1]
    if not sized:
        return {}
    outer = max(sized, key=lambda i: x.stride(i))
    members: dict[Ranges, list[Ranges]] = {}
    for r in dict.fromkeys(ranges):
        members.setdefault(r[:outer] + r[outer + 1:], []).append(r)
    shared: dict[Ranges, tuple[Ranges, Ranges]] = {}
    for rs in members.values():
        spans = [r[outer] or (0, x.shape[outer]) for r in rs]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        union = (*rs[0][:outer], (lo, hi) if (lo, hi) != (0, x.shape[outer]) else None, *rs[0][outer + 1:])
        parts = {r: tuple((a - lo, b - lo) if i == outer else None for i in range(x.dim()))
                 for r, (a, b) in zip(rs, spans)}
        converted = narrowed(x, union).float()
        if all(_same_operand(narrowed(converted, parts[r]), narrowed(x, r).float()) for r in rs):
            shared.update((r, (union, parts[r])) for r in rs)
    return shared


def _same_operand(shared: torch.Tensor, own: torch.Tensor) -> bool:
    """Would a kernel see ``shared`` exactly as it sees ``own`` (a fresh conversion)?"""
    return (shared.shape == own.shape and shared.stride() == own.stride() and own.storage_offset() == 0
            and shared.storage_offset() * shared.element_size() % ALIGNMENT == 0 and torch.equal(shared, own))
