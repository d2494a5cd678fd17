"""Linear layers that know how to load checkpoint shards into one fused weight.

Keeping q/k/v (and gate/up) fused in one matrix means one matmul per step instead of three;
`weight_loader` copies each Hugging Face tensor into its slice. Names follow vLLM (with tensor
parallel size 1, column- and row-parallel layers are plain linears).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spyre_lab.engine.layers.custom_op import CustomOp, active_override


class Linear(CustomOp):
    op_name = "Linear"

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.zeros(output_size)) if bias else None

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if param.shape != loaded.shape:
            raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, layer expects {tuple(param.shape)}")
        param.data.copy_(loaded)


ReplicatedLinear = ColumnParallelLinear = Linear


def RowParallelLinear(input_size: int, output_size: int, bias: bool = False) -> Linear:
    """A projection whose input is split across cards (``o_proj``, ``down_proj``).

    On one card it is a plain `Linear`, so a platform's form of ``"Linear"`` applies to it as before; a model
    built with a form registered under ``"RowParallelLinear"`` (the tensor-parallel table) gets that form."""
    return (active_override("RowParallelLinear") or Linear)(input_size, output_size, bias)


class MergedColumnParallelLinear(Linear):
    """Several projections of the same input stacked along the output dim (e.g. gate and up)."""

    op_name = "MergedColumnParallelLinear"

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def _slice(self, shard: int) -> slice:
        start = sum(self.output_sizes[:shard])
        return slice(start, start + self.output_sizes[shard])

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if shard_id is None:
            return super().weight_loader(param, loaded)
        target = param.data[self._slice(self._shard_index(shard_id))]
        if target.shape != loaded.shape:
            raise ValueError(f"shard {shard_id!r} has shape {tuple(loaded.shape)}, expected {tuple(target.shape)}")
        target.copy_(loaded)

    def _shard_index(self, shard_id: str | int) -> int:
        return int(shard_id)


class QKVParallelLinear(MergedColumnParallelLinear):
    """Query, key and value projections in one matrix; shards are named "q", "k", "v"."""

    op_name = "QKVParallelLinear"

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], bias)

    def _shard_index(self, shard_id: str | int) -> int:
        return {"q": 0, "k": 1, "v": 2}[shard_id] if isinstance(shard_id, str) else int(shard_id)


class VocabEmbedding(CustomOp):
    op_name = "VocabEmbedding"

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward_native(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(Linear):
    """The output projection; `tie_to` shares the embedding matrix when the checkpoint ties them."""

    op_name = "LMHead"

    def tie_to(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight
