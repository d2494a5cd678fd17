"""What an SSA value holds while a KTIR function runs on one core, and the tile ops it records."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TVal:
    """A tensor (or 0-d scalar of a float type) in LX, with the recorded ops that produced it."""

    t: torch.Tensor
    deps: frozenset[int] = frozenset()


@dataclass
class Recorded:
    """One tile op of one core, before shares across cores are known."""

    kind: str                 # load, store, vector, special, matmul, ring_send, ring_recv
    name: str
    deps: tuple[int, ...]
    out: str | None = None
    out_bytes: int = 0
    nbytes: int = 0
    elements: int = 0
    mnk: tuple[int, int, int] = (0, 0, 0)
    key: tuple | None = None  # loads: the sticks read, to find cores loading the same bytes at once
    line: int = 0
    peer: int = -1            # ring ops: the other core, the hops to it, and the tag pairing send and recv
    hops: int = 0
    tag: str = ""


@dataclass
class CoreRun:
    """Everything one core did: its recorded ops, in program order."""

    core: int
    ops: list[Recorded] = field(default_factory=list)

    def add(self, op: Recorded) -> int:
        self.ops.append(op)
        return len(self.ops) - 1
