"""SiluAndMul: SwiGLU's gate, on a fused [gate | up] projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from spyre_lab.engine.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    op_name = "SiluAndMul"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        if x.device.type == "cpu" and not torch.compiler.is_compiling():
            return F.silu(gate).mul_(up)        # host eager: the same product, written over silu's fresh output
        return F.silu(gate) * up
