"""The cyclic garbage collector, kept off the hot paths: the long-lived heap frozen once a tool is up, and the
collector paused while a compile or a simulation allocates.

A process that has imported torch and built an engine or a view holds a few hundred thousand objects that live
as long as it does (modules, weights, compiled programs, Dynamo caches, plotly's figure classes). Python's full
collections walk all of them, a pause of 0.1-0.7 s that lands on whatever runs next: a decode step, or a
learner's slider change. ``gc.freeze()`` moves them to a permanent generation, as vLLM does once its engine is
up; new objects are still collected as before.

Planning a large kernel or simulating it allocates tens of thousands of tile ops, operands and events, almost
none of them in reference cycles; with the collector on, every few hundred allocations it walks the young objects
again and every so often all of them (an 8B layer's compile: some 250 collections, a fifth of its time).
:func:`cyclic_gc_paused` runs such a block with the collector off, so its garbage is collected once, after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_startup_heap() -> None:
    """Move every object alive now out of the cyclic collector's sight (``gc.freeze()``).

    Objects frozen here are still freed when their last reference goes; only garbage *cycles* among them wait,
    until the next call unfreezes and collects before freezing again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def freeze_new_survivors() -> None:
    """Collect the young generations, then freeze what survived: for a tool that has just cached a result it keeps
    for its life (a WhatIf setting's programs and traces).

    Without it, each cached result counts toward the next full collection, which after a freeze walks only the
    unfrozen heap but comes round every few changes. Garbage cycles already in the old generation are frozen with
    the rest; the next :func:`freeze_startup_heap` (a new view or engine) unfreezes and collects them."""
    gc.collect(1)
    gc.freeze()


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Run the block with the cycle collector off, restoring it as it was (nesting is harmless)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
