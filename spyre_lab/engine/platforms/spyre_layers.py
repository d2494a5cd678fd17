"""Layer variants written in the ops the spyre compiler lowers to device kernels.

The portable layers use ``chunk`` (an ATen ``split_with_sizes``) and advanced indexing
(``cache[positions]``, an ATen ``index``); the compiler has no device lowering for either, so each
becomes a host fallback inside the compiled piece (a D2H copy, the CPU op, an H2D copy). Slices
are views the compiler folds into the reads of their consumers, and ``index_select`` is a device
gather, so these variants compute the same values without leaving the card.

Slices that cut a stick (the device's 64-byte unit of a row) cost a restickify kernel instead, so
`MatmulRotaryEmbedding` avoids cutting heads in halves altogether.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from spyre_lab.engine.layers.activation import SiluAndMul
from spyre_lab.engine.layers.rotary import CosSin, RotaryEmbedding, on_build_device


class SlicedSiluAndMul(SiluAndMul):
    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]


class MatmulRotaryEmbedding(RotaryEmbedding):
    """RoPE without cutting a head in halves: ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = x @ R``.

    Slicing a 32-wide head at 16 elements cuts the device's sticks (a restickify kernel per slice);
    instead cos and sin are kept full width (``[cos | cos]``, ``[sin | sin]``) and rotate_half is a
    signed permutation matrix R ([d, d], entries 0 and +-1, so the product is exact in fp16). The
    angles are gathered with ``index_select``; everything else is a matmul and elementwise ops.
    """

    def __init__(self, head_dim: int, max_position: int, base: float = 10000.0) -> None:
        super().__init__(head_dim, max_position, base)
        cos, sin = self.cos_sin_cache.chunk(2, dim=-1)
        self.register_buffer("cos_full", torch.cat([cos, cos], dim=-1), persistent=False)
        self.register_buffer("sin_full", torch.cat([sin, sin], dim=-1), persistent=False)
        half = head_dim // 2
        with torch.device("cpu"):                        # a constant, made on the host and moved once
            rotate_half = torch.zeros(head_dim, head_dim)
            rotate_half[torch.arange(half, head_dim), torch.arange(half)] = -1.0  # out[:half] = -x[half:]
            rotate_half[torch.arange(half), torch.arange(half, head_dim)] = 1.0  # out[half:] = x[:half]
        self.register_buffer("rotate_half", on_build_device(rotate_half), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> CosSin:
        """Full-width cos and sin [T, 1, d], gathered with ``index_select`` (a device gather) once per step."""
        return (self.cos_full.index_select(0, positions).unsqueeze(1),
                self.sin_full.index_select(0, positions).unsqueeze(1))

    def forward_oot(self, cos_sin: CosSin, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos_sin
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], -1, self.head_dim)
        return (heads * cos + (heads @ self.rotate_half) * sin).view(x.shape[0], -1)


DEVICE_LAYERS: dict[str, type] = {"SiluAndMul": SlicedSiluAndMul, "RotaryEmbedding": MatmulRotaryEmbedding}
