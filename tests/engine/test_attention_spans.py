"""Per-sequence prefill attention (the cpu platform, dynamic shapes): each sequence over only its own keys.

It must give the dense path's outputs (the same softmax over the same keys) for fresh prompts and for sequences
behind a cached prefix, write the same cache, and the model runner must build the spans and no dense mask.
"""

from __future__ import annotations

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
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


def _prefills(llm: LLM, prompts: list[str]) -> list[AttentionMetadata]:
    runner, seen = llm.llm_engine.runner, []
    execute = runner.execute

    def record(model_input):
        seen.append(model_input.meta)
        return execute(model_input)

    runner.execute = record
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    return [m for m in seen if m.key_mask is None]


def test_the_runner_builds_spans_and_no_dense_mask_for_cpu_prefill():
    llm = LLM("tiny-granite", max_model_len=64, max_num_seqs=2, enable_prefix_caching=False)
    prefills = _prefills(llm, ["3 + 4 =", "count from 5 to 12:"])
    assert prefills and all(m.attn_bias is None and m.prefill_spans is not None for m in prefills)
    assert sum(len(m.prefill_spans) for m in prefills) == 2


def test_a_static_shape_step_keeps_the_dense_path():
    from spyre_lab.engine.platforms.cpu import CpuPlatform

    platform = CpuPlatform(static_shapes=True, prefill_buckets=[64], batch_buckets=[2])
    llm = LLM("tiny-granite", platform=platform, max_model_len=64, max_num_seqs=2, enable_prefix_caching=False)
    prefills = _prefills(llm, ["3 + 4 ="])
    assert prefills and all(m.prefill_spans is None and m.attn_bias is not None for m in prefills)
