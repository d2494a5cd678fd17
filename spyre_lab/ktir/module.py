"""A parsed KTIR file: its functions, each runnable on given tensors and lowered to per-core tile programs.

A function's ``grid`` attribute says how many compute tiles (cores) run it; core ``c`` gets the tile id
``c`` unravelled over the grid (row-major, the last grid dim fastest). Cores run one after another in
tile-id order over one shared memory, so a kernel whose cores read what other cores write is outside the
subset (reported, never run silently). The recorded ops become one :class:`~spyre_lab.device.isa.CoreOps`
per core; cores that load the very same sticks at the same step share one DRAM broadcast, as the
compiler's broadcast groups do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.isa import CoreOps, TileProgram
from spyre_lab.ktir.errors import KTIRUnsupported
from spyre_lab.ktir.exchange import Turns
from spyre_lab.ktir.interpret import COMMUNICATION, Core
from spyre_lab.ktir.memory import Buffer, Pointer
from spyre_lab.ktir.syntax import Document, Op, parse
from spyre_lab.ktir.values import CoreRun


@dataclass
class KTIRResult:
    """What one run produced: every argument buffer after the kernel, and the per-core tile program."""

    outputs: dict[str, torch.Tensor]
    program: TileProgram
    runs: list[CoreRun] = field(repr=False, default_factory=list)


@dataclass
class KTIRFunction:
    """One ``func.func``: its arguments, grid and body."""

    name: str
    args: list[tuple[str, str]]          # (%name, type text)
    grid: tuple[int, ...]
    op: Op
    aliases: dict

    @property
    def cores(self) -> int:
        return math.prod(self.grid)

    def run(self, *inputs: object, cfg: SpyreConfig = SPYRE, **named: object) -> KTIRResult:
        """Run on every core. Pass a tensor (torch or numpy) for each pointer argument and an int for each
        index argument, in order or by name (without ``%``); outputs come back under the argument names."""
        if self.cores > cfg.cores:
            raise ValueError(f"{self.name}: grid {list(self.grid)} asks for {self.cores} cores, "
                             f"{cfg.name} has {cfg.cores}")
        bound = self._bind(inputs, named)
        buffers = {k: Buffer(k, v.flatten().clone()) for k, v in bound.items() if isinstance(v, torch.Tensor)}
        shapes = {k: tuple(v.shape) for k, v in bound.items() if isinstance(v, torch.Tensor)}
        runs: list[CoreRun | None] = [None] * self.cores
        turns = Turns(self.cores, cfg.cores) if _talks(self.op) else None

        def run_core(c: int) -> None:
            core = Core(tuple(int(i) for i in np.unravel_index(c, self.grid)), buffers, self.aliases,
                        cfg.stick_bytes, c)
            core.turns = turns
            for (arg, _), value in zip(self.args, bound.values()):
                core.env[arg] = Pointer(arg[1:]) if isinstance(value, torch.Tensor) else value
            runs[c] = core.run
            core.block(self.op.regions[0])

        if turns is not None:
            turns.run(run_core)
        else:
            for c in range(self.cores):
                run_core(c)
        outputs = {k: _view_back(buffers[k].data, shapes[k]) for k in buffers}
        return KTIRResult(outputs, lower(self.name, runs, cfg), runs)

    def tile_program(self, cfg: SpyreConfig = SPYRE, **named: object) -> TileProgram:
        """The per-core tile programs alone (inputs are zeros of the sizes the memory views reach)."""
        inputs = {a[1:]: named.get(a[1:], torch.zeros(0, dtype=torch.float16)) for a, t in self.args
                  if t != "index" or a[1:] not in named}
        inputs.update({a[1:]: named[a[1:]] for a, t in self.args if a[1:] in named})
        return self.run(cfg=cfg, **inputs).program

    def simulate(self, cfg: SpyreConfig = SPYRE, mode: str = "analytic", **named: object):
        from spyre_lab.device.sim import simulate

        return simulate(self.tile_program(cfg, **named), cfg, mode=mode, trace=mode == "event")

    def saved_program(self, cfg: SpyreConfig = SPYRE, mode: str = "analytic", **named: object) -> dict:
        """This kernel as a saved program dict: open it in ``Roofline`` or ``WorkDivisionView``."""
        from spyre_lab.ktir.saved import saved_program

        return saved_program(self.name, self.tile_program(cfg, **named), self.grid, cfg, mode)

    def _bind(self, inputs: Sequence[object], named: Mapping[str, object]) -> dict[str, object]:
        names = [a[1:] for a, _ in self.args]
        if len(inputs) > len(names):
            raise TypeError(f"{self.name} takes {len(names)} arguments ({', '.join(names)}), got {len(inputs)}")
        values = dict(zip(names, inputs)) | {k: v for k, v in named.items()}
        unknown = sorted(set(values) - set(names))
        missing = [n for n in names if n not in values]
        if unknown or missing:
            raise TypeError(f"{self.name}({', '.join(names)}): unknown {unknown}, missing {missing}")
        out = {}
        for n in names:
            v = values[n]
            out[n] = torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
        return out


def _talks(op: Op) -> bool:
    """Does the function use inter-tile communication (then cores take turns as threads)?"""
    return any(o.name in COMMUNICATION or _talks(o) for r in op.regions for o in r.ops)


def _view_back(flat: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    return flat[:n].reshape(shape) if shape and flat.numel() >= n else flat


def lower(name: str, runs: list[CoreRun], cfg: SpyreConfig) -> TileProgram:
    """Recorded ops -> a TileProgram; loads of the same sticks at the same step on several cores share."""
    groups: dict[tuple, int] = {}
    for run in runs:
        seen: dict[tuple, int] = {}
        for op in run.ops:
            if op.kind == "load":
                step = seen[op.key] = seen.get(op.key, 0) + 1
                groups[(op.key, step)] = groups.get((op.key, step), 0) + 1
    programs = []
    for run in runs:
        p = CoreOps()
        seen = {}
        for op in run.ops:
            if op.kind == "load":
                step = seen[op.key] = seen.get(op.key, 0) + 1
                p.load(op.out, op.nbytes, deps=op.deps, name=op.name, share=groups[(op.key, step)])
            elif op.kind == "store":
                p.store(op.nbytes, deps=op.deps, name=op.name)
            elif op.kind == "ring_send":
                p.ring_send(op.nbytes, op.peer, op.hops, op.tag, deps=op.deps, name=op.name)
            elif op.kind == "ring_recv":
                p.ring_recv(op.out, op.nbytes, op.peer, op.tag, deps=op.deps, name=op.name)
            elif op.kind == "matmul":
                p.matmul(op.out, *op.mnk, deps=op.deps, out_bytes=op.out_bytes, name=op.name)
            else:
                emit = p.special if op.kind == "special" else p.vector
                emit(op.out, op.elements, deps=op.deps, out_bytes=op.out_bytes, name=op.name)
        programs.append(p)
    return TileProgram.from_programs(name, programs, cfg.cores)


@dataclass
class KTIRModule:
    """Every ``func.func`` of a KTIR file, by name (without ``@``)."""

    functions: dict[str, KTIRFunction]
    source: str = field(repr=False, default="")

    def __getitem__(self, name: str) -> KTIRFunction:
        return self.functions[name]

    @property
    def main(self) -> KTIRFunction:
        """The only function (or the first, when there are several)."""
        return next(iter(self.functions.values()))


def _function(op: Op, doc: Document) -> KTIRFunction:
    sym = next((t.text[1:] for t in op.body if t.kind == "symbol"), None)
    if sym is None or not op.regions:
        raise KTIRUnsupported("func.func", op.line, "needs @name(args) and a body")
    args: list[tuple[str, str]] = []
    toks = op.body
    for i, t in enumerate(toks):
        if t.kind == "value" and i + 2 < len(toks) and toks[i + 1].text == ":":
            args.append((t.text, toks[i + 2].text))
    grid_toks = op.attrs.get("grid")
    if not grid_toks:
        raise KTIRUnsupported("func.func", op.line, f"@{sym} has no grid attribute (attributes {{grid = [32]}})")
    grid = tuple(int(t.text) for t in grid_toks if t.kind == "number")
    if not grid or any(g < 1 for g in grid):
        raise KTIRUnsupported("func.func", op.line, f"grid {grid} must list positive sizes")
    return KTIRFunction(sym, args, grid, op, doc.aliases)


def load(text_or_path: str | Path) -> KTIRModule:
    """Parse KTIR text (or a path to a ``.mlir`` file) into a :class:`KTIRModule`."""
    text = str(text_or_path)
    if isinstance(text_or_path, Path) or (len(text) < 4096 and "\n" not in text and text.endswith((".mlir", ".ktir"))):
        text = Path(text_or_path).read_text()
    doc = parse(text)
    functions: dict[str, KTIRFunction] = {}

    def walk(ops: list[Op]) -> None:
        for op in ops:
            if op.name == "module":
                for r in op.regions:
                    walk(r.ops)
            elif op.name == "func.func":
                f = _function(op, doc)
                functions[f.name] = f
            else:
                raise KTIRUnsupported(op.name, op.line, "only func.func (inside an optional module) at top level")

    walk(doc.ops)
    if not functions:
        raise KTIRUnsupported("module", 1, "holds no func.func")
    return KTIRModule(functions, text)
