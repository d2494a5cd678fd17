"""A result kept for one tensor: handed back while the very same tensor comes back unchanged.

The runtime hands a kernel the same window of an unchanged buffer at every launch (a weight), so what the
executor derives from it (an fp32 copy, the cores' operands) would come out the same again. "Unchanged" is
what the tensor's version counter says: every in-place write and every in-place change of its sizes or
strides bumps it. Inference tensors keep no version counter, so nothing is kept for them.
"""

from __future__ import annotations

from typing import Any

import torch


class SameTensorCache:
    """One tensor and what was derived from it, while that tensor is unchanged."""

    __slots__ = ("source", "value", "version")

    def __init__(self) -> None:
        self.source: torch.Tensor | None = None
        self.version = -1
        self.value: Any = None

    def get(self, t: torch.Tensor) -> Any:
        """What was kept for ``t``, if ``t`` is the very tensor it was kept for and unchanged since; else None."""
        if t is self.source and t._version == self.version:
            return self.value
        return None

    def keep(self, t: torch.Tensor, value: Any) -> None:
        """Keep ``value`` for ``t`` (nothing is kept for an inference tensor)."""
        if t.is_inference():
            self.forget()
        else:
            self.source, self.version, self.value = t, t._version, value

    def forget(self) -> None:
        self.source = self.value = None
