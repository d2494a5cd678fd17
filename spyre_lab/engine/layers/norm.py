"""RMSNorm: scale each token by the inverse root-mean-square of its features, then by a learned weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spyre_lab.engine.layers.custom_op import CustomOp


class RMSNorm(CustomOp):
    op_name = "RMSNorm"

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.normalized_shape = (hidden_size,)  # a tuple: cheaper per call than slicing x.shape

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize in at least fp32 (as Hugging Face does), then cast back before the weight."""
        if x.dtype in (torch.float32, torch.float64):  # already wide: one fused call
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.normalized_shape, eps=self.eps).to(x.dtype)
