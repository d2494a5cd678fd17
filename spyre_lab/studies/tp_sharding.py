"""What one card of a ``k``-way tensor-parallel group holds and which collectives its step runs.

Ranks of a tensor-parallel group are symmetric (each holds ``1/k`` of every sharded weight and runs the same
programs), so a study can time **one rank** on the shapes :func:`shard_config` gives and add the collectives
:func:`step_collectives` lists, each priced by :mod:`spyre_lab.distributed.algorithms` over the card-to-card
link (an *estimate*). The sharding is vLLM's: QKV and gate/up column-parallel, ``o_proj`` and ``down_proj``
row-parallel (each followed by an all-reduce), vocabulary-parallel embedding (masked lookup + all-reduce) and
``lm_head`` (its logits shards gathered to rank 0), the KV cache split by KV heads.
"""

from __future__ import annotations

import dataclasses
import math

from spyre_lab.distributed.algorithms import CollectiveCost, allreduce_cost, gather_cost
from spyre_lab.engine.models.config import ModelConfig

TP_SIZES = (1, 2, 4, 8)
ACTIVATION_BYTES = 2  # fp16 activations on the card


def shard_config(config: ModelConfig, k: int) -> ModelConfig:
    """The layer shapes one card of a ``k``-way tensor-parallel group holds."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"tensor_parallel must be an int >= 1, got {k!r}")
    if k == 1:
        return config
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(config, name) % k:
            raise ValueError(f"{name}={getattr(config, name)} does not split over {k} cards; use a TP size that "
                             f"divides it (one of {[d for d in TP_SIZES if getattr(config, name) % d == 0]})")
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // k,
                               num_key_value_heads=config.num_key_value_heads // k,
                               intermediate_size=config.intermediate_size // k,
                               vocab_size=math.ceil(config.vocab_size / k))


def weight_bytes(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """Bytes of the weights a card holds for ``config`` (linear layers, embedding; norms are negligible)."""
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size
    embed = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return (per_layer * config.num_hidden_layers + embed) * dtype_bytes


def step_collectives(config: ModelConfig, k: int, kind: str, size: int) -> list[CollectiveCost]:
    """The modeled collectives of one step of one rank of the unsharded ``config`` (empty at TP 1)."""
    if k == 1:
        return []
    tokens = size  # prefill: one sequence of `size` tokens; decode: `size` sequences, one token each
    rows = 1 if kind == "prefill" else size  # logits are taken for the last token of each sequence
    activation = tokens * config.hidden_size * ACTIVATION_BYTES
    per_layer = [allreduce_cost(activation, k), allreduce_cost(activation, k)]  # after o_proj, after down_proj
    embedding = allreduce_cost(activation, k)
    logits = gather_cost(rows * math.ceil(config.vocab_size / k) * ACTIVATION_BYTES, k)
    return per_layer * config.num_hidden_layers + [embedding, logits]
