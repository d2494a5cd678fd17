"""Every core's fp32 partial product of a split matmul in one batched call, where that is the same bit for bit.

The per-core emulation (`per_core`) gives each core of a K-split matmul its own ``torch.matmul`` on its fp32
operands: a decode step's [1, 64] x [64, 64] core products cost one ATen call each, sixteen per kernel, more
than the arithmetic. Stacking the cores' operands and calling ``torch.bmm`` once computes the same products,
but only if the BLAS runs each batch entry with the kernel, blocking and accumulation order it chooses for the
lone matrix: it picks them from sizes, strides and alignment, and a stacked entry starts where the one before
ends, not at a fresh allocation's alignment. So the batched call is used only for operand shapes where it was
checked to equal the per-core calls: once per pair of shapes, on random fp16-valued operands laid out as a
per-core conversion lays them out (dense, freshly allocated), and once more on the first launch's own operands.
Shapes that fail either check keep their per-core calls.

A stacked operand made from a per-core list the emulation keeps for an unchanged source (a weight,
the plan's ``kept``) is kept with that list: the same list object means the same values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_EXACT: dict[tuple[int, tuple[int, ...], tuple[int, ...]], bool] = {}
"""(cores, core operand shapes) -> does one bmm give every core's matmul bit for bit on this machine's BLAS?"""

_CHECK_SEED = 20240601


def _exact_for(cores: int, left: tuple[int, ...], right: tuple[int, ...]) -> bool:
    key = (cores, left, right)
    exact = _EXACT.get(key)
    if exact is None:
        gen = torch.Generator().manual_seed(_CHECK_SEED)
        a = [torch.randn(left, generator=gen).half().float() for _ in range(cores)]
        b = [torch.randn(right, generator=gen).half().float() for _ in range(cores)]
        exact = _EXACT[key] = _equal([torch.matmul(x, y) for x, y in zip(a, b)], torch.bmm(torch.stack(a),
                                                                                           torch.stack(b)))
    return exact


def _equal(each: Sequence[torch.Tensor], batched: torch.Tensor) -> bool:
    return all(torch.equal(x, y) for x, y in zip(each, batched.unbind(0)))


class BatchedMatmuls:
    """One kernel's per-core partial products (``left[c] @ right[c]`` for every busy core), as one ``bmm`` where
    that was checked to be exact (see module doc), else core by core."""

    __slots__ = ("_batched", "_kept", "_rows")

    def __init__(self) -> None:
        self._batched: bool | None = None             # decided at the first call
        self._kept: list[tuple[Sequence[torch.Tensor], torch.Tensor] | None] = [None, None]
        self._rows: tuple[list[list[int]], list[torch.Tensor]] | None = None

    def __call__(self, left: Sequence[torch.Tensor], right: Sequence[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        """The core products: one [cores, M, N] tensor where batched, else a list of each core's [M, N]."""
        if self._batched is None:
            self._batched = self._decide(left, right)
        if not self._batched:
            return [torch.matmul(a, b) for a, b in zip(left, right)]
        return torch.bmm(self._stacked(0, left), self._stacked(1, right))

    def combined_rows(self, blocks: list[list[int]], partial_axis: int, stacked: torch.Tensor) -> torch.Tensor:
        """``per_core._combine_rows`` before the rounding, on stacked products: every block's k-th partner's
        product, for all blocks at once, added to the running sum in partner order, then laid out as the rows'
        concatenation along ``partial_axis``. The adds are elementwise, so every element meets the same partials
        in the same order as when the rows are concatenated first."""
        if self._rows is None or self._rows[0] is not blocks:
            self._rows = (blocks, [torch.tensor([b[k] for b in blocks]) for k in range(len(blocks[0]))])
        total = None
        for index in self._rows[1]:
            part = stacked.index_select(0, index)     # [blocks, M, N of a core]
            total = part if total is None else torch.add(total, part)
        count, m, n = total.shape
        if partial_axis == 1:
            return total.permute(1, 0, 2).reshape(m, count * n)
        return total.reshape(count * m, n)

    def _stacked(self, side: int, operands: Sequence[torch.Tensor]) -> torch.Tensor:
        kept = self._kept[side]
        if kept is not None and kept[0] is operands:
            return kept[1]
        stacked = torch.stack(list(operands))
        self._kept[side] = (operands, stacked) if isinstance(operands, list) else None
        return stacked

    def _decide(self, left: Sequence[torch.Tensor], right: Sequence[torch.Tensor]) -> bool:
        if not (isinstance(left, list) and isinstance(right, list)) or len(left) != len(right) or len(left) < 2:
            return False                              # operands converted on demand (large sources): per core
        a, b = left[0], right[0]
        if a.dim() != 2 or b.dim() != 2 or a.dtype != torch.float32 or b.dtype != torch.float32:
            return False
        if any(x.shape != a.shape for x in left) or any(y.shape != b.shape for y in right):
            return False
        if not _exact_for(len(left), tuple(a.shape), tuple(b.shape)):
            return False
        return _equal([torch.matmul(x, y) for x, y in zip(left, right)],
                      torch.bmm(torch.stack(left), torch.stack(right)))
