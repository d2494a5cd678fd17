"""Run one KTIR function on one core: evaluate its ops on torch tensors and record the tile ops it costs.

Scalar index arithmetic is free; a load or store of DRAM memory costs the sticks it touches; an
elementwise ``arith`` / ``math`` op or a ``linalg.reduce`` on a tensor is one SFU pass over its elements
(transcendentals on the SFU's special path); a ``linalg.matmul`` runs on the PE array. Free reshapes
(``tensor.splat``, ``extract``, ``expand_shape``, ``empty``, ``linalg.fill``) carry their sources'
dependencies along. This is ktir-cpu's latency model's op categories, mapped onto spyre_lab's tile ISA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spyre_lab.ktir import exchange, handlers, slices
from spyre_lab.ktir.errors import KTIRUnsupported
from spyre_lab.ktir.memory import Buffer
from spyre_lab.ktir.syntax import Op, Region
from spyre_lab.ktir.values import CoreRun

Handler = Callable[["Core", Op], object]


PHASES_ATTR = "ktdf.num_phases"
"""The loop attribute that names its buffer phases, as torch-spyre's double-buffering pass does."""

YIELDS = ("scf.yield", "linalg.yield", "ktdp.yield_partial", "ktdp.yield_reduced")


class Core:
    """The state of one core running a function: SSA environment, memory, and the ops recorded so far."""

    def __init__(self, tile_id: tuple[int, ...], buffers: dict[str, Buffer], aliases: dict, stick_bytes: int,
                 core: int) -> None:
        self.tile_id, self.buffers, self.aliases, self.stick_bytes = tile_id, buffers, aliases, stick_bytes
        self.env: dict[str, object] = {}
        self.run = CoreRun(core)
        self.turns: exchange.Turns | None = None     # set when the function talks between tiles
        self.counts: dict[int, int] = {}             # executions of each produce, to pair them across cores
        self.phases: list[LoopPhases] = []           # the enclosing scf.for loops, innermost last
        self.loop_ends: dict[int, list[int]] = {}    # per scf.for (by line): its last op at each iteration's end

    def slot_wait(self) -> tuple[int, ...]:
        """What a DRAM load must wait for: the end of the iteration ``num_phases`` back in its loop (the LX slot
        it refills is free then), or nothing outside a loop that names its phases."""
        loop = self.phases[-1] if self.phases else None
        if loop is None or loop.phases is None:
            return ()
        ends = self.loop_ends[loop.line]
        back = len(ends) - loop.phases
        return (ends[back],) if back >= 0 and ends[back] >= 0 else ()

    def get(self, name: str, op: Op) -> object:
        if name not in self.env:
            raise KTIRUnsupported(op.name, op.line, f"{name} is used before it is defined")
        return self.env[name]

    def bind(self, op: Op, values: list) -> None:
        if len(values) != len(op.results):
            raise KTIRUnsupported(op.name, op.line, f"gives {len(values)} results but {len(op.results)} are named")
        for name, v in zip(op.results, values):
            self.env[name] = v

    def block(self, region: Region, args: list | None = None) -> list:
        """Run a region's ops; returns what its scf.yield yields (empty if none)."""
        for tok, value in zip(region.args, args or []):
            self.env[tok.text] = value
        for op in region.ops:
            if op.name in YIELDS:
                return [self.get(v, op) for v in op.values()]
            if op.name in ("return", "func.return"):
                return []
            self.execute(op)
        return []

    def execute(self, op: Op) -> None:
        handler = HANDLERS.get(op.name)
        if handler is None:
            raise KTIRUnsupported(op.name, op.line)
        result = handler(self, op)
        if op.results:
            self.bind(op, list(result) if isinstance(result, (list, tuple)) else [result])


def _scf_for(core: Core, op: Op) -> list:
    names = op.values()
    iv, lo, hi, step = names[0], *(core.get(n, op) for n in names[1:4])
    if not all(isinstance(v, int) for v in (lo, hi, step)) or step <= 0:
        raise KTIRUnsupported(op.name, op.line, "bounds must be index values and the step positive")
    carried = [core.get(n, op) for n in names[5::2]] if "iter_args" in [t.text for t in op.body] else []
    arg_names = names[4::2] if carried else []
    if len(op.regions) != 1:
        raise KTIRUnsupported(op.name, op.line, "needs exactly one body region")
    body = op.regions[0]
    loop = LoopPhases(op.line, _phases(op))
    ends = core.loop_ends.setdefault(op.line, [])
    core.phases.append(loop)
    for i in range(lo, hi, step):
        core.env[iv] = i
        for a, v in zip(arg_names, carried):
            core.env[a] = v
        out = core.block(body)
        ends.append(len(core.run.ops) - 1)
        if carried:
            if len(out) != len(carried):
                raise KTIRUnsupported("scf.yield", op.line, f"yields {len(out)} values for {len(carried)} iter_args")
            carried = out
    core.phases.pop()
    return carried


@dataclass(frozen=True)
class LoopPhases:
    """An enclosing scf.for: its line (the key of its iteration ends) and its buffer phases (None: unnamed)."""

    line: int
    phases: int | None


def _phases(op: Op) -> int | None:
    """The loop's ``ktdf.num_phases`` (LX slots each load of its body cycles through), None when not given."""
    toks = op.attrs.get(PHASES_ATTR)
    if toks is None:
        return None
    text = toks[0].text if toks else ""
    if not text.isdigit() or int(text) < 1:
        raise KTIRUnsupported(op.name, op.line, f"{PHASES_ATTR} must be a positive integer (2: double buffered), "
                                                f"got {text!r}")
    return int(text)


def _scf_if(core: Core, op: Op) -> list:
    cond = core.get(op.values()[0], op)
    if not isinstance(cond, (bool, int)):
        raise KTIRUnsupported(op.name, op.line, "the condition must be an i1 scalar (from arith.cmpi)")
    if cond:
        return core.block(op.regions[0])
    return core.block(op.regions[1]) if len(op.regions) > 1 else []


HANDLERS: dict[str, Handler] = {"scf.for": _scf_for, "scf.if": _scf_if, **handlers.HANDLERS,
                                "ktdp.inter_tile_produce": exchange.produce,
                                "ktdp.inter_tile_reduce": exchange.reduce, "tensor.extract_slice": slices.extract_slice}
COMMUNICATION = ("ktdp.inter_tile_produce", "ktdp.inter_tile_reduce")


def elements(t: torch.Tensor) -> int:
    return max(1, math.prod(t.shape))
