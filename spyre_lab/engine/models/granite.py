"""Granite (and Llama) decoder written only with portable layers from `engine/layers`.

Granite is Llama plus four scalars: inputs are scaled by `embedding_multiplier`, each residual
branch by `residual_multiplier`, attention scores by `attention_multiplier` (instead of
1/sqrt(head_dim)) and logits divided by `logits_scaling`. With those at their neutral values the
same code is Llama, so `LlamaForCausalLM` is this class under another name.

Tokens of all sequences in a step are flattened into one dimension `[T, hidden]`; what each token
may attend to is described by `AttentionMetadata`, so prefill, decode and padding use one graph.
Every layer rotates by the same angles, so the model holds one `RotaryEmbedding` (shared by the
layers, as vLLM's `get_rope` shares it) and gathers each token's cos/sin once per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from spyre_lab.engine.layers.activation import SiluAndMul
from spyre_lab.engine.layers.attention import Attention, AttentionMetadata
from spyre_lab.engine.layers.linear import (
    LMHead,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    VocabEmbedding,
)
from spyre_lab.engine.layers.norm import RMSNorm
from spyre_lab.engine.layers.rotary import CosSin, RotaryEmbedding
from spyre_lab.engine.models.config import ModelConfig
from spyre_lab.engine.weight_dtype import cast_weight


class GraniteAttention(nn.Module):
    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, config.head_dim, config.num_attention_heads, config.num_key_value_heads,
            bias=config.attention_bias,
        )
        # this card's query and key/value widths (all of them on one card; a shard of them under tensor parallelism)
        self.q_size, self.kv_size = self.qkv_proj.output_sizes[:2]
        self.o_proj = RowParallelLinear(config.num_attention_heads * config.head_dim, config.hidden_size,
                                        bias=config.attention_bias)
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            config.num_attention_heads, config.head_dim, config.attention_scale, config.num_key_value_heads
        )

    def forward(self, cos_sin: CosSin, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(cos_sin, q, k)
        return self.o_proj(self.attn(q, k, v, meta))


class GraniteMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=config.mlp_bias
        )
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class GraniteDecoderLayer(nn.Module):
    """One block: pre-norm attention and pre-norm SwiGLU MLP, each added back to the residual stream."""

    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = GraniteAttention(config, rotary_emb)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GraniteMLP(config)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, cos_sin: CosSin, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """`cos_sin`: the step's rotary angles, `model.rotary_emb.cos_sin(positions)`."""
        hidden = hidden + self.self_attn(cos_sin, self.input_layernorm(hidden), meta) * self.residual_multiplier
        return hidden + self.mlp(self.post_attention_layernorm(hidden)) * self.residual_multiplier


class GraniteModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.layers = nn.ModuleList(
            GraniteDecoderLayer(config, self.rotary_emb) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embedding_multiplier = config.embedding_multiplier

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.embedding_multiplier
        cos_sin = self.rotary_emb.cos_sin(positions)
        for layer in self.layers:
            hidden = layer(cos_sin, hidden, meta)
        return self.norm(hidden)


class GraniteForCausalLM(nn.Module):
    # Hugging Face tensor name fragment -> (our parameter fragment, shard of a fused weight)
    fused_shards: ClassVar[dict[str, tuple[str, str | int]]] = {
        ".q_proj.": (".qkv_proj.", "q"),
        ".k_proj.": (".qkv_proj.", "k"),
        ".v_proj.": (".qkv_proj.", "v"),
        ".gate_proj.": (".gate_up_proj.", 0),
        ".up_proj.": (".gate_up_proj.", 1),
    }

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GraniteModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)
        self.logits_scaling = config.logits_scaling

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Final hidden states [T, hidden] for the step's flat tokens."""
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits [rows, vocab]; None on a tensor-parallel rank other than 0 (its vocab slice went to rank 0)."""
        logits = self.lm_head(hidden)
        return None if logits is None else logits / self.logits_scaling

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face tensors into our (partly fused) parameters; return the names loaded."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if "rotary_emb.inv_freq" in hf_name:
                continue
            if hf_name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            name, shard = hf_name, None
            for fragment, (replacement, shard_id) in self.fused_shards.items():
                if fragment in hf_name:
                    name, shard = hf_name.replace(fragment, replacement), shard_id
                    break
            if name not in params:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no place in {type(self).__name__}")
            param = params[name]
            layer = self.get_submodule(name.rsplit(".", 1)[0])
            tensor = cast_weight(hf_name, tensor, param.dtype)  # the dtype policy: weight_dtype.py
            if shard is not None:
                layer.weight_loader(param, tensor, shard)
            elif hasattr(layer, "weight_loader"):
                layer.weight_loader(param, tensor)
            elif param.shape == tensor.shape:
                param.data.copy_(tensor)
            else:
                raise ValueError(f"{hf_name!r} has shape {tuple(tensor.shape)}, model expects {tuple(param.shape)}")
            loaded.add(name)
        return loaded


class LlamaForCausalLM(GraniteForCausalLM):
    """Llama: Granite with neutral multipliers (ModelConfig sets them for this architecture)."""


MODEL_REGISTRY: dict[str, type[GraniteForCausalLM]] = {
    "GraniteForCausalLM": GraniteForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
}
