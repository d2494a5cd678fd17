"""Linears that keep their weight transposed (``weight_t``, [in, out]) and run ``x @ weight_t``.

`F.linear(x, W)` multiplies by ``W.T``. On Spyre a transposed operand is not free: the real vLLM
plugin stores ``W.T`` once at load time because the transposed matmul is ~3.5x slower, and in this
compiler a transposed weight costs a restickify kernel (a full copy of the weight into the other
stick layout) on every call. Storing the transpose once, after the checkpoint is loaded, removes
that kernel from every step.

The layers load checkpoints exactly like the portable ones (``weight`` [out, in]); the platform
calls `store_transposed()` on each once loading is done, which replaces ``weight`` by ``weight_t``.
"""

from __future__ import annotations

import torch
from torch import nn

from spyre_lab.engine.layers.linear import Linear, MergedColumnParallelLinear, QKVParallelLinear


class TransposedWeight:
    """Mixin for `Linear` subclasses: after `store_transposed()`, the forward is ``x @ weight_t (+ bias)``."""

    @property
    def is_transposed(self) -> bool:
        return "weight_t" in self._parameters

    def store_transposed(self) -> None:
        """Replace ``weight`` [out, in] by a contiguous ``weight_t`` [in, out] (once; a second call is a no-op)."""
        if self.is_transposed:
            return
        weight = self.weight
        del self.weight
        self.weight_t = nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        if not self.is_transposed:
            return self.forward_native(x)
        out = x @ self.weight_t
        return out if self.bias is None else out + self.bias


class TransposedLinear(TransposedWeight, Linear):
    pass


class TransposedMergedColumnParallelLinear(TransposedWeight, MergedColumnParallelLinear):
    pass


class TransposedQKVParallelLinear(TransposedWeight, QKVParallelLinear):
    pass


TRANSPOSED_LINEARS: dict[str, type] = {
    "Linear": TransposedLinear,
    "MergedColumnParallelLinear": TransposedMergedColumnParallelLinear,
    "QKVParallelLinear": TransposedQKVParallelLinear,
}
