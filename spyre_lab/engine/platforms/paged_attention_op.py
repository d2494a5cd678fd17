"""Paged attention as one opaque op, so a compiled model graph can be split around it.

vLLM compiles a model piecewise: attention is a registered custom op (``unified_attention``) that
Dynamo records as a single node, the backend splits the graph at those nodes, compiles the pieces
between them and runs attention itself eagerly. This module does the same for the engine:

* ``spyre_engine::paged_attention`` runs `grouped_paged_attention` (KV write by slot mapping, page
  gather by block tables, masked softmax·V) on whatever device its tensors live on; on spyre those
  are 11 to 15 eager device ops (11 in a decode step), the two KV writes (``index_copy_``) included,
  so the KV cache never crosses PCIe. Its fake implementation only says "the output
  looks like q", so Dynamo never traces into the KV-cache writes (which functionalization would
  drop: the cache is a module attribute, not a graph output).
* `OpaqueAttention` is the `Attention` layer a platform registers to call that op.
* ``spyre_engine::paged_attention_kernel`` / `KernelAttention`: the same attention as one device launch
  per layer (`paged_kernel`): the KV write and the attention in one tiled kernel that reads each cache
  block once through the block table. The spyre platform uses it while its compile options keep the
  ``attention`` fusion rule.

Every index and mask tensor the op reads (slot mapping, block tables, query index, additive mask,
output index) is built on the host by the model runner and copied over (the integers in one transfer),
as the real plugin does.
"""

from __future__ import annotations

import torch

from spyre_lab.engine.layers.attention import Attention, AttentionMetadata

OP_NAME = "spyre_engine::paged_attention"
KERNEL_OP_NAME = "spyre_engine::paged_attention_kernel"
ATTENTION_LANE = "attention"
"""Trace lane of the regions that group one layer's eager attention ops (the kernel is one event of its own)."""


def grouped_paged_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
) -> torch.Tensor:
    """`layers.attention.paged_attention`'s math in fewer device ops (each eager op is a device launch):

    * pages are gathered with one ``index_select`` over the flattened block tables for K and one for V;
    * grouped-query attention folds the query heads that share a KV head into the query dimension
      (``[B, kv_heads, group * Q, d]``) instead of repeating K and V for every query head;
    * the mask is additive, so scaling and masking are one multiply and one add.
    """
    num_tokens, group = query.shape[0], num_heads // num_kv_heads
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, key.view(num_tokens, num_kv_heads, -1))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, value.view(num_tokens, num_kv_heads, -1))

    batch, max_query = meta.query_index.shape
    blocks = meta.block_tables.flatten()
    keys = k_cache.index_select(0, blocks).view(batch, -1, num_kv_heads, head_dim).permute(0, 2, 3, 1)  # [B,kv,d,L]
    values = v_cache.index_select(0, blocks).view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)  # [B,kv,L,d]
    queries = query.index_select(0, meta.query_index.flatten()).view(batch, max_query, num_kv_heads, group, head_dim)
    queries = queries.permute(0, 2, 3, 1, 4).reshape(batch, num_kv_heads, group * max_query, head_dim)

    scores = (queries @ keys).view(batch, num_kv_heads, group, max_query, -1) * scale + meta.attn_bias.unsqueeze(1)
    probs = torch.softmax(scores, dim=-1).view(batch, num_kv_heads, group * max_query, -1)
    out = (probs @ values).view(batch, num_kv_heads, group, max_query, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(batch * max_query, num_heads * head_dim).index_select(0, meta.out_index)


def _paged_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, block_tables: torch.Tensor, query_index: torch.Tensor, attn_bias: torch.Tensor,
    out_index: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
) -> torch.Tensor:
    """`grouped_paged_attention` with the metadata spelled out (custom ops take tensors, not dataclasses).

    On spyre, the device ops it launches are marked in the trace as one region (lane ``attention``), so a
    study can tell attention's share of a step from the events alone."""
    meta = AttentionMetadata(slot_mapping, block_tables, query_index, attn_bias, out_index)
    if query.device.type != "spyre":
        return grouped_paged_attention(query, key, value, k_cache, v_cache, meta, num_heads, num_kv_heads, head_dim,
                                       scale)
    from spyre_lab.runtime.timeline import TIMELINE, recording

    with recording() as events:
        out = grouped_paged_attention(query, key, value, k_cache, v_cache, meta, num_heads, num_kv_heads, head_dim,
                                      scale)
    computes = [e for e in events.events if e.args.get("kind") == "Compute"]
    if computes:
        start = min(e.start_us for e in computes)
        TIMELINE.emit(ATTENTION_LANE, "paged attention (eager ops)", start,
                      max(e.end_us for e in computes) - start, ops=len(computes))
    return out


paged_attention = torch.library.custom_op(OP_NAME, mutates_args=("k_cache", "v_cache"))(_paged_attention)


@paged_attention.register_fake
def _(query: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(query)


def _paged_attention_kernel(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, block_tables: torch.Tensor, query_index: torch.Tensor, seq_query_lens: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer: int,
) -> torch.Tensor:
    """Paged attention as one launch on spyre (`paged_kernel.PagedAttentionLaunch`); on the CPU, its numerics.

    Rows of tokens no sequence's real queries own (bucket padding) come back 0."""
    if query.device.type == "spyre":
        from spyre_lab.engine.platforms.paged_kernel import layer_launch

        run = layer_launch(layer, num_heads, num_kv_heads, head_dim, scale)
        return run(query, key, value, k_cache, v_cache, slot_mapping, block_tables, query_index, seq_query_lens)
    from spyre_lab.compiler.tiling_paged_attention import paged_online_attention

    tokens = query.shape[0]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.reshape(tokens, num_kv_heads, -1))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.reshape(tokens, num_kv_heads, -1))
    return paged_online_attention(query.reshape(tokens, -1), k_cache, v_cache, block_tables, query_index,
                                  seq_query_lens[:, 0], seq_query_lens[:, 1], num_kv_heads, scale)


paged_attention_kernel = torch.library.custom_op(KERNEL_OP_NAME, mutates_args=("k_cache", "v_cache"))(
    _paged_attention_kernel)


@paged_attention_kernel.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
      *args: object) -> torch.Tensor:
    return query.new_empty(query.shape[0], args[4] * args[6])          # [T, num_heads * head_dim]


_ATTENTION_TARGETS: dict = {}


def _targets() -> dict:
    if not _ATTENTION_TARGETS:
        ops = torch.ops.spyre_engine
        _ATTENTION_TARGETS.update({ops.paged_attention: _paged_attention, ops.paged_attention.default: _paged_attention,
                                   ops.paged_attention_kernel: _paged_attention_kernel,
                                   ops.paged_attention_kernel.default: _paged_attention_kernel})
    return _ATTENTION_TARGETS


def is_paged_attention(node: torch.fx.Node) -> bool:
    """Is this FX node a call of a paged-attention op (as Dynamo or make_fx records it, or as `call_directly`
    left it)?"""
    if node.op != "call_function":
        return False
    targets = _targets()
    return node.target in targets or node.target in _FUNCTIONS


_FUNCTIONS = (_paged_attention, _paged_attention_kernel)


def call_directly(node: torch.fx.Node) -> None:
    """Make a paged-attention node call the op's function itself instead of going through the dispatcher.

    Between compiled pieces nothing needs what the dispatcher adds to a custom op (autograd, version
    counters of the mutated caches, alias checks); its Python glue cost about a quarter of the host time of
    the launch it wraps. The function is the one the op's registration runs, so the call does exactly what
    the op does."""
    node.target = _targets()[node.target]


class OpaqueAttention(Attention):
    """`Attention` whose forward is the opaque op: a compiler sees one node and splits the graph there."""

    def forward_oot(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
        return torch.ops.spyre_engine.paged_attention(
            query, key, value, self.k_cache, self.v_cache, meta.slot_mapping, meta.block_tables, meta.query_index,
            meta.attn_bias, meta.out_index, self.num_heads, self.num_kv_heads, self.head_dim, self.scale,
        )


class KernelAttention(Attention):
    """`Attention` as the one-launch paged-attention op; ``layer_index`` (set by the platform) names its kernel."""

    layer_index = 0

    def forward_oot(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
        if meta.seq_query_lens is None:
            raise ValueError("the paged-attention kernel needs AttentionMetadata.seq_query_lens (built by the "
                             "model runner); build metadata with it, or switch the 'attention' fusion rule off")
        return torch.ops.spyre_engine.paged_attention_kernel(
            query, key, value, self.k_cache, self.v_cache, meta.slot_mapping, meta.block_tables, meta.query_index,
            meta.seq_query_lens, self.num_heads, self.num_kv_heads, self.head_dim, self.scale, self.layer_index,
        )
