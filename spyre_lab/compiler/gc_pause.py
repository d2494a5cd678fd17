"""Pause Python's cycle collector while the compiler builds a program.

Planning one large kernel allocates tens of thousands of tile ops, operands and candidate tiles, almost
none of them in reference cycles; with the collector on, every few hundred allocations it walks the
young objects again and every so often all of them (an 8B layer: some 250 collections, a fifth of its
compile time). Paused, the garbage a compile leaves is collected once, after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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
