"""Ring partners of one shape, walked once: the analytic model's shortcut for split-reduction kernels.

A kernel that splits its reduction over K gives every group of partner cores the same work: codegen emits
one partner's program and hands the same rank of every other group those very ``TileOp`` objects, with only
the ring ops swapped for ones that talk to the new partners (``compiler.spec_common``). Such cores are not
one program (their ring ops differ), but what the analytic pass computes for them differs only through
the numbers their ring ops read: the time a receive's send lands, a send's hop count and size. So a core
is timed as a copy of an earlier one of its shape when the two cores run at the same DRAM rate and their
receives see the same landing times; its sends then end when the earlier core's did (see
:func:`~spyre_lab.device.sim_analytic.run_analytic`). The answer is the one the full pass would give, bit
for bit: the pass is a function of exactly those inputs.

Finding the shapes costs a comparison of object identities per op (in C: ``map(is_not, ...)``), not a walk
of the ops in Python, so a kernel with no partners pays next to nothing for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import attrgetter, is_, is_not

from spyre_lab.device.isa import CoreOps, OpKind, TileOp

_SEND, _RECV = OpKind.RING_SEND, OpKind.RING_RECV
_kind = attrgetter("kind")


@dataclass(frozen=True, slots=True)
class PartnerShape:
    """The first core of a shape (``first``) and where its ring ops sit: the indices of its receives and of its
    sends, the same in every core of the shape."""

    first: int
    recvs: tuple[int, ...]
    sends: tuple[int, ...]


def partner_shapes(programs: Sequence[CoreOps], active: Sequence[int], same_as: dict[int, int]
                   ) -> dict[int, PartnerShape]:
    """Core -> its :class:`PartnerShape`, for every core (the first one included) whose program is another
    active core's ops but for the peers and tags of its ring ops. Cores that share one program object
    (``same_as``), cores without ring ops, and cores with a ring op to themselves are left out."""
    shapes: dict[int, PartnerShape] = {}
    firsts: list[int] = []
    rings: dict[int, PartnerShape | None] = {}
    for c in active:
        if same_as[c] != c:
            continue
        ops = programs[c].ops
        for r in firsts:
            other = programs[r].ops
            if len(other) != len(ops) or other[0] is not ops[0]:
                continue
            if r not in rings:
                rings[r] = _ring_ops(other, r)
            shape = rings[r]
            if shape is not None and _same_but_peers(other, ops, shape, c):
                shapes[r] = shapes[c] = shape
                break
        else:
            firsts.append(c)
    return shapes


def _ring_ops(ops: list[TileOp], core: int) -> PartnerShape | None:
    """Where ``ops``' ring ops sit (None when it has none, or one of them talks to its own core)."""
    kinds = list(map(_kind, ops))
    recvs = tuple(compress(count(), map(is_, kinds, repeat(_RECV))))
    sends = tuple(compress(count(), map(is_, kinds, repeat(_SEND))))
    if not (recvs or sends) or any(ops[j].peer == core for j in (*recvs, *sends)):
        return None
    return PartnerShape(core, recvs, sends)


def _same_but_peers(first: list[TileOp], ops: list[TileOp], shape: PartnerShape, core: int) -> bool:
    """Whether ``ops`` are ``first``'s op objects except ring ops of the same kind, deps, size, hops and LX claim
    (whatever their peer and tag), none of them to ``core`` itself."""
    ring = {*shape.recvs, *shape.sends}
    for j in compress(count(), map(is_not, first, ops)):
        a, b = first[j], ops[j]
        if j not in ring or a.kind is not b.kind or a.deps != b.deps or a.nbytes != b.nbytes or a.hops != b.hops \
                or a.out_bytes != b.out_bytes:
            return False
    return not any(ops[j].peer == core for j in ring)
