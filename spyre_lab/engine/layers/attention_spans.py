"""Prefill attention that reads only the keys each sequence owns: one sequence at a time.

The paged path in `attention` lays a prefill step's sequences out as a [B, longest query] rectangle, gathers every
block table to the widest one and attends over that rectangle with a dense [B, 1, Q, L] additive mask. On a mixed
load (prompts of 5 to 190 tokens in one step) most of that rectangle is masked out. Here, on a platform that asks
for it (``Platform.per_sequence_attention``, dynamic shapes), each sequence attends alone:

* a fresh prompt's keys are exactly this step's keys, so it reads them straight from the step: no gather, no
  mask (SDPA's causal form);
* a sequence behind a cached prefix gathers only its own blocks and takes a [queries, context] boolean mask.

It is the same softmax over the same keys as the dense path (``tests/engine/test_attention_spans.py``). The spans
are built on the host with the step's other inputs (`ModelRunner.prepare_prefill`).

Decode steps keep one batched call (`attention._decode_attention`): cutting a decode batch into groups of similar
table width, each over its own width, measured slower on tiny-granite (three SDPA calls and their gathers cost more
than the masked keys they skip).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PrefillSpan:
    """One prefill sequence: its tokens ``[start, start + queries)`` of the step and the keys they see."""

    start: int
    queries: int
    # [blocks] int64 ids of the blocks its context covers, and its [queries, context] bool mask (query i sees the
    # keys at or before its position); both None for a fresh prompt, whose keys are this step's own
    blocks: torch.Tensor | None = None
    mask: torch.Tensor | None = None


def prefill_spans(starts: list[int], query_lens: list[int], context_lens: list[int], tables: list[list[int]],
                  block_size: int) -> tuple[PrefillSpan, ...]:
    """The per-sequence spans of a prefill step (host side): one per sequence, in the step's token order."""
    spans = []
    for start, queries, context, table in zip(starts, query_lens, context_lens, tables, strict=True):
        if queries == context:
            spans.append(PrefillSpan(start, queries))
            continue
        first = context - queries
        visible = torch.arange(context).view(1, -1) <= torch.arange(first, context).view(-1, 1)
        spans.append(PrefillSpan(start, queries, torch.tensor(table[:-(-context // block_size)]), visible))
    return tuple(spans)


def per_sequence_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, spans: tuple[PrefillSpan, ...], num_heads: int, num_kv_heads: int,
                         head_dim: int, scale: float, before: torch.Tensor | None = None) -> torch.Tensor:
    """[T, heads * d]: each span's queries over its own keys (this step's, or its blocks' after the write); after
    ``before``'s rows when given (a mixed step's decode rows: one concatenation for the step, not two)."""
    gqa = num_kv_heads != num_heads
    outs = [] if before is None else [before]
    for span in spans:
        stop = span.start + span.queries
        queries = query[span.start:stop].view(1, span.queries, num_heads, head_dim).transpose(1, 2)
        if span.blocks is None:
            keys = key[span.start:stop].view(1, span.queries, num_kv_heads, head_dim).transpose(1, 2)
            values = value[span.start:stop].view(1, span.queries, num_kv_heads, head_dim).transpose(1, 2)
            out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            context = span.mask.shape[1]
            keys = k_cache.index_select(0, span.blocks).view(1, -1, num_kv_heads, head_dim)[:, :context]
            values = v_cache.index_select(0, span.blocks).view(1, -1, num_kv_heads, head_dim)[:, :context]
            out = F.scaled_dot_product_attention(queries, keys.transpose(1, 2), values.transpose(1, 2),
                                                 attn_mask=span.mask, scale=scale, enable_gqa=gqa)
        outs.append(out.transpose(1, 2).reshape(span.queries, num_heads * head_dim))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
