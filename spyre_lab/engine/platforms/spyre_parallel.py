"""The spyre platform's forms of the sharded layers: each is the platform's single-card form and the sharded
layer at once (multiple inheritance), so a tensor-parallel rank on a card keeps what the card needs.

- the column-parallel linears keep their weight transposed (`transposed_linear`): this rank's slice of
  the output rows, stored ``[in, out/k]`` once at load time;
- the row-parallel linear multiplies by its transposed ``[in/k, out]`` slice, then sums the partials with
  the card all-reduce (an opaque op the piecewise backend runs between compiled pieces; spyreccl
  charges its modeled time on the card's clock);
- attention is the platform's paged-attention op (one kernel launch, or the eager device ops) over
  this rank's query heads and KV heads.

The vocab-parallel embedding and LM head need no form of their own: the spyre platform replaces neither layer.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spyre_lab.engine.layers.tensor_parallel import (
    ShardedAttention,
    ShardedMergedColumnLinear,
    ShardedQKVLinear,
    ShardedRowLinear,
)
from spyre_lab.engine.parallel.group import all_reduce
from spyre_lab.engine.platforms.paged_attention_op import KernelAttention, OpaqueAttention
from spyre_lab.engine.platforms.transposed_linear import (
    TransposedMergedColumnParallelLinear,
    TransposedQKVParallelLinear,
    TransposedWeight,
)


class TransposedShardedMergedColumnLinear(TransposedMergedColumnParallelLinear, ShardedMergedColumnLinear):
    pass


class TransposedShardedQKVLinear(TransposedQKVParallelLinear, ShardedQKVLinear):
    pass


class TransposedShardedRowLinear(TransposedWeight, ShardedRowLinear):
    """``x @ weight_t`` over this rank's input columns, then the all-reduce of the partial outputs."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        if not self.is_transposed:
            return self.forward_native(x)
        out = all_reduce(x @ self.weight_t, self.group)
        return out if self.bias is None else out + self.bias


class ShardedKernelAttention(KernelAttention, ShardedAttention):
    pass


class ShardedOpaqueAttention(OpaqueAttention, ShardedAttention):
    pass


def spyre_sharded_layers(sharded: Mapping[str, type], attention: type | None,
                         transposed: bool) -> dict[str, type]:
    """``sharded`` with the spyre forms for a platform whose attention layer is ``attention`` (None: the
    portable one, eager ops) and whose linears keep their weights transposed when ``transposed``."""
    layers = dict(sharded)
    if attention is KernelAttention:
        layers["Attention"] = ShardedKernelAttention
    elif attention is OpaqueAttention:
        layers["Attention"] = ShardedOpaqueAttention
    if transposed:
        layers.update(MergedColumnParallelLinear=TransposedShardedMergedColumnLinear,
                      QKVParallelLinear=TransposedShardedQKVLinear, RowParallelLinear=TransposedShardedRowLinear)
    return layers
