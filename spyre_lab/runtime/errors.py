"""The errors the runtime raises at a user: each names what the modeled device cannot honour and the fix.

They are importable from here, from ``spyre_lab.runtime`` and, as before, from the modules that raise them
(:mod:`~spyre_lab.runtime.tensor`, :mod:`~spyre_lab.runtime.ops`).
:class:`~spyre_lab.runtime.host_memory_limit.SpyreHostOutOfMemoryError` is a ``torch.OutOfMemoryError`` and stays
with the host-memory check that makes it.
"""

from __future__ import annotations


class SpyreUsageError(RuntimeError):
    """A spyre tensor was used in a way the modeled device cannot honour; the message says how to fix it."""


class SpyreDtypeError(SpyreUsageError, TypeError):
    """A dtype the card cannot hold (complex, int16, uint64, ...)."""


class SpyreRangeError(SpyreUsageError, ValueError):
    """Values that the fp16 storage of a non-fp16 floating tensor cannot hold (beyond +-65504)."""


class SpyreInferenceOnlyError(RuntimeError):
    """Raised when autograd tries to run a backward pass through spyre tensors."""
