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
        # host eager only (`_host_rms_norm`): per dtype, the [hidden] vector of 1/hidden and eps as a [1] tensor
        self._host_constants: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize in at least fp32 (as Hugging Face does), then cast back before the weight."""
        if x.dtype in (torch.float32, torch.float64):  # already wide
            # host tensors in eager only: a traced graph and a modeled card's launches keep the one rms_norm op
            if x.device.type == "cpu" and x.dim() == 2 and not torch.compiler.is_compiling():
                return self._host_rms_norm(x)
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.normalized_shape, eps=self.eps).to(x.dtype)

    def _host_rms_norm(self, x: torch.Tensor) -> torch.Tensor:
        """`F.rms_norm` of [T, hidden] host rows in four kernels: ``eps + mean(x^2)`` as one matrix-vector product
        (``addmv`` with a vector of 1/hidden), its rsqrt in place, and the two scalings. The fused call dispatches
        two dozen ops (its scalar divide and add each wrap a tensor and copy it), as much host time on a small
        model as its arithmetic; the values agree to the last bits of fp32 (a sum in another order)."""
        constants = self._host_constants.get(x.dtype)
        if constants is None:
            hidden = self.normalized_shape[0]
            constants = self._host_constants[x.dtype] = (torch.full((hidden,), 1.0 / hidden, dtype=x.dtype),
                                                         torch.full((1,), self.eps, dtype=x.dtype))
        inverse_width, eps = constants
        scale = torch.addmv(eps, x * x, inverse_width).rsqrt_()
        return (x * scale.unsqueeze(-1)).mul_(self.weight)
