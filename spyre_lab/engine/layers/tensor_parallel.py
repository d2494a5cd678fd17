"""The sharded forms of the layers, as vLLM and nano-vllm split a decoder across cards.

- column-parallel (``qkv_proj``, ``gate_up_proj``): each rank holds a slice of the output rows and
  computes its slice of the output; no communication (the next layer consumes the slice);
- row-parallel (``o_proj``, ``down_proj``): each rank holds the matching slice of the input columns,
  computes a partial sum of the full output, and one all-reduce adds the partials;
- vocab-parallel embedding: each rank holds a slice of the vocabulary rows, looks up the ids that fall
  in it (others read as zeros) and an all-reduce assembles every token's row;
- the LM head: each rank scores its vocab slice; the slices are gathered to rank 0, which samples;
- attention: each rank owns ``heads / k`` query heads and their KV heads, so its KV cache holds only
  those (``kv_heads / k`` per rank; with fewer KV heads than ranks each rank keeps the one its query
  heads read, replicated, as vLLM does).

They are CustomOps: the portable ``forward_native`` here, a platform may register its own form under the
same name. `TENSOR_PARALLEL_LAYERS` is the table the engine builds a sharded model with; every layer
reads its group once, at construction (`spyre_lab.engine.parallel.group.current_group`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spyre_lab.engine.layers.attention import Attention
from spyre_lab.engine.layers.linear import Linear, LMHead, MergedColumnParallelLinear, QKVParallelLinear, VocabEmbedding
from spyre_lab.engine.parallel.group import TensorParallelGroup, all_reduce, current_group, gather_to_first


def _group() -> TensorParallelGroup:
    group = current_group()
    if group is None:
        raise RuntimeError("a tensor-parallel layer was built outside parallel.group.building_for(group)")
    return group


def kv_head_shard(num_kv_heads: int, group: TensorParallelGroup) -> tuple[int, int]:
    """(first KV head, KV heads) this rank keeps: an even split, or one replicated head when heads < ranks."""
    if num_kv_heads >= group.size:
        return group.shard(num_kv_heads)
    if group.size % num_kv_heads:
        raise ValueError(f"tensor_parallel_size={group.size} must be a multiple of the model's {num_kv_heads} KV "
                         "heads to replicate them; choose a size that divides or is a multiple of it")
    return group.rank * num_kv_heads // group.size, 1


class ShardedMergedColumnLinear(MergedColumnParallelLinear):
    """Each stacked projection split along its output rows; this rank keeps slice ``rank`` of each."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.group = _group()
        shards = [self.group.shard(size) for size in output_sizes]
        super().__init__(input_size, [length for _, length in shards], bias)
        self.shard_starts = [start for start, _ in shards]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if shard_id is None:
            raise ValueError(f"{type(self).__name__} loads its checkpoint per shard (q/k/v, gate/up), not whole")
        index = self._shard_index(shard_id)
        super().weight_loader(param, loaded.narrow(0, self.shard_starts[index], self.output_sizes[index]), shard_id)


class ShardedQKVLinear(QKVParallelLinear, ShardedMergedColumnLinear):
    """This rank's query heads and the KV heads they read."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        self.group = group = _group()
        q_start, q_heads = group.shard(num_heads)
        kv_start, kv_heads = kv_head_shard(num_kv_heads, group)
        MergedColumnParallelLinear.__init__(self, hidden_size, [q_heads * head_dim, kv_heads * head_dim,
                                                                kv_heads * head_dim], bias)
        self.shard_starts = [q_start * head_dim, kv_start * head_dim, kv_start * head_dim]


class ShardedRowLinear(Linear):
    """This rank's slice of the input columns; the partial outputs are summed by one all-reduce."""

    op_name = "RowParallelLinear"

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        self.group = _group()
        self.input_start, local = self.group.shard(input_size)
        super().__init__(local, output_size, bias)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        out = all_reduce(F.linear(x, self.weight), self.group)
        return out if self.bias is None else out + self.bias

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if param is self.weight:
            loaded = loaded.narrow(1, self.input_start, self.input_size)
        super().weight_loader(param, loaded)


def _load_vocab_rows(param: nn.Parameter, loaded: torch.Tensor, start: int) -> None:
    """Copy this rank's vocab rows of ``loaded``; rows past the vocabulary (padding) stay zero."""
    rows = max(0, min(param.shape[0], loaded.shape[0] - start))
    if loaded.shape[1:] != param.shape[1:]:
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, layer expects rows of "
                         f"{tuple(param.shape[1:])}")
    param.data.zero_()
    param.data[:rows].copy_(loaded.narrow(0, start, rows))


class VocabParallelEmbedding(VocabEmbedding):
    """This rank's slice of the vocabulary; ids outside it read zeros and an all-reduce fills them in."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        self.group = _group()
        self.vocab_start, local = self.group.padded_shard(num_embeddings)
        super().__init__(local, embedding_dim)

    def forward_native(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill_(outside.unsqueeze(-1), 0)
        return all_reduce(rows, self.group)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        _load_vocab_rows(param, loaded, self.vocab_start)


class ParallelLMHead(LMHead):
    """Scores this rank's vocab slice; rank 0 gathers the slices into the full logits (None on other ranks)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        if bias:
            raise ValueError("a vocab-parallel LM head has no bias")
        self.group = _group()
        self.vocab_size = output_size
        self.vocab_start, local = self.group.padded_shard(output_size)
        super().__init__(input_size, local)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor | None:
        parts = gather_to_first(F.linear(x, self.weight), self.group)
        return None if parts is None else torch.cat(parts, dim=-1)[..., : self.vocab_size]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        _load_vocab_rows(param, loaded, self.vocab_start)


class ShardedAttention(Attention):
    """This rank's query heads and KV heads; the model runner sizes its KV cache from ``num_kv_heads``."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int) -> None:
        group = _group()
        _, local_heads = group.shard(num_heads)
        _, local_kv = kv_head_shard(num_kv_heads, group)
        super().__init__(local_heads, head_dim, scale, local_kv)


TENSOR_PARALLEL_LAYERS: dict[str, type] = {
    "QKVParallelLinear": ShardedQKVLinear,
    "MergedColumnParallelLinear": ShardedMergedColumnLinear,
    "RowParallelLinear": ShardedRowLinear,
    "VocabEmbedding": VocabParallelEmbedding,
    "LMHead": ParallelLMHead,
    "Attention": ShardedAttention,
}
