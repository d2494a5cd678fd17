"""The cpu platform's decode attention: one index_select per cache and a [B, 1, 1, L] key mask (boolean, and its
additive form made once per step), no [B, 1, Q, L] causal mask.

It must give the causal path's outputs (the same softmax over the same keys), and the model runner must build
the key mask, not the [B, 1, Q, L] float mask, for a decode step on the cpu platform.
"""

from __future__ import annotations

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.attention import AttentionMetadata, causal_bias, paged_attention
from spyre_lab.engine.platforms.cpu import CpuPlatform


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_path_equals_the_causal_path(seed):
    g = torch.Generator().manual_seed(seed)
    heads, kv, d, bs = 4, 2, 32, 16
    lens = torch.randint(1, 70, (5,), generator=g).tolist()
    width = max(-(-n // bs) for n in lens)
    blocks = torch.randperm(5 * width, generator=g).view(5, width)
    k_cache, v_cache = torch.randn(5 * width + 1, bs, kv, d, generator=g), torch.randn(5 * width + 1, bs, kv, d,
                                                                                   generator=g)
    query, key, value = torch.randn(5, heads * d, generator=g), torch.randn(5, kv * d, generator=g), torch.randn(
        5, kv * d, generator=g)
    slots = torch.tensor([blocks[b, (n - 1) // bs].item() * bs + (n - 1) % bs for b, n in enumerate(lens)])
    positions = torch.tensor(lens).view(5, 1) - 1
    common = dict(slot_mapping=slots, block_tables=blocks, query_index=torch.arange(5).view(5, 1),
                  out_index=torch.arange(5))
    dense = AttentionMetadata(attn_bias=causal_bias(positions, width * bs, torch.float32), **common)
    mask = torch.arange(width * bs).view(1, 1, 1, -1) <= positions.view(5, 1, 1, 1)
    decode = AttentionMetadata(attn_bias=mask, key_mask=mask, **common)
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    out_dense = paged_attention(query, key, value, *caches[0], dense, heads, kv, d, d ** -0.5)
    out_decode = paged_attention(query, key, value, *caches[1], decode, heads, kv, d, d ** -0.5)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    torch.testing.assert_close(out_decode, out_dense, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_the_runner_builds_a_key_mask_for_cpu_decode_steps(static):
    """Decode: the key mask with static shapes (decode rows with dynamic ones). Prefill: per-sequence spans and no
    dense mask (dynamic shapes, `attention_spans`),
    the dense [B, 1, Q, L] mask with static shapes (padded steps keep the one-graph path)."""
    platform = CpuPlatform(static_shapes=True, prefill_buckets=[64], batch_buckets=[2]) if static else "cpu"
    llm = LLM("tiny-granite", platform=platform, max_model_len=64, max_num_seqs=2, enable_prefix_caching=False)
    runner, seen = llm.llm_engine.runner, []
    execute = runner.execute

    def record(model_input):
        seen.append(model_input.meta)
        return execute(model_input)

    runner.execute = record
    llm.generate(["3 + 4 =", "count from 5 to 12:"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    decodes = [m for m in seen if m.query_index.shape[1] == 1]
    prefills = [m for m in seen if m.query_index.shape[1] > 1]
    assert decodes and prefills
    if not static:      # dynamic shapes: decode rows kept across steps, their own mask (`test_decode_rows`)
        assert all(m.decode_rows is not None and m.key_mask is None and m.attn_bias is None for m in decodes)
        decodes = []
    assert all(m.key_mask is not None and m.key_mask.dtype == torch.bool and m.attn_bias.dtype == runner.dtype
               and torch.equal(m.attn_bias == 0, m.key_mask)
               and m.key_mask.shape[:3] == (m.block_tables.shape[0], 1, 1) for m in decodes)
    if static:
        assert all(m.key_mask is None and m.prefill_spans is None and m.attn_bias.dtype == runner.dtype
                   for m in prefills)
    else:
        assert all(m.key_mask is None and m.attn_bias is None and m.prefill_spans is not None for m in prefills)
        assert sum(len(m.prefill_spans) for m in prefills) == 2
