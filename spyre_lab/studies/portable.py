"""Portable layers vs native: the same engine and weights, the model's layers swapped for hand-written ones.

The engine's models are written only with portable ``CustomOp`` layers (a platform may swap any of them).
The published bar for such hardware-agnostic layers is "within 3.4% of native". This study builds a
hand-written model with the same parameter names (plain ``nn.Linear`` / ``nn.RMSNorm`` / inline RoPE, the
same paged-attention math), loads the same weights into it, swaps it into a second engine, and measures
both on the cpu platform: engine tokens/s and the model forward alone, alternating which runs first.
These are **measured** host wall-clock numbers (noisy on a shared machine), not modeled ones.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.attention import AttentionMetadata
from spyre_lab.engine.models.config import ModelConfig
from spyre_lab.engine.sequence import Sequence


# ---- a hand-written model with the same parameter names, no CustomOp layers ------------------------
class NativeLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.input_layernorm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = nn.Linear(c.hidden_size, q + 2 * kv, bias=False)
        self.self_attn.o_proj = nn.Linear(q, c.hidden_size, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.sizes = [q, kv, kv]
        self.k_cache = self.v_cache = torch.empty(0)

    def forward(self, hidden, cos, sin, meta: AttentionMetadata):
        c, t = self.c, hidden.shape[0]
        q, k, v = self.self_attn.qkv_proj(self.input_layernorm(hidden)).split(self.sizes, dim=-1)
        q, k = rope(q.view(t, -1, c.head_dim), cos, sin), rope(k.view(t, -1, c.head_dim), cos, sin)
        self.k_cache.view(-1, c.num_key_value_heads, c.head_dim).index_copy_(0, meta.slot_mapping, k)
        self.v_cache.view(-1, c.num_key_value_heads, c.head_dim).index_copy_(0, meta.slot_mapping, v.view_as(k))
        keys = self.k_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)
        values = self.v_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)
        queries = q[meta.query_index].transpose(1, 2)
        attn = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.attn_bias,
                                              scale=c.attention_scale, enable_gqa=True)
        attn = attn.transpose(1, 2).reshape(-1, q.shape[-2] * c.head_dim)[meta.out_index]
        hidden = hidden + self.self_attn.o_proj(attn) * c.residual_multiplier
        gate, up = self.mlp.gate_up_proj(self.post_attention_layernorm(hidden)).chunk(2, dim=-1)
        return hidden + self.mlp.down_proj(F.silu(gate) * up) * c.residual_multiplier


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class NativeGranite(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.config = c
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.model.layers = nn.ModuleList(NativeLayer(c) for _ in range(c.num_hidden_layers))
        self.model.norm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        freqs = torch.outer(torch.arange(c.max_position_embeddings, dtype=torch.float64), inv_freq).float()
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def forward(self, input_ids, positions, meta):
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        hidden = self.model.embed_tokens(input_ids) * self.config.embedding_multiplier
        for layer in self.model.layers:
            hidden = layer(hidden, cos, sin, meta)
        return self.model.norm(hidden)

    def compute_logits(self, hidden):
        return self.lm_head(hidden) / self.config.logits_scaling


def use_native_model(llm: LLM) -> None:
    """Swap the engine's model for the native one (same weights, same KV-cache tensors)."""
    engine = llm.llm_engine
    native = NativeGranite(engine.model_config)
    native.load_state_dict(engine.model.state_dict(), strict=True)
    for layer, (k, v) in zip(native.model.layers, engine.runner.kv_caches):
        layer.k_cache, layer.v_cache = k, v
    engine.model = engine.runner.model = native.eval()


# ---- measurements -------------------------------------------------------------------------------------
def engine_tokens_per_s(llm: LLM, prompts, new_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def forward_us(llm: LLM, model_input, calls: int = 50) -> float:
    """Mean microseconds of one model forward + logits on a fixed decode batch (no scheduling)."""
    runner = llm.llm_engine.runner
    start = time.perf_counter()
    for _ in range(calls):
        runner.execute(model_input)
    return (time.perf_counter() - start) / calls * 1e6


def decode_input(llm: LLM, batch: int):
    """A decode step for `batch` sequences of 17 tokens, built by the engine's own runner."""
    engine = llm.llm_engine
    seqs = [Sequence(str(i), [1, *range(10 + i, 26 + i)], SamplingParams()) for i in range(batch)]
    for seq in seqs:
        engine.block_manager.allocate(seq)
        seq.num_computed_tokens = len(seq) - 1
    model_input = engine.runner.prepare_decode(seqs)
    for seq in seqs:
        engine.block_manager.free(seq)
    return model_input


SIZES = {  # hidden, layers, heads, kv heads, intermediate
    "small": (64, 2, 4, 2, 128),
    "medium": (256, 4, 8, 4, 512),
    "large": (512, 8, 8, 4, 1408),
}




@dataclass
class PortableSize:
    """One model size: engine tokens/s (best of the repeats) and forward microseconds (median of pairs)."""

    name: str
    params: int
    portable_tok_s: float
    native_tok_s: float
    portable_fwd_us: float
    native_fwd_us: float
    forward_ratio: float
    same_tokens: bool

    @property
    def engine_overhead(self) -> float:
        return self.native_tok_s / self.portable_tok_s - 1

    @property
    def forward_overhead(self) -> float:
        return self.forward_ratio - 1


@dataclass
class PortableResult:
    sizes: list[PortableSize] = field(default_factory=list)

    @staticmethod
    def _geomean(values: list[float]) -> float:
        return math.exp(sum(map(math.log, values)) / len(values))

    @property
    def engine_overhead(self) -> float:
        """Geomean over sizes of native/portable tokens/s, minus 1 (positive: portable is slower)."""
        return self._geomean([1 + s.engine_overhead for s in self.sizes]) - 1

    @property
    def forward_overhead(self) -> float:
        return self._geomean([s.forward_ratio for s in self.sizes]) - 1


def portable_overhead(repeats: int = 5, new_tokens: int = 32, batch: int = 1,
                      sizes: dict[str, tuple[int, int, int, int, int]] | None = None) -> PortableResult:
    """Measure the portable layers against the native model at every size (see the module docstring)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GraniteConfig, GraniteForCausalLM

    result = PortableResult()
    for name, (hidden, layers, heads, kv_heads, inter) in (sizes or SIZES).items():
        with tempfile.TemporaryDirectory() as folder:
            torch.manual_seed(0)
            config = GraniteConfig(vocab_size=256, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter,
                                   max_position_embeddings=256, embedding_multiplier=4.0, residual_multiplier=0.5,
                                   attention_multiplier=0.125, logits_scaling=2.0)
            model = GraniteForCausalLM(config)
            params = sum(p.numel() for p in model.parameters())
            model.save_pretrained(folder)
            options = dict(max_model_len=128, max_num_seqs=batch, enable_prefix_caching=False)
            portable, native = LLM(folder, **options), LLM(folder, **options)
        use_native_model(native)
        prompts = [[1, *range(10 + i, 26 + i)] for i in range(batch)]
        check = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        same = [o.outputs[0].token_ids for o in portable.generate(prompts, check, use_tqdm=False)] == [
            o.outputs[0].token_ids for o in native.generate(prompts, check, use_tqdm=False)]
        portable_best = native_best = 0.0
        for i in range(repeats):
            order = (portable, native) if i % 2 == 0 else (native, portable)
            speeds = {id(llm): engine_tokens_per_s(llm, prompts, new_tokens) for llm in order}
            portable_best = max(portable_best, speeds[id(portable)])
            native_best = max(native_best, speeds[id(native)])
        model_input = decode_input(portable, batch)
        pairs = []  # forward only; adjacent pairs see the same machine load, so compare within a pair
        for i in range(6 * repeats):
            order = (portable, native) if i % 2 == 0 else (native, portable)
            us = {id(llm): forward_us(llm, model_input, 20) for llm in order}
            pairs.append((us[id(portable)], us[id(native)]))
        result.sizes.append(PortableSize(
            name, params, portable_best, native_best, statistics.median(p for p, _ in pairs),
            statistics.median(n for _, n in pairs), statistics.median(p / n for p, n in pairs), same))
    return result
