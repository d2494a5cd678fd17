"""Per-sequence prefill attention (the cpu platform, dynamic shapes): each sequence over only its own keys.

It must give the dense path's outputs (the same softmax over the same keys) for fresh prompts and for sequences
behind a cached prefix, and write the same cache (the runner's side: test_cpu_decode_attention.py).
"""

from __future__ import annotations

import pytest
import torch

from spyre_lab.engine.layers.attention import AttentionMetadata, causal_bias, paged_attention
from spyre_lab.engine.layers.attention_spans import prefill_spans


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_sequence_prefill_equals_the_dense_path(seed):
    g = torch.Generator().manual_seed(seed)
    heads, kv, d, bs = 4, 2, 32, 16
    contexts = torch.randint(1, 70, (4,), generator=g).tolist()
    cached = [0, 0, contexts[2] // 2, contexts[3] - 1]        # two fresh prompts, two behind a cached prefix
    queries = [c - p for c, p in zip(contexts, cached)]
    width = max(-(-n // bs) for n in contexts)
    tables = torch.randperm(4 * width, generator=g).view(4, width)
    caches = torch.randn(2, 4 * width + 1, bs, kv, d, generator=g)
    tokens = sum(queries)
    query, key, value = (torch.randn(tokens, n * d, generator=g) for n in (heads, kv, kv))
    starts = torch.tensor([0, *queries]).cumsum(0)[:-1].tolist()
    slots = torch.tensor([tables[b, p // bs].item() * bs + p % bs
                          for b in range(4) for p in range(cached[b], contexts[b])])
    longest = max(queries)
    query_index = torch.zeros(4, longest, dtype=torch.long)
    positions = torch.zeros(4, longest, dtype=torch.long)
    for b in range(4):
        query_index[b, :queries[b]] = torch.arange(starts[b], starts[b] + queries[b])
        positions[b, :queries[b]] = torch.arange(cached[b], contexts[b])
    out_index = torch.tensor([b * longest + q for b in range(4) for q in range(queries[b])])
    common = dict(slot_mapping=slots, block_tables=tables, query_index=query_index, out_index=out_index)
    dense = AttentionMetadata(attn_bias=causal_bias(positions, width * bs, torch.float32), **common)
    spans = prefill_spans(starts, queries, contexts, tables.tolist(), bs)
    assert [s.blocks is None for s in spans] == [True, True, False, False]
    per_sequence = AttentionMetadata(attn_bias=None, prefill_spans=spans, **common)
    written = [caches.clone() for _ in range(2)]
    out_dense = paged_attention(query, key, value, *written[0], dense, heads, kv, d, d ** -0.5)
    out_spans = paged_attention(query, key, value, *written[1], per_sequence, heads, kv, d, d ** -0.5)
    assert torch.equal(written[0], written[1])
    torch.testing.assert_close(out_spans, out_dense, atol=1e-6, rtol=1e-5)
