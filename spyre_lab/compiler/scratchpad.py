"""Scratchpad (LX) planning: fixed LX addresses for a kernel's buffers, the same on every core.

LX has no cache and no eviction: every buffer gets one address for its whole life, chosen at
compile time. A buffer lives over the schedule steps ``[start, end]`` (inclusive); two buffers
whose lives intersect may not overlap in address, with one exception: an op that works in place
(``exp``, ``sub``, ``add``, ``rsqrt`` in torch-spyre) may write its result into its input's slot
when the input dies at the step the result is born (``in_place_parent``).

Three solvers, as in torch-spyre (docs: compiler/scratchpad_planning.md):

* ``greedy`` - chronological: take buffers in order of birth, reuse the in-place parent's slot when
  allowed, else the lowest address that fits between the live buffers.
* ``first_fit`` / ``best_fit`` - see every buffer up front, place the shortest-lived first, each at
  the lowest (first-fit) or the tightest (best-fit) gap among already placed buffers it overlaps.

A plan that does not fit the budget raises :class:`~spyre_lab.device.isa.LXOverflowError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spyre_lab.device.isa import LXOverflowError

STRATEGIES = ("greedy", "first_fit", "best_fit")


@dataclass(frozen=True)
class LXBuffer:
    """One buffer to place: ``size`` bytes live over schedule steps ``[start, end]``."""

    name: str
    size: int
    start: int
    end: int
    in_place_parent: str | None = None


@dataclass
class LXPlan:
    """Per-core LX offsets (identical on every core), sizes, and the high-water mark ``peak``."""

    offsets: dict[str, int]
    sizes: dict[str, int]
    peak: int
    budget: int
    strategy: str
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.budget - self.peak

    def end(self, name: str) -> int:
        """One past the last byte of ``name``."""
        return self.offsets[name] + self.sizes[name]

    def explain(self) -> str:
        rows = [f"LX plan ({self.strategy}): peak {self.peak:,} of {self.budget:,} B per core"]
        for name in sorted(self.offsets, key=lambda n: (self.offsets[n], n)):
            life = self.lifetimes.get(name)
            when = f" steps {life[0]}-{life[1]}" if life else ""
            rows.append(f"  [{self.offsets[name]:>9,} .. {self.end(name):>9,})  {name}{when}")
        return "\n".join(rows)


def _conflict(a: LXBuffer, b: LXBuffer) -> bool:
    """Do ``a`` and ``b`` need disjoint addresses? (Lives intersect, unless one is the other's in-place parent
    handing over its slot at the step the child is born.)"""
    if a.end < b.start or b.end < a.start:
        return False
    if a.in_place_parent == b.name and b.end == a.start:
        return False
    return not (b.in_place_parent == a.name and a.end == b.start)


def _gaps(occupied: list[tuple[int, int]]) -> list[tuple[int, int | None]]:
    """Free address ranges ``(start, stop)`` between occupied ranges; the last one is open-ended (None)."""
    gaps: list[tuple[int, int | None]] = []
    cursor = 0
    for lo, hi in sorted(occupied):
        if lo > cursor:
            gaps.append((cursor, lo))
        cursor = max(cursor, hi)
    gaps.append((cursor, None))
    return gaps


def _choose(occupied: list[tuple[int, int]], size: int, best_fit: bool) -> int:
    fitting = [(lo, hi) for lo, hi in _gaps(occupied) if hi is None or hi - lo >= size]
    if best_fit:
        bounded = [(hi - lo, lo) for lo, hi in fitting if hi is not None]
        if bounded:
            return min(bounded)[1]
    return fitting[0][0]


def _validate(buffers: Sequence[LXBuffer]) -> dict[str, LXBuffer]:
    by_name: dict[str, LXBuffer] = {}
    for b in buffers:
        if b.name in by_name:
            raise ValueError(f"LX buffer {b.name!r} is listed twice; buffer names must be unique")
        if not isinstance(b.size, int) or b.size <= 0:
            raise ValueError(f"LX buffer {b.name!r} has size {b.size!r}; sizes are positive byte counts")
        if b.end < b.start:
            raise ValueError(f"LX buffer {b.name!r} ends (step {b.end}) before it starts (step {b.start})")
        by_name[b.name] = b
    for b in buffers:
        if b.in_place_parent is not None and b.in_place_parent not in by_name:
            raise ValueError(f"LX buffer {b.name!r} names in-place parent {b.in_place_parent!r}, which is not "
                             "one of the buffers")
    return by_name


def plan_scratchpad(buffers: Sequence[LXBuffer], budget: int, strategy: str = "greedy", kernel: str = "",
                    core: int = 0) -> LXPlan:
    """Give every buffer an LX offset; raise :class:`LXOverflowError` if the plan passes ``budget`` bytes."""
    if strategy not in STRATEGIES:
        raise ValueError(f"LX allocator must be one of {STRATEGIES}, got {strategy!r}")
    by_name = _validate(buffers)
    if strategy == "greedy":
        order = sorted(buffers, key=lambda b: (b.start, b.end, b.name))
    else:
        order = sorted(buffers, key=lambda b: (b.end - b.start, b.start, -b.size, b.name))
    offsets: dict[str, int] = {}
    for buf in order:
        placed = [by_name[n] for n in offsets]
        clashing = [p for p in placed if _conflict(buf, p)]
        occupied = [(offsets[p.name], offsets[p.name] + p.size) for p in clashing]
        parent = by_name.get(buf.in_place_parent) if buf.in_place_parent else None
        offset = None
        if strategy == "greedy" and parent is not None and parent.name in offsets and parent.end == buf.start:
            lo = offsets[parent.name]
            if buf.size <= parent.size and all(hi <= lo or l0 >= lo + buf.size for l0, hi in occupied):
                offset = lo
        if offset is None:
            offset = _choose(occupied, buf.size, best_fit=strategy == "best_fit")
        if offset + buf.size > budget:
            live = sum(p.size for p in placed if p.start <= buf.start <= p.end and _conflict(buf, p))
            raise LXOverflowError(kernel, core, buf.size, live, budget)
        offsets[buf.name] = offset
    ordered = {b.name: offsets[b.name] for b in buffers}
    return LXPlan(
        offsets=ordered,
        sizes={b.name: b.size for b in buffers},
        peak=max((offsets[b.name] + b.size for b in buffers), default=0),
        budget=budget,
        strategy=strategy,
        lifetimes={b.name: (b.start, b.end) for b in buffers},
    )
