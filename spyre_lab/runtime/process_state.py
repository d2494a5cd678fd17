"""Every piece of process-wide state the runtime and the compiler keep, in one list, with one :func:`reset`.

A modeled card and its runtime keep things between calls, as a real driver does: the modeled clock, the streams,
the one-op programs built so far, the warnings already given. What belongs to one card lives on that card's
:class:`~spyre_lab.runtime.devices.SpyreDevice` (its correction areas, its seed tensors) and goes with it; what is
left is the process's, and is listed here, so a reader finds it in one place and a test (or a notebook) puts it
back in one call. ``tests/runtime/test_process_state.py`` reads every module of the runtime and fails when a
module-level mutable object is not listed.

Each entry names the module and attribute, what it holds, and the *part* of :func:`reset` that puts it back:

* ``clock``     modeled time, the streams' ready times and current streams, the current card of this thread;
* ``warnings``  the one-time warnings already given (they are given again afterwards);
* ``records``   what the last launches left to read (last plan, fallback counts, compiled graphs, ...);
* ``caches``    what is kept only to be faster (programs, plans, tables): dropping one changes no result;
* ``settings``  the process's launch options and the timing-only switch;
* ``cards``     the cards themselves: a reset frees every tensor on them (each card's own caches go with it).

``kept`` entries are never reset: registrations with torch, hooks, and tables of live objects held weakly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PARTS = ("clock", "warnings", "records", "caches", "settings", "cards")
DEFAULT_PARTS = ("clock", "warnings", "records", "caches", "settings")
"""What :func:`reset` puts back when asked for nothing in particular: everything but the cards (and live tensors)."""


def _clear(obj: Any) -> None:
    obj.clear()


def _reset(obj: Any) -> None:
    obj.reset()


def _reset_cards(cards: list[Any]) -> None:
    for card in cards:
        card.reset()


def _current_card(_: Any) -> None:
    from spyre_lab.runtime.devices import set_device

    set_device(0)


def _fallback_counts(log: Any) -> None:
    log.stats.clear()


def _last_result(_: Any) -> None:
    from spyre_lab.runtime import dynamo_backend

    dynamo_backend.forget_last_result()


@dataclass(frozen=True)
class Held:
    """One piece of process state: ``module.attribute``, what it holds, and the part of :func:`reset` it is in."""

    module: str
    attribute: str
    holds: str
    part: str                                   # one of PARTS, or "kept"
    put_back: Callable[[Any], None] | None = None

    def reset(self) -> None:
        module = sys.modules.get(self.module)     # a module never imported has nothing to put back
        if module is not None and self.put_back is not None:
            self.put_back(getattr(module, self.attribute))


R, C = "spyre_lab.runtime", "spyre_lab.compiler"
STATE: tuple[Held, ...] = (
    # clock
    Held(f"{R}.timeline", "TIMELINE", "modeled host time, when each unit is next free, the last launch's trace",
         "clock", _reset),
    Held(f"{R}.stream", "STREAMS", "every stream made, each card's current stream, the pools' cursors", "clock",
         _reset),
    Held(f"{R}.devices", "_CURRENT", "this thread's current card", "clock", _current_card),
    # warnings
    Held(f"{R}.fallback", "_warned_ops", "ops whose CPU-fallback warning was given", "warnings", _clear),
    Held(f"{R}.dtype_policy", "_warned_dtypes", "dtypes whose storage-policy warning was given", "warnings", _clear),
    Held(f"{C}.lowering", "_WARNED", "graph ops whose host-fallback warning was given", "warnings", _clear),
    # records
    Held(f"{R}.launch.plan", "LAST_PLAN", "the JobPlan submitted last", "records", _reset),
    Held(f"{R}.fallback", "_PROCESS_LOG", "every CPU fallback so far: calls and first call site", "records",
         _fallback_counts),
    Held(f"{R}.dynamo_backend", "_REGISTRY", "the graphs torch.compile handed the backend (explain())", "records",
         _clear),
    Held(f"{R}.dynamo_backend", "_last_result", "the last compiled call's result record", "records",
         _last_result),
    Held(f"{R}.one_op_compile", "_NOT_COMPILED", "ops whose eager form runs the reference kernel, and why",
         "records", _clear),
    # caches
    Held(f"{R}.eager_programs", "_PROGRAMS", "one-op programs by op signature (least recently used dropped)",
         "caches", _clear),
    Held(f"{R}.eager_programs", "_SPECS", "the pytree spec of each ATen call shape", "caches", _clear),
    Held(f"{R}.ops", "_ROADS", "per ATen op, the road dispatch takes", "caches", _clear),
    Held(f"{R}.programs", "_LOADED", "compiler Programs loaded for the runtime, per timing mode", "caches", _clear),
    Held(f"{R}.devices", "INDEX_OF", "torch.device -> card index", "caches", _clear),
    Held(f"{R}.lazy_trace", "FRONTIER_CACHE", "per simulator block, its first start and latest-ending events",
         "caches", _clear),
    Held(f"{R}.lazy_trace", "KEPT_CACHE", "per simulator block and lane filter, the events kept", "caches", _clear),
    Held(f"{C}.cache", "PROGRAM_CACHE", "compiled Programs by graph, shapes, options and config; hit counts",
         "caches", _clear),
    Held(f"{C}.backend", "_TRACES", "ATen graphs traced per function and input signature", "caches", _clear),
    Held(f"{C}.one_op_graph", "_FORMS", "one-op ATen graphs per form, given each new shape", "caches", _clear),
    Held(f"{C}.per_core", "_SLICED", "per kernel, its per-core slicing plan", "caches", _clear),
    Held(f"{C}.batched_cores", "_EXACT", "per operand layout, whether one bmm gives every core's own product",
         "caches", _clear),
    Held(f"{C}.plan_memo", "_PLANS", "kernel plans by structural signature, reused by repeated layers", "caches",
         _clear),
    Held(f"{C}.constant_facts", "_FACTS", "answers about constant tensors (all zero, causal offset)", "caches",
         _clear),
    Held(f"{C}.lowering", "_FILLS", "filled constants shared by every layer that fills alike", "caches", _clear),
    Held(f"{C}.paged_attention", "_SPECS", "paged-attention kernel specs per launch shape", "caches", _clear),
    # settings
    Held(f"{R}.launch.options", "SETTINGS", "default RuntimeOptions and the timing-only switch", "settings", _reset),
    # cards
    Held(f"{R}.devices", "_DEVICES", "the modeled cards (each keeps its own correction areas and seed tensors)",
         "cards", _reset_cards),
    Held(f"{R}.devices", "_CONFIG", "the SpyreConfig every card is made with (runtime.configure)", "kept"),
    # kept: registrations and live objects
    Held(f"{R}.devices", "_RESET_HOOKS", "what runs after a card reset", "kept"),
    Held(f"{R}.kernel_table", "_INSTALLED", "every kernel registered with torch, per stage, and its libraries",
         "kept"),
    Held(f"{R}.fallback", "_collectors", "the open collect_fallbacks() blocks", "kept"),
    Held(f"{C}.explain", "KERNEL_FAMILY_EXPLAINERS", "explainers of kernel families planned per launch", "kept"),
    Held(f"{C}.explain", "COLLECTIVE_SOURCES", "where explain() reads this process's collectives", "kept"),
    Held(f"{R}.host_memory", "_PINNED", "pinned host storages alive now (held weakly)", "kept"),
    Held(f"{R}.device_buffer", "_ROW_MIRRORS", "per live device buffer, its row-write mirror (held weakly)", "kept"),
)


def reset(*parts: str) -> None:
    """Put the named parts of the process state back to a fresh process's (default: :data:`DEFAULT_PARTS`).

    ``reset("clock")`` is what every runtime test starts with; ``reset("warnings")`` lets a test see the one-time
    warnings again; ``reset("cards")`` frees every tensor on every card."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown process-state part(s) {unknown}; choose from {list(PARTS)}")
    wanted = set(parts or DEFAULT_PARTS)
    for held in STATE:
        if held.part in wanted:
            held.reset()


def describe() -> str:
    """The table of process state, one line per entry (what a reader sees first)."""
    width = max(len(f"{h.module}.{h.attribute}") for h in STATE)
    return "\n".join(f"{h.part:<9} {f'{h.module}.{h.attribute}':<{width}}  {h.holds}" for h in STATE)
