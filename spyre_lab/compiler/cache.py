"""The Program cache: a graph compiled once per (structure, shapes, dtypes, options, config).

Spyre programs are static dataflow: a new input shape needs a new program (Dynamo's guards send
the new shape back to the backend, which lands here and misses). The same graph at the same
shapes compiles nothing: ``stats()`` counts hits, misses and compiles so a learner can see it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from spyre_lab.compiler.options import CompileOptions
from spyre_lab.device.config import SpyreConfig


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    compiles: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "compiles": self.compiles}


class ProgramCache:
    """The process's compiled Programs (least recently used dropped past ``MAX_ENTRIES``), the input signatures
    each graph lineage was compiled for, and the hit/miss/compile counts; listed with the rest of the process
    state in :mod:`spyre_lab.runtime.process_state`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stats = CacheStats()
        self.programs: OrderedDict[str, Any] = OrderedDict()
        self.seen_graphs: dict[str, list[str]] = {}     # lineage digest -> signatures compiled for it

    def clear(self) -> None:
        """Forget every program and reset the counters."""
        with self.lock:
            self.programs.clear()
            self.seen_graphs.clear()
            self.stats.hits = self.stats.misses = self.stats.compiles = 0


PROGRAM_CACHE = ProgramCache()
MAX_ENTRIES = 256


def _signature(example_inputs: Sequence[Any]) -> str:
    parts = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            parts.append(f"{tuple(x.shape)}:{x.stride()}:{x.dtype}")
        else:
            parts.append(f"{type(x).__name__}={x!r}")
    return "|".join(parts)


def _shapes(signature: str) -> str:
    """The tensor shapes of a signature, for messages: ``[64x64, 64, 40x64]``."""
    shapes = [part.split(":")[0] for part in signature.split("|") if part.startswith("(")]
    return "[" + ", ".join(s.strip("(,)").replace(", ", "x") or "scalar" for s in shapes) + "]"


def _structure(fn: Callable | fx.GraphModule) -> str:
    """Graph code for FX graphs (identity of their constant tensors included), object identity otherwise.

    Identity is safe as a key because :func:`store` keeps the compiled object alive beside its program, so its
    ``id`` cannot be reused by another function while the entry exists; it keys within one process only."""
    if isinstance(fn, fx.GraphModule):
        consts = [f"{n.target}@{id(t)}:{getattr(t, '_version', 0)}" for n in fn.graph.nodes if n.op == "get_attr"
                  for t in [getattr(fn, n.target, None)]]
        return fn.code + "\n".join(consts)
    identity = f"{getattr(fn, '__qualname__', type(fn).__name__)}@{id(fn)}"
    if isinstance(fn, torch.nn.Module):
        # a module traced directly has its weights folded in as constants: an in-place update (optimizer
        # step, load_state_dict) bumps a tensor's version and must not hit a stale program
        state = ",".join(f"{name}:{id(t)}:{t._version}" for name, t in fn.state_dict(keep_vars=True).items())
        identity += "|" + state
    return identity


def _lineage(fn: Callable | fx.GraphModule) -> str:
    """The ops a graph calls, ignoring sizes: the same model traced statically and with symbolic sizes
    (Dynamo's recompile after a shape change) shares a lineage, so explain() can say "recompiled"."""
    if isinstance(fn, fx.GraphModule):
        return ",".join(str(n.target) for n in fn.graph.nodes
                        if n.op == "call_function" and "sym_size" not in str(n.target))
    return _structure(fn)


def cache_key(fn: Callable | fx.GraphModule, example_inputs: Sequence[Any], options: CompileOptions,
              cfg: SpyreConfig) -> tuple[str, str, str]:
    """(key, lineage digest, input signature)."""
    structure = hashlib.sha1(_structure(fn).encode()).hexdigest()[:16]
    lineage = hashlib.sha1(_lineage(fn).encode()).hexdigest()[:16]
    signature = _signature(example_inputs)
    key = hashlib.sha1(f"{structure}#{signature}#{options!r}#{cfg!r}".encode()).hexdigest()[:20]
    return key, lineage, signature


def lookup(key: str) -> Any | None:
    cache = PROGRAM_CACHE
    with cache.lock:
        program = cache.programs.get(key)
        if program is None:
            cache.stats.misses += 1
            return None
        cache.stats.hits += 1
        cache.programs.move_to_end(key)
        return program


def store(key: str, lineage: str, signature: str, program: Any, keep_alive: Any = None) -> str:
    """Remember a freshly compiled program; returns the note explain() shows (first compile or recompile)."""
    cache = PROGRAM_CACHE
    with cache.lock:
        cache.stats.compiles += 1
        before = cache.seen_graphs.setdefault(lineage, [])
        note = "compiled (first time this graph was seen)"
        if before and signature not in before:
            note = (f"recompiled: new input shapes {_shapes(signature)} (this graph was compiled before for "
                    f"{_shapes(before[-1])}; Spyre programs are static, so each shape gets its own program)")
        before.append(signature)
        cache.programs[key] = (program, keep_alive)
        while len(cache.programs) > MAX_ENTRIES:
            cache.programs.popitem(last=False)
        return note


def get(key: str) -> Any | None:
    entry = lookup(key)
    return None if entry is None else entry[0]


def peek(key: str) -> tuple[Any, Any] | None:
    """The ``(program, keep_alive)`` stored under ``key`` (keep_alive: the function it was compiled from), or None;
    counts no hit or miss, so a view can look up what compiled without changing ``stats()``."""
    with PROGRAM_CACHE.lock:
        return PROGRAM_CACHE.programs.get(key)


def stats() -> dict[str, int]:
    """Hits, misses and compiles since start (or the last ``clear()``)."""
    with PROGRAM_CACHE.lock:
        return {**PROGRAM_CACHE.stats.as_dict(), "entries": len(PROGRAM_CACHE.programs)}


def clear() -> None:
    """Forget every program and reset the counters."""
    PROGRAM_CACHE.clear()
