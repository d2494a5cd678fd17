"""Rotary position embedding (RoPE), neox style (rotate the two halves of each head).

cos/sin for every position are computed once into `cos_sin_cache` [max_position, head_dim]
so a step only gathers rows by position — the same cache a device can hold resident.
"""

from __future__ import annotations

import torch

from spyre_lab.engine.layers.custom_op import CustomOp


class RotaryEmbedding(CustomOp):
    op_name = "RotaryEmbedding"

    def __init__(self, head_dim: int, max_position: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate query [T, heads*d] and key [T, kv_heads*d] by the angle of each token's position."""
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, d/2] each
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.view(x.shape[0], -1, self.head_dim).chunk(2, dim=-1)
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return rotated.view(x.shape).to(x.dtype)
