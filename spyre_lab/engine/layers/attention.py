"""Paged attention in plain torch: keys and values live in fixed-size blocks, found via block tables.

The KV cache of one layer is `[num_blocks + 1, block_size, kv_heads, head_dim]`. A sequence owns a
list of block ids (its block table); token `i` of the sequence lives in block `table[i // block_size]`
at offset `i % block_size`, i.e. in *slot* `block * block_size + offset`. The last block is a scratch
block that no sequence owns: padding tokens write there and padded block-table entries point there,
so fixed (static) shapes never need a branch.

One call handles prefill and decode alike:
1. write this step's k/v into their slots (`index_copy_`, one scatter),
2. gather each sequence's pages through its block table into `[B, kv_heads, L, d]`,
3. attend from each query (laid out `[B, max_query_len]`) to every key at a position <= its own
   (an additive mask the model runner builds on the host), then put the outputs back in flat token order.

A decode step on a platform with ``decode_key_mask`` reads a boolean key mask instead (`_decode_attention`), and
a prefill step on one with ``per_sequence_attention`` attends sequence by sequence (`attention_spans`). A mixed step
(``num_decode_tokens`` decode rows first, then prefill spans) runs both: the decode rows' path on its first tokens,
the spans on the rest, after one cache write for all of them (`_mixed_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from spyre_lab.engine.layers.attention_spans import PrefillSpan, per_sequence_prefill
from spyre_lab.engine.layers.custom_op import CustomOp
from spyre_lab.engine.layers.decode_rows import DecodeRowsStep, rows_decode_attention


@dataclass
class AttentionMetadata:
    """Where this step's tokens go and what they may see; built on the host by the model runner.

    T = number of (possibly padded) tokens in the step, B = sequences, Q = longest query per sequence,
    L = key positions a sequence's block table can address (max_blocks * block_size).
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot each token's k/v is written to
    block_tables: torch.Tensor  # [B, max_blocks] int64: block ids of each sequence (padded with the scratch block)
    query_index: torch.Tensor  # [B, Q] int64: flat token index of each sequence's queries (padding -> 0)
    # [B, 1, Q, L] model dtype: 0 where a query may see a key (key pos <= query pos), -inf else; None when the
    # platform's attention does not read it (a paged-attention kernel bounds its loops by seq_query_lens); at a
    # decode step on a platform with ``decode_key_mask``, the boolean ``key_mask`` (SDPA reads both forms)
    attn_bias: torch.Tensor | None
    out_index: torch.Tensor  # [T] int64: where each flat token's query sits among the B*Q queries (b * Q + q)
    # [B, 2] int64 per sequence: keys its context covers (this step's included) and this step's real queries
    # (the last positions of the context); what a kernel walking the block tables needs for its loop bounds
    seq_query_lens: torch.Tensor | None = None
    # [B, 1, 1, L] bool, decode steps only (one query per sequence, at its last position), on a platform that asks
    # for it (``Platform.decode_key_mask``): True for the keys a sequence's context covers. It replaces ``attn_bias``
    # there: no [B, 1, Q, L] float mask to build and add, and the pages are gathered with one ``index_select``
    # (``attn_bias`` is then its additive [B, 1, 1, L] form, made once per step for every layer's SDPA)
    key_mask: torch.Tensor | None = None
    # a prefill step on a platform with ``Platform.per_sequence_attention`` (dynamic shapes): its sequences, each
    # attending alone over only its own keys (`attention_spans`); no gathered rectangle, no dense mask
    prefill_spans: tuple[PrefillSpan, ...] | None = None
    # a decode step on a platform with ``Platform.decode_rows`` (dynamic shapes): each layer attends over rows kept
    # from step to step and copies in only the keys they lack (`decode_rows`); None: gather the block tables
    decode_rows: DecodeRowsStep | None = None
    # a mixed step: its first this many tokens are decode rows (one per sequence: ``block_tables``, ``key_mask`` or
    # ``decode_rows`` describe them), the rest prefilled prompts (``prefill_spans``, at their offsets in the step)
    num_decode_tokens: int = 0


def causal_bias(query_positions: torch.Tensor, num_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, Q, L] additive mask: query q of sequence b sees key l iff l <= its position (padding keys never)."""
    batch = query_positions.shape[0]
    visible = torch.arange(num_keys).view(1, 1, 1, -1) <= query_positions.view(batch, 1, -1, 1)
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))


class Attention(CustomOp):
    op_name = "Attention"

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads} (GQA)")
        self.num_heads, self.head_dim, self.scale, self.num_kv_heads = num_heads, head_dim, scale, num_kv_heads
        # Bound by the model runner once the KV cache is allocated; plain attributes, not state. ``kv_layer``: this
        # layer's index among the model's attention layers (what per-layer state such as decode rows is keyed by)
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.kv_layer = 0

    def forward_native(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return paged_attention(query, key, value, self.k_cache, self.v_cache, meta,
                               self.num_heads, self.num_kv_heads, self.head_dim, self.scale, layer=self.kv_layer)


def paged_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, *, layer: int = 0,
) -> torch.Tensor:
    """Write this step's k/v into their cache slots, then attend through the block tables; [T, heads*d] out.
    ``layer``: the attention layer's index (`Attention.kv_layer`), which decode rows are kept per."""
    num_tokens = query.shape[0]
    key = key.view(num_tokens, num_kv_heads, head_dim)
    value = value.view(num_tokens, num_kv_heads, head_dim)
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, value)
    if meta.num_decode_tokens:
        return _mixed_attention(query, key, value, k_cache, v_cache, meta, num_heads, num_kv_heads, head_dim, scale,
                                layer)
    if meta.decode_rows is not None:
        return rows_decode_attention(query, key, value, k_cache, v_cache, meta.decode_rows, num_heads, num_kv_heads,
                                     head_dim, scale, layer)
    if meta.key_mask is not None:
        return _decode_attention(query, k_cache, v_cache, meta, num_heads, num_kv_heads, head_dim, scale)
    if meta.prefill_spans is not None:
        return per_sequence_prefill(query, key, value, k_cache, v_cache, meta.prefill_spans, num_heads,
                                    num_kv_heads, head_dim, scale)

    keys = k_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)  # [B, kv_heads, L, d]
    values = v_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)
    queries = query.view(num_tokens, num_heads, head_dim)[meta.query_index].transpose(1, 2)

    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=meta.attn_bias, scale=scale, enable_gqa=num_kv_heads != num_heads
    )
    out = out.transpose(1, 2).reshape(-1, num_heads * head_dim)  # [B * Q, heads * d]
    return out[meta.out_index]  # back to the step's flat tokens [T, heads * d]



def _mixed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, meta: AttentionMetadata, num_heads: int, num_kv_heads: int, head_dim: int,
                     scale: float, layer: int) -> torch.Tensor:
    """A mixed step's attention: the decode rows (the first ``num_decode_tokens`` tokens) as in a decode step, each
    prompt over its own keys as in a prefill step; the same softmax per sequence as either step alone."""
    rows = meta.num_decode_tokens
    if meta.decode_rows is not None:
        decoded = rows_decode_attention(query[:rows], key[:rows], value[:rows], k_cache, v_cache, meta.decode_rows,
                                        num_heads, num_kv_heads, head_dim, scale, layer)
    else:
        decoded = _decode_attention(query[:rows], k_cache, v_cache, meta, num_heads, num_kv_heads, head_dim, scale)
    return per_sequence_prefill(query, key, value, k_cache, v_cache, meta.prefill_spans, num_heads, num_kv_heads,
                                head_dim, scale, before=decoded)


def _decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                      num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> torch.Tensor:
    """A decode step's attention: token ``b`` is sequence ``b``'s one query, so queries and outputs need no index;
    pages come in one ``index_select`` over the flattened block tables, the query heads that share a KV head are
    that head's query rows (no K/V repeated per query head), and the boolean key mask (keys the context covers)
    is the only mask: the same softmax as the causal path, for about half its host time on tiny-granite."""
    batch = query.shape[0]
    blocks = meta.block_tables.flatten()
    keys = k_cache.index_select(0, blocks).view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)   # [B, kv, L, d]
    values = v_cache.index_select(0, blocks).view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
    queries = query.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)   # a KV head's group as rows
    bias = meta.attn_bias            # the key mask's additive form when the runner made it (once per step)
    mask = bias if bias is not None and bias.dtype.is_floating_point else meta.key_mask
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    return out.view(batch, num_heads * head_dim)
