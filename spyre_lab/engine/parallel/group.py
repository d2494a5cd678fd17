"""The tensor-parallel group a model is built for, and the collectives its sharded layers call.

Layers ask `current_group()` only while they are constructed (the model is built inside
`building_for(group)`) and keep the group they were built with, so a forward pass reads no global
state. Outside that block the group is None: every layer is its single-card form, unchanged.

The collectives go through ``torch.distributed`` on the group's process group: gloo for host
tensors (fp32 or fp16; gloo has no bfloat16 reduction, so a bf16 model is refused before any
worker starts). A card backend registered for device tensors (``"cpu:gloo,spyre:spyreccl"``) would
be picked by ``torch.distributed`` from the tensor's device with no change here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallelGroup:
    """This process's place in the group: ``rank`` of ``size`` cards; ``process_group`` None means the default."""

    rank: int
    size: int
    process_group: Any = None

    def shard(self, total: int) -> tuple[int, int]:
        """(start, length) of this rank's equal slice of ``total`` rows; a ValueError if they do not divide."""
        if total % self.size:
            raise ValueError(f"{total} does not split evenly across tensor_parallel_size={self.size}; choose a size "
                             f"that divides it")
        length = total // self.size
        return self.rank * length, length

    def padded_shard(self, total: int) -> tuple[int, int]:
        """(start, length) of this rank's slice of ``total`` padded up to a multiple of the size (vocab rows)."""
        length = -(-total // self.size)
        return self.rank * length, length


_current: TensorParallelGroup | None = None


@contextlib.contextmanager
def building_for(group: TensorParallelGroup | None) -> Iterator[None]:
    """Layers constructed inside this block are the sharded forms for ``group`` (None: single card)."""
    global _current
    previous, _current = _current, group
    try:
        yield
    finally:
        _current = previous


def current_group() -> TensorParallelGroup | None:
    return _current


def all_reduce(tensor: torch.Tensor, group: TensorParallelGroup) -> torch.Tensor:
    """Sum ``tensor`` over the group in place (the partial outputs of a row-parallel matmul); returns it."""
    dist.all_reduce(tensor, group=group.process_group)
    return tensor


def gather_to_first(tensor: torch.Tensor, group: TensorParallelGroup) -> list[torch.Tensor] | None:
    """Every rank's ``tensor`` on rank 0, in rank order (None elsewhere): the vocab slices of the logits."""
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(group.size)] if group.rank == 0 else None
    dist.gather(tensor, parts, dst=0, group=group.process_group)
    return parts
