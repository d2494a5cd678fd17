"""What a work division is: split counts a dim allows, the :class:`WorkDivision` record, core placement, slices.

:mod:`~spyre_lab.compiler.work_division` decides *which* division a kernel gets (span reduction, the matmul
and MLP cost models, the core split); this module holds what every division is made of and what codegen
reads off one: the counts a dim of ``n`` splittable units may be cut into (even, or torch.chunk's uneven
rule), the slice -> physical core placement (K-fast puts reduction partners next to each other on the
ring), ring distances, and each core's ``[start, stop)`` ranges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order (O(sqrt n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in divisors(n) if d <= max(1, limit))


def chunk_counts(n: int, limit: int) -> list[int]:
    """Slice counts ``s <= limit`` for which chunks of ``ceil(n/s)`` units leave no slice empty.

    Every divisor of ``n`` is one; so is every ``s`` where the last chunk is merely short
    (``chunk_counts(769, 32)`` holds 31 but not 32: chunks of 25 fill only 31 slices).
    """
    return [s for s in range(1, min(n, max(1, limit)) + 1) if math.ceil(n / math.ceil(n / s)) == s]


def split_counts(n: int, limit: int, uneven: bool) -> list[int]:
    """The ways one dim of ``n`` units may be split on at most ``limit`` cores."""
    return chunk_counts(n, limit) if uneven else [d for d in divisors(n) if d <= max(1, limit)]


def largest_split(n: int, limit: int, uneven: bool) -> int:
    """Even: the largest divisor <= limit. Uneven: the fewest slices whose chunk is as small as ``limit``
    cores allow (``ceil(n / ceil(n / limit))``), so no core carries more than it must."""
    if n <= 0:
        return 1                                  # an empty dim: nothing to split
    if not uneven:
        return largest_divisor_at_most(n, limit)
    return math.ceil(n / math.ceil(n / max(1, min(limit, n))))


def imbalance(splits: Mapping[str, int], units: Mapping[str, int]) -> float:
    """Work of the busiest core over the mean (1.0 when every split divides its dim evenly)."""
    return math.prod(math.ceil(units[d] / s) * s / units[d] for d, s in splits.items() if d in units and s > 1)


@dataclass(frozen=True)
class MatmulCost:
    """The cost model's score of one (b, m, n, k) split, in modeled µs (all cores in parallel).

    ``total_us = (compute + hbm + psum + tiebreak) * b ** 1.4``.
    """

    compute_us: float
    hbm_us: float
    psum_us: float
    tiebreak_us: float
    b_factor: float = 1.0

    @property
    def total_us(self) -> float:
        return (self.compute_us + self.hbm_us + self.psum_us + self.tiebreak_us) * self.b_factor


@dataclass(frozen=True)
class WorkDivision:
    """How one kernel is spread over the cores.

    ``splits`` maps dim name -> number of slices (reduction dim first, then output dims outermost
    first); slice ``s`` (row-major over ``splits``) runs on physical core ``core_of_slice[s]``.
    """

    splits: dict[str, int]
    core_of_slice: tuple[int, ...]
    strategy: str
    reason: str
    cost: MatmulCost | None = None
    reduction_dims: tuple[str, ...] = field(default=())
    units: dict[str, int] = field(default_factory=dict)  # splittable units per dim (sticks for stick dims)

    @property
    def cores_used(self) -> int:
        return math.prod(self.splits.values())

    @property
    def imbalance(self) -> float:
        """Busiest core's share of the work over the mean: 1.0 for even splits, above it for uneven ones."""
        return imbalance(self.splits, self.units)

    @property
    def uneven(self) -> bool:
        return any(self.units.get(d, s) % s for d, s in self.splits.items())

    def slice_coords(self, slice_index: int) -> dict[str, int]:
        """Position of a slice along each split dim (row-major over ``splits``)."""
        coords: dict[str, int] = {}
        rest = slice_index
        for dim in reversed(list(self.splits)):
            coords[dim] = rest % self.splits[dim]
            rest //= self.splits[dim]
        return {d: coords[d] for d in self.splits}

    def slice_of_core(self) -> dict[int, int]:
        """Physical core -> slice index (the inverse of ``core_of_slice``)."""
        return {core: s for s, core in enumerate(self.core_of_slice)}

    @property
    def split_reduction_dim(self) -> str | None:
        """The one reduction dim split across cores (its partners exchange partial results), if any."""
        return next((d for d in self.reduction_dims if self.splits.get(d, 1) > 1), None)

    def partners(self, slice_index: int) -> list[int]:
        """Slices that share this slice's output tile and differ only in the split reduction dim."""
        red = self.split_reduction_dim
        if red is None:
            return [slice_index]
        coords = self.slice_coords(slice_index)
        return [self._index({**coords, red: r}) for r in range(self.splits[red])]

    def slice_index(self, coords: Mapping[str, int]) -> int:
        """The slice at ``coords`` (a position along each split dim): the inverse of :meth:`slice_coords`."""
        return self._index(coords)

    def _index(self, coords: Mapping[str, int]) -> int:
        index = 0
        for dim, count in self.splits.items():
            index = index * count + coords[dim]
        return index


def ring_hops(a: int, b: int, cores: int) -> int:
    """Hops between two cores on the bi-directional ring."""
    d = abs(a - b) % cores
    return min(d, cores - d)


def placement(splits: Mapping[str, int], reduction_dim: str | None, k_fast: bool) -> tuple[int, ...]:
    """Slice index -> physical core.

    Slices are numbered with the reduction dim slowest, so without K-fast placement (identity) the
    partners of an output tile are ``m*n`` cores apart. With it, physical core ``c`` runs slice
    ``perm[c] = (c % k) * (m*n) + c // k``, which puts the ``k`` partners on consecutive cores.
    """
    used = math.prod(splits.values())
    k = splits.get(reduction_dim, 1) if reduction_dim else 1
    if not k_fast or k == 1:
        return tuple(range(used))
    mn = used // k
    perm = [(c % k) * mn + c // k for c in range(used)]  # physical core -> slice
    core_of_slice = [0] * used
    for core, s in enumerate(perm):
        core_of_slice[s] = core
    return tuple(core_of_slice)



def slice_ranges(division: WorkDivision, extents: Mapping[str, int], stick_dims: Sequence[str],
                 eps: int, cores: int) -> list[dict[str, tuple[int, int]]]:
    """Per physical core: dim -> [start, stop) of the iteration space it computes ({} = idle core).

    Stick dims are cut on stick boundaries; the last slice absorbs the padded tail. Every slice is a chunk
    of ``ceil(units / count)`` units but the last, which is short when the split is uneven.
    """
    per_core: list[dict[str, tuple[int, int]]] = [{} for _ in range(cores)]
    for s, core in enumerate(division.core_of_slice):
        coords = division.slice_coords(s)
        ranges = {}
        for dim, extent in extents.items():
            count = division.splits.get(dim, 1)
            if dim in stick_dims:
                sticks = math.ceil(math.ceil(extent / eps) / count)
                start = coords.get(dim, 0) * sticks * eps
                stop = min(extent, start + sticks * eps)
            else:
                step = math.ceil(extent / count)
                start = coords.get(dim, 0) * step
                stop = min(extent, start + step)
            ranges[dim] = (start, stop)
        per_core[core] = ranges
    return per_core
