"""KTIR's inter-tile communication: ``ktdp.inter_tile_produce`` / ``inter_tile_reduce`` over the ring.

A produce offers this core's partial to its reduce group (``producer_tiles_per_group``, an affine set
over the tile id ``i`` with the group ``g`` as symbol; the future's type lists the groups). A reduce
folds the group's partials, from the ``identity``, through its region, on each core of
``consumer_tiles_per_group``. Cores still run one at a time in tile-id order over one memory; a
consumer that reaches its reduce before every producer has produced hands the turn to the next core
and resumes once they have (:class:`Turns`).

Modeled cost, as the compiler's split reductions: the partials travel as a chain down the producers in
tile-id order (producer r receives r + 1's running sum, adds its own in one SFU pass, and sends on to
r - 1), so the first producer ends with the total; any other consumer receives it from there.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spyre_lab.compiler.work_slices import ring_hops
from spyre_lab.ktir.affine import AffineSet, parse_set
from spyre_lab.ktir.errors import KTIRUnsupported
from spyre_lab.ktir.syntax import Op
from spyre_lab.ktir.values import CoreRun, Recorded, TVal

Core = Any  # spyre_lab.ktir.interpret.Core, which imports this module


class _Stopped(Exception):
    """Another core failed: this one stops where it waits."""


class Turns:
    """Cores as threads of which exactly one runs at a time: tile-id order, a waiting core gives way."""

    def __init__(self, cores: int, ring_cores: int) -> None:
        self.cores, self.ring_cores = cores, ring_cores
        self.cond = threading.Condition()
        self.turn = 0
        self.waiting: dict[int, Callable[[], bool] | None] = {c: None for c in range(cores)}
        self.done: set[int] = set()
        self.error: BaseException | None = None
        self.partials: dict[tuple, dict[int, TVal]] = {}
        self.totals: dict[tuple, torch.Tensor] = {}

    def run(self, body: Callable[[int], None]) -> None:
        threads = [threading.Thread(target=self._main, args=(c, body), daemon=True) for c in range(self.cores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.error is not None:
            raise self.error

    def _main(self, c: int, body: Callable[[int], None]) -> None:
        with self.cond:
            while self.turn != c and self.error is None:
                self.cond.wait()
        try:
            if self.error is None:
                body(c)
        except _Stopped:
            pass
        except BaseException as e:  # handed to run(), which raises it in the caller's thread
            with self.cond:
                self.error = self.error or e
        with self.cond:
            self.done.add(c)
            self._hand_on(c)

    def wait_until(self, c: int, ready: Callable[[], bool], op: Op) -> None:
        """Block core ``c`` until ``ready()``, letting the other cores run meanwhile."""
        with self.cond:
            if ready():
                return
            self.waiting[c] = ready
            self._hand_on(c, op)
            while self.turn != c and self.error is None:
                self.cond.wait()
            self.waiting[c] = None
            if self.error is not None:
                raise _Stopped()

    def _hand_on(self, c: int, op: Op | None = None) -> None:
        for k in range(1, self.cores + 1):
            j = (c + k) % self.cores
            if j in self.done:
                continue
            ready = self.waiting[j]
            if ready is None or ready():
                self.turn = j
                self.cond.notify_all()
                return
        if len(self.done) < self.cores and self.error is None:
            where = (op.name, op.line) if op is not None else ("ktdp.inter_tile_reduce", 0)
            self.error = KTIRUnsupported(*where, "every core left waits for partials no core will produce "
                                                 "(check producer_tiles_per_group against the grid)")
        self.cond.notify_all()


@dataclass
class Future:
    """What a produce gives its core: the group, the producers (tile-id order) and the exchange key."""

    key: tuple
    group: int
    producers: list[int]
    partial: TVal


class Absent:
    """A reduce's result on a core outside the consumer set: using it is an error."""


def _set_after(op: Op, key: str, core: Core) -> AffineSet:
    toks = op.body
    for i, t in enumerate(toks[:-2]):
        if t.text == key and toks[i + 1].text == "=":
            v = toks[i + 2]
            text = core.aliases[v.text].text if v.text in core.aliases else v.text
            return parse_set(text, v.line, v.col)
    raise KTIRUnsupported(op.name, op.line, f"needs {key} = <affine set over (i)[g]>")


def _groups(op: Op) -> list[int]:
    future = next((t for t in op.body if t.kind == "type" and t.text.startswith("!ktdp.tile_future")), None)
    m = re.search(r"groups\s*=\s*(affine_set<.*>)>$", future.text) if future is not None else None
    if m is None:
        raise KTIRUnsupported(op.name, op.line, "needs a !ktdp.tile_future<T, groups = affine_set<(g) : ...>> type")
    groups = parse_set(m.group(1), future.line, future.col)
    return [g for g in range(1024) if groups.contains([g])]


def produce(core: Core, op: Op) -> Future:
    turns: Turns = core.turns
    me = core.run.core
    members = _set_after(op, "producer_tiles_per_group", core)
    mine = [g for g in _groups(op) if members.contains([me], [g])]
    if len(mine) != 1 or len(op.regions) != 1:
        raise KTIRUnsupported(op.name, op.line, f"tile {me} must produce into exactly one group (got {mine}) "
                                                "from one region")
    g = mine[0]
    producers = [i for i in range(turns.cores) if members.contains([i], [g])]
    count = core.counts[op.line] = core.counts.get(op.line, 0) + 1
    yielded = core.block(op.regions[0], [g])
    if len(yielded) != 1 or not isinstance(yielded[0], TVal):
        raise KTIRUnsupported(op.name, op.line, "the region must ktdp.yield_partial one tensor")
    key = (op.line, count, g)
    with turns.cond:
        turns.partials.setdefault(key, {})[me] = yielded[0]
    return Future(key, g, producers, yielded[0])


def reduce(core: Core, op: Op) -> TVal | Absent:
    turns: Turns = core.turns
    me = core.run.core
    names = op.values()
    fut, identity = core.get(names[0], op), core.get(names[1], op) if len(names) > 1 else None
    if not isinstance(fut, Future) or not isinstance(identity, TVal) or len(op.regions) != 1:
        raise KTIRUnsupported(op.name, op.line, "reads (%future) ..., identity(%init : T) and one combiner region")
    consumers = [i for i in range(turns.cores) if _set_after(op, "consumer_tiles_per_group", core).contains(
        [i], [fut.group])]
    chain, first = fut.producers, fut.producers[0]
    done = _chain_step(core.run, fut, turns.ring_cores) if me in chain else frozenset()
    if me not in consumers:
        return Absent()
    if me != first and me not in chain:
        raise KTIRUnsupported(op.name, op.line, f"consumer {me} is no producer of group {fut.group}")
    turns.wait_until(me, lambda: len(turns.partials.get(fut.key, {})) == len(chain), op)
    total = _fold(core, op, identity, [turns.partials[fut.key][i] for i in chain])
    if me == first:
        for c in consumers:
            if c != first:
                done = frozenset({core.run.add(Recorded("ring_send", f"send total {fut.key} -> {c}", tuple(done),
                                             nbytes=_nbytes(fut.partial), peer=c,
                                             hops=max(1, ring_hops(me, c, turns.ring_cores)),
                                             tag=f"{_tag(fut)}:total->{c}", line=op.line))})
        return TVal(total, done)
    recv = core.run.add(Recorded("ring_recv", f"recv total {fut.key}", tuple(done), out=f"total@{op.line}",
                                 out_bytes=_nbytes(fut.partial), nbytes=_nbytes(fut.partial), peer=first,
                                 tag=f"{_tag(fut)}:total->{me}", line=op.line))
    return TVal(total, frozenset({recv}))


def _fold(core: Core, op: Op, identity: TVal, partials: Sequence[TVal]) -> torch.Tensor:
    """identity + p0 + (p1 + (... + pn)): the chain's order, through the combiner region (its cost is the chain's)."""
    run, core.run = core.run, CoreRun(core.run.core)
    try:
        acc = partials[-1]
        for p in reversed(partials[:-1]):
            acc = _combine(core, op, p, acc)
        return _combine(core, op, identity, acc).t
    finally:
        core.run = run


def _combine(core: Core, op: Op, lhs: TVal, rhs: TVal) -> TVal:
    out = core.block(op.regions[0], [lhs, rhs])
    if len(out) != 1 or not isinstance(out[0], TVal):
        raise KTIRUnsupported(op.name, op.line, "the combiner region must ktdp.yield_reduced one tensor")
    return TVal(out[0].t)


def _chain_step(run: CoreRun, fut: Future, ring_cores: int) -> frozenset[int]:
    """This producer's part of the chain: receive r + 1's running sum, add own, send to r - 1.

    Returns the ops after which this producer is done (its partial's own ops when it is alone)."""
    chain, me = fut.producers, run.core
    r = chain.index(me)
    nbytes, elements = _nbytes(fut.partial), max(1, fut.partial.t.numel())
    deps = tuple(sorted(fut.partial.deps))
    done = deps[-1] if deps else -1
    if r + 1 < len(chain):
        recv = run.add(Recorded("ring_recv", f"recv partial {fut.key}", deps, out="partial_in", out_bytes=nbytes,
                                nbytes=nbytes, peer=chain[r + 1], tag=f"{_tag(fut)}:{r + 1}->{r}"))
        done = run.add(Recorded("vector", f"add partial {fut.key}", tuple(sorted({*deps, recv})),
                                elements=elements))
    if r > 0:
        done = run.add(Recorded("ring_send", f"send partial {fut.key}", (done,) if done >= 0 else (),
                                nbytes=nbytes, peer=chain[r - 1],
                                hops=max(1, ring_hops(me, chain[r - 1], ring_cores)), tag=f"{_tag(fut)}:{r}->{r - 1}"))
    return frozenset({done}) if done >= 0 else frozenset(deps)


def _nbytes(v: TVal) -> int:
    return v.t.numel() * v.t.element_size()


def _tag(fut: Future) -> str:
    line, count, g = fut.key
    return f"L{line}:g{g}:n{count}"
