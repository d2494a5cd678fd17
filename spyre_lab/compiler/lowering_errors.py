"""The error lowering raises: a graph that cannot become a static Spyre program.

Its own module so that every part of the lowering pass (the dispatch in ``lowering``, the node builders in
``lowering_kernels``) raises the one class callers catch.
"""

from __future__ import annotations

__all__ = ["LoweringError"]


class LoweringError(RuntimeError):
    """The graph cannot become a static Spyre program (symbolic shapes, data-dependent outputs, ...)."""
