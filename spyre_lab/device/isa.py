"""The device's tile "ISA": what one core is asked to do, as a list of tile operations.

A kernel, once the compiler has divided and planned it, is for every core a small dataflow
graph: ``load`` sticks from DRAM into an LX buffer, run ``matmul`` on the corelets' PE arrays
or ``vector``/``special`` ops on the SFUs over buffers already in LX, exchange partial results
over the ``ring``, and ``store`` results back to DRAM. Dependencies are explicit, so the
simulator can apply the dataflow firing rule (an op fires when its operands are resident and
its unit is free) instead of running the list in order.

Buffers: an op with ``out`` claims ``out_bytes`` of its core's LX when it starts and the space
is released once every op that depends on it has finished. That single rule is what bounds
double buffering: loads run ahead only while LX has room.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum


class OpKind(StrEnum):
    LOAD = "load"
    STORE = "store"
    MATMUL = "matmul"
    VECTOR = "vector"
    SPECIAL = "special"
    RING_SEND = "ring_send"
    RING_RECV = "ring_recv"


UNIT_OF: dict[OpKind, str] = {
    OpKind.LOAD: "load",
    OpKind.STORE: "store",
    OpKind.MATMUL: "pt",
    OpKind.VECTOR: "sfu",
    OpKind.SPECIAL: "sfu",
    OpKind.RING_SEND: "ring",
    OpKind.RING_RECV: "ring",
}
"""The per-core unit (and trace lane suffix) each kind of op occupies."""

UNITS: tuple[str, ...] = ("load", "pt", "sfu", "store", "ring")

_set_state = object.__setattr__
_new_op = object.__new__


@dataclass(frozen=True, init=False, slots=True)
class TileOp:
    """One operation on one core.

    ``deps`` index earlier ops *of the same core*. Ring ops pair up across cores by ``tag``:
    a ``ring_recv`` completes when the ``ring_send`` with the same tag on ``peer`` has moved
    its bytes.

    Immutable, equal and hashable by its fields like any frozen dataclass. A kernel plan builds hundreds of
    thousands of these, so it is slotted (152 bytes an op, against 208 with an instance dict) and its
    ``__init__`` sets each slot directly instead of through the frozen class's ``__setattr__`` check.
    """

    kind: OpKind
    name: str
    deps: tuple[int, ...] = ()
    out: str | None = None
    out_bytes: int = 0
    nbytes: int = 0
    m: int = 0
    n: int = 0
    k: int = 0
    elements: int = 0
    peer: int | None = None
    hops: int = 0
    tag: str | None = None
    share: int = 1

    def __init__(self, kind: OpKind, name: str, deps: tuple[int, ...] = (), out: str | None = None,
                 out_bytes: int = 0, nbytes: int = 0, m: int = 0, n: int = 0, k: int = 0, elements: int = 0,
                 peer: int | None = None, hops: int = 0, tag: str | None = None, share: int = 1) -> None:
        put = _set_state
        put(self, "kind", kind)
        put(self, "name", name)
        put(self, "deps", deps)
        put(self, "out", out)
        put(self, "out_bytes", out_bytes)
        put(self, "nbytes", nbytes)
        put(self, "m", m)
        put(self, "n", n)
        put(self, "k", k)
        put(self, "elements", elements)
        put(self, "peer", peer)
        put(self, "hops", hops)
        put(self, "tag", tag)
        put(self, "share", share)

    def evolved(self, **changes: object) -> TileOp:
        """This op with ``changes`` to some fields (``dataclasses.replace`` without its per-call overhead)."""
        op = _new_op(TileOp)
        for name in _TILE_OP_FIELDS:
            _set_state(op, name, changes[name] if name in changes else getattr(self, name))
        return op

    def dram_weight(self, broadcast_cores: int) -> float:
        """Share of DRAM bandwidth this transfer draws: a load broadcast to ``share`` cores is read once."""
        return 1.0 / min(self.share, broadcast_cores)

    @property
    def unit(self) -> str:
        return UNIT_OF[self.kind]

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k if self.kind is OpKind.MATMUL else self.elements


_TILE_OP_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TileOp))


@dataclass
class CoreOps:
    """The ordered tile operations of one core. Appending returns the op's index for ``deps``."""

    ops: list[TileOp] = field(default_factory=list)

    def _append(self, op: TileOp) -> int:
        for d in op.deps:
            if not 0 <= d < len(self.ops):
                raise ValueError(f"op {op.name!r} depends on op {d}, which is not an earlier op of this core")
        if op.out is not None and op.out_bytes <= 0:
            raise ValueError(f"op {op.name!r} writes LX buffer {op.out!r} but gives it {op.out_bytes} bytes")
        self.ops.append(op)
        return len(self.ops) - 1

    def load(self, out: str, nbytes: int, deps: Iterable[int] = (), name: str | None = None, share: int = 1) -> int:
        """DRAM -> LX: ``nbytes`` (whole sticks) into a new LX buffer ``out``.

        ``share`` is how many cores load these same bytes at once (e.g. a weight tile every M-split
        core needs): DRAM serves one broadcast to the group instead of ``share`` separate reads.
        """
        if share < 1:
            raise ValueError(f"load {out!r}: share must be at least 1 core, got {share}")
        return self._append(TileOp(OpKind.LOAD, name or f"load {out}", tuple(deps), out, nbytes, nbytes=nbytes,
                                   share=share))

    def store(self, nbytes: int, deps: Iterable[int], name: str = "store") -> int:
        """LX -> DRAM: write ``nbytes`` of the buffers produced by ``deps`` back to DRAM."""
        return self._append(TileOp(OpKind.STORE, name, tuple(deps), nbytes=nbytes))

    def matmul(self, out: str | None, m: int, n: int, k: int, deps: Iterable[int], out_bytes: int = 0,
               name: str | None = None) -> int:
        """``out[m,n] = a[m,k] @ b[k,n]`` on the core's PE arrays, operands already in LX.

        ``out=None`` accumulates (``+=``) into a buffer an earlier op claimed instead of claiming a
        new one; list that op in ``deps`` so the accumulator stays claimed while this op runs.
        """
        if out is None and out_bytes:
            raise ValueError(f"an accumulating matmul (out=None) claims no LX, but got out_bytes={out_bytes}")
        return self._append(TileOp(OpKind.MATMUL, name or f"matmul {m}x{n}x{k}", tuple(deps), out, out_bytes,
                                   m=m, n=n, k=k))

    def vector(self, out: str | None, elements: int, deps: Iterable[int], out_bytes: int = 0,
               name: str = "vector") -> int:
        """An elementwise or reduction pass of ``elements`` on the SFU (add, mul, max, sum, ...).

        ``out=None`` works in place on a buffer an earlier op in ``deps`` claimed.
        """
        return self._append(TileOp(OpKind.VECTOR, name, tuple(deps), out, out_bytes, elements=elements))

    def special(self, out: str | None, elements: int, deps: Iterable[int], out_bytes: int = 0,
                name: str = "special") -> int:
        """A transcendental pass on the SFU (exp, rsqrt, sigmoid, ...): several SFU passes per element."""
        return self._append(TileOp(OpKind.SPECIAL, name, tuple(deps), out, out_bytes, elements=elements))

    def ring_send(self, nbytes: int, peer: int, hops: int, tag: str, deps: Iterable[int],
                  name: str | None = None) -> int:
        """Send ``nbytes`` from LX to core ``peer``, ``hops`` ring hops away."""
        if hops < 1:
            raise ValueError(f"ring_send {tag!r} to core {peer} needs at least one hop, got {hops}")
        return self._append(TileOp(OpKind.RING_SEND, name or f"send {tag}", tuple(deps), nbytes=nbytes,
                                   peer=peer, hops=hops, tag=tag))

    def ring_recv(self, out: str, nbytes: int, peer: int, tag: str, deps: Iterable[int] = (),
                  name: str | None = None) -> int:
        """Receive the ``ring_send`` tagged ``tag`` from core ``peer`` into a new LX buffer ``out``."""
        return self._append(TileOp(OpKind.RING_RECV, name or f"recv {tag}", tuple(deps), out, nbytes,
                                   nbytes=nbytes, peer=peer, tag=tag))

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[TileOp]:
        return iter(self.ops)


@dataclass
class TileProgram:
    """One launch: a :class:`CoreOps` per core (index = core id; empty programs are idle cores)."""

    name: str
    programs: list[CoreOps]

    def __post_init__(self) -> None:
        sends: dict[tuple[int, str | None], TileOp] = {}
        recvs: list[tuple[int, TileOp]] = []
        send_kind, recv_kind = OpKind.RING_SEND, OpKind.RING_RECV
        for c, p in enumerate(self.programs):  # one pass: kernels can hold a million ops
            for op in p.ops:
                kind = op.kind
                if kind is send_kind:
                    sends[(c, op.tag)] = op
                elif kind is recv_kind:
                    recvs.append((c, op))
        for c, op in recvs:
            send = sends.get((op.peer, op.tag))
            if send is None or send.peer != c:
                raise ValueError(f"core {c}: {op.name!r} waits for a ring_send tagged {op.tag!r} "
                                 f"from core {op.peer} to core {c}, and there is none")

    @classmethod
    def from_programs(cls, name: str, programs: Sequence[CoreOps], cores: int) -> TileProgram:
        """Pad to ``cores`` programs so idle cores are explicit."""
        if len(programs) > cores:
            raise ValueError(f"kernel {name!r} has {len(programs)} core programs but the device has {cores} cores")
        return cls(name, list(programs) + [CoreOps() for _ in range(cores - len(programs))])

    @property
    def active_cores(self) -> list[int]:
        return [c for c, p in enumerate(self.programs) if len(p)]

    @property
    def num_ops(self) -> int:
        return sum(len(p) for p in self.programs)

    def total(self, attr: str, kind: OpKind | None = None) -> int:
        """Sum of an op field (``nbytes``, ``flops``, ``elements``) over all cores, optionally one kind."""
        return sum(getattr(op, attr) for p in self.programs for op in p if kind is None or op.kind is kind)


class LXOverflowError(RuntimeError):
    """A core's LX scratchpad cannot hold what a kernel asks of it."""

    def __init__(self, kernel: str, core: int, requested: int, in_use: int, capacity: int) -> None:
        self.kernel, self.core, self.requested, self.in_use, self.capacity = kernel, core, requested, in_use, capacity
        super().__init__(
            f"kernel {kernel!r}, core {core}: needs {requested:,} B of LX with {in_use:,} B already in use, "
            f"but LX holds {capacity:,} B; tile the kernel smaller (fewer rows per tile) or free buffers sooner"
        )
