"""Reference graphs for benchmarks, tests and notebooks: a Granite-style decoder layer written as one function.

Weights are inputs (stored transposed, ``[in, out]``, as the Spyre vLLM plugin does), so the same
function compiles on real tensors or on meta tensors shaped like Granite-3.3-8B without its weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half form."""
    half = t.shape[-1] // 2
    return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin


def granite_layer(x, cos, sin, wq, wk, wv, wo, wg, wu, wd, n1, n2, heads: int = 32, kv_heads: int = 8):
    """A Granite-style decoder layer with weights as inputs (stored transposed, [in, out], as the vLLM plugin does)."""
    b, s, d = x.shape
    hd = d // heads
    h = rms_norm(x, n1)
    q = (h @ wq).view(b, s, heads, hd).transpose(1, 2)
    k = (h @ wk).view(b, s, kv_heads, hd).transpose(1, 2)
    v = (h @ wv).view(b, s, kv_heads, hd).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + a.transpose(1, 2).reshape(b, s, d) @ wo
    h = rms_norm(x, n2)
    return x + (F.silu(h @ wg) * (h @ wu)) @ wd


def layer_inputs(d: int, heads: int, kv_heads: int, ff: int, seq: int, device: str = "cpu") -> list[torch.Tensor]:
    """Random fp16 inputs for :func:`granite_layer` (``device="meta"`` for shapes only)."""
    hd, kv = d // heads, (d // heads) * kv_heads
    shapes = [(1, seq, d), (seq, hd), (seq, hd), (d, d), (d, kv), (d, kv), (d, d), (d, ff), (d, ff), (ff, d),
              (d,), (d,)]
    return [torch.randn(s, dtype=torch.float16, device=device) * 0.05 for s in shapes]


def granite_stack(x, cos, sin, *weights, layers: int, heads: int = 32, kv_heads: int = 8):
    """``layers`` Granite-style decoder layers in one graph, each with its own nine weights (same shapes)."""
    if len(weights) != 9 * layers:
        raise ValueError(f"granite_stack needs 9 weights per layer ({9 * layers} for {layers}), got {len(weights)}")
    for i in range(layers):
        x = granite_layer(x, cos, sin, *weights[9 * i:9 * i + 9], heads=heads, kv_heads=kv_heads)
    return x


def stack_inputs(d: int, heads: int, kv_heads: int, ff: int, seq: int, layers: int,
                 device: str = "cpu") -> list[torch.Tensor]:
    """Inputs for :func:`granite_stack`: x, cos, sin, then every layer's weights (fresh tensors, same shapes)."""
    first = layer_inputs(d, heads, kv_heads, ff, seq, device)
    rest = [w for _ in range(layers - 1) for w in layer_inputs(d, heads, kv_heads, ff, seq, device)[3:]]
    return [*first, *rest]
