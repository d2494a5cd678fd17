"""The model hyper-parameters the engine needs, read from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("GraniteForCausalLM", "LlamaForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    # Granite's four scalars (Llama: all neutral; attention_multiplier None means 1/sqrt(head_dim))
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def attention_scale(self) -> float:
        return self.attention_multiplier if self.attention_multiplier is not None else self.head_dim**-0.5

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> ModelConfig:
        architectures = hf.get("architectures") or []
        architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise ValueError(
                f"config.json architectures {architectures} are not supported; "
                f"spyre_lab runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported; only the default (unscaled) RoPE")
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        granite = architecture == "GraniteForCausalLM"
        return cls(
            architecture=architecture,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
            mlp_bias=hf.get("mlp_bias", False),
            embedding_multiplier=hf.get("embedding_multiplier", 1.0) if granite else 1.0,
            residual_multiplier=hf.get("residual_multiplier", 1.0) if granite else 1.0,
            attention_multiplier=hf.get("attention_multiplier") if granite else None,
            logits_scaling=hf.get("logits_scaling", 1.0) if granite else 1.0,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
