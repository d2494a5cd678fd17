"""Paged attention as one opaque op, so a compiled model graph can be split around it.

vLLM compiles a model piecewise: attention is a registered custom op (``unified_attention``) that
Dynamo records as a single node, the backend splits the graph at those nodes, compiles the pieces
between them and runs attention itself eagerly. This module does the same for the engine:

* ``spyre_engine::paged_attention`` runs the portable `layers.attention.paged_attention` (KV write by slot mapping, page
  gather by block tables, masked softmax·V) on whatever device its tensors live on; on spyre that
  is a handful of eager device ops. Its fake implementation only says "the output looks like q",
  so Dynamo never traces into the KV-cache writes (which functionalization would drop: the cache is
  a module attribute, not a graph output) or the mask's `arange` (which would put a CPU tensor next
  to spyre ones).
* `OpaqueAttention` is the `Attention` layer a platform registers to call that op.
"""

from __future__ import annotations

import torch

from spyre_lab.engine.layers.attention import Attention, AttentionMetadata
from spyre_lab.engine.layers.attention import paged_attention as attend

OP_NAME = "spyre_engine::paged_attention"


@torch.library.custom_op(OP_NAME, mutates_args=("k_cache", "v_cache"))
def paged_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, block_tables: torch.Tensor, query_index: torch.Tensor, query_positions: torch.Tensor,
    token_seq: torch.Tensor, token_offset: torch.Tensor, attn_mask: torch.Tensor | None,
    num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
) -> torch.Tensor:
    """The portable paged attention on these caches and this metadata; writes k/v into the caches."""
    meta = AttentionMetadata(slot_mapping, block_tables, query_index, query_positions, token_seq, token_offset,
                             attn_mask)
    return attend(query, key, value, k_cache, v_cache, meta, num_heads, num_kv_heads, head_dim, scale)


@paged_attention.register_fake
def _(query: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(query)


def is_paged_attention(node: torch.fx.Node) -> bool:
    """Is this FX node a call of the paged-attention op (as Dynamo or make_fx records it)?"""
    return node.op == "call_function" and node.target in (
        torch.ops.spyre_engine.paged_attention, torch.ops.spyre_engine.paged_attention.default)


class OpaqueAttention(Attention):
    """`Attention` whose forward is the opaque op: a compiler sees one node and splits the graph there."""

    def forward_oot(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
        return torch.ops.spyre_engine.paged_attention(
            query, key, value, self.k_cache, self.v_cache, meta.slot_mapping, meta.block_tables, meta.query_index,
            meta.query_positions, meta.token_seq, meta.token_offset, meta.attn_mask,
            self.num_heads, self.num_kv_heads, self.head_dim, self.scale,
        )
