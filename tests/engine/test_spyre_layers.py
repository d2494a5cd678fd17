"""The spyre platform's layer variants compute what the portable layers compute (checked on the CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from spyre_lab.engine.layers.activation import SiluAndMul
from spyre_lab.engine.layers.attention import AttentionMetadata, causal_bias, paged_attention
from spyre_lab.engine.layers.linear import QKVParallelLinear
from spyre_lab.engine.layers.rotary import RotaryEmbedding
from spyre_lab.engine.platforms.base import Platform, set_current_platform
from spyre_lab.engine.platforms.paged_attention_op import grouped_paged_attention, is_paged_attention
from spyre_lab.engine.platforms.piecewise import canonicalize, split_at_host_calls
from spyre_lab.engine.platforms.spyre_layers import DEVICE_LAYERS
from spyre_lab.engine.platforms.transposed_linear import TRANSPOSED_LINEARS


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (4, 4), (8, 1)])
def test_grouped_paged_attention_equals_the_portable_one(num_heads, num_kv_heads):
    """Two sequences (a 3-token prefill after 5 cached tokens, a 2-token prompt), GQA or not; same
    outputs and the same cache writes as `layers.attention.paged_attention`."""
    head_dim, block_size, num_blocks = 16, 4, 6
    k_cache, v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, seed=0), randn(
        num_blocks, block_size, num_kv_heads, head_dim, seed=1)
    query, key, value = (randn(6, n * head_dim, seed=s) for s, n in ((2, num_heads), (3, num_kv_heads),
                                                                      (4, num_kv_heads)))
    query_positions = torch.tensor([[5, 6, 7], [0, 1, 0]])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([1, 2, 3, 8, 9, 20]),  # positions 5-7 in block 0, 0-1 in block 2; padding: 5
        block_tables=torch.tensor([[1, 0], [2, 5]]),
        query_index=torch.tensor([[0, 1, 2], [3, 4, 0]]),
        attn_bias=causal_bias(query_positions, 2 * block_size, torch.float32),
        out_index=torch.tensor([0, 1, 2, 3, 4, 0]),
    )
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    expected = paged_attention(query, key, value, *caches[0], meta, num_heads, num_kv_heads, head_dim, 0.25)
    got = grouped_paged_attention(query, key, value, *caches[1], meta, num_heads, num_kv_heads, head_dim, 0.25)
    torch.testing.assert_close(got, expected)
    assert all(torch.equal(a, b) for a, b in zip(caches[0], caches[1]))
    assert not torch.equal(caches[1][0], k_cache)  # the step's keys were written


def test_causal_bias_hides_later_keys():
    bias = causal_bias(torch.tensor([[2, 0]]), 4, torch.float16)
    assert bias.shape == (1, 1, 2, 4) and bias.dtype == torch.float16
    assert (bias[0, 0] == 0).tolist() == [[True, True, True, False], [True, False, False, False]]


def test_device_layers_equal_the_portable_layers():
    x = randn(5, 64, seed=0)
    torch.testing.assert_close(DEVICE_LAYERS["SiluAndMul"]().forward(x), SiluAndMul().forward(x))
    rope, reference = DEVICE_LAYERS["RotaryEmbedding"](16, 32), RotaryEmbedding(16, 32)
    positions, q, k = torch.tensor([0, 3, 7, 31, 2]), randn(5, 4 * 16, seed=1), randn(5, 2 * 16, seed=2)
    for got, expected in zip(rope(rope.cos_sin(positions), q, k), reference(reference.cos_sin(positions), q, k)):
        torch.testing.assert_close(got, expected)


def test_transposed_linear_stores_w_t_once_and_computes_x_w_t():
    platform = Platform()
    for name, layer in TRANSPOSED_LINEARS.items():
        platform.register_oot(name, layer)
    with set_current_platform(platform):
        qkv = QKVParallelLinear(32, 8, num_heads=4, num_kv_heads=2)
    qkv.weight.data.copy_(randn(64, 32, seed=0))
    x = randn(3, 32, seed=1)
    expected = torch.nn.functional.linear(x, qkv.weight)
    qkv.store_transposed()
    qkv.store_transposed()  # idempotent
    assert "weight" not in dict(qkv.named_parameters()) and qkv.weight_t.shape == (32, 64)
    assert qkv.weight_t.is_contiguous()
    torch.testing.assert_close(qkv(x), expected)


def test_split_at_host_calls_cuts_around_each_attention_and_canonical_pieces_match():
    def two_blocks(x, w0, w1, cache):
        for w in (w0, w1):
            h = torch.relu(x @ w)
            x = torch.ops.spyre_engine.paged_attention(h, h[:, :8], h[:, :8], cache, cache, *[cache] * 5, 1, 1, 8,
                                                       1.0) + x
        return x * 2

    gm = fx.symbolic_trace(two_blocks)
    split = split_at_host_calls(gm)
    children = dict(split.named_children())
    kinds = ["attention" if any(is_paged_attention(n) for n in m.graph.nodes) else "piece" for m in children.values()]
    assert kinds == ["piece", "attention", "piece", "attention", "piece"]
    first, middle, last = (canonicalize(children[name]) for name in ("submod_0", "submod_2", "submod_4"))
    assert "relu" in first.code and "relu" in middle.code and "relu" not in last.code
    assert all(n.name.startswith(("in", "v", "output")) for n in middle.graph.nodes)
