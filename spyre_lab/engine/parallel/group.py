"""The tensor-parallel group a model is built for, and the collectives its sharded layers call.

Layers ask `current_group()` only while they are constructed (the model is built inside
`building_for(group)`) and keep the group they were built with, so a forward pass reads no global
state. Outside that block the group is None: every layer is its single-card form, unchanged.

The collectives go through ``torch.distributed`` on the group's process group: gloo for host
tensors (fp32 or fp16; gloo has no bfloat16 reduction, so a bf16 model is refused before any
worker starts); on the spyre platform the group is ``"cpu:gloo,spyre:spyreccl"`` and
``torch.distributed`` hands the card tensors to spyreccl, which charges each collective's modeled
time on the card's clock.

On a card the all-reduce is one opaque op, ``spyre_engine::all_reduce_``: ``torch.compile`` records it as
a single node instead of tracing into ``torch.distributed``, and the spyre platform's piecewise backend
cuts its graphs there (as at attention), so each collective runs on the host between two compiled
pieces, as spyreccl's host-driven collectives do in torch-spyre. On host tensors the layers call
``dist.all_reduce`` directly.
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


ALL_REDUCE_OP = "spyre_engine::all_reduce_"


def _all_reduce_(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` in place over the default process group (the engine's tensor-parallel group)."""
    dist.all_reduce(tensor)


card_all_reduce_ = torch.library.custom_op(ALL_REDUCE_OP, mutates_args=("tensor",))(_all_reduce_)


@card_all_reduce_.register_fake
def _(tensor: torch.Tensor) -> None:
    return None


def _call_targets(packet: torch._ops.OpOverloadPacket, function: Any) -> dict[Any, Any]:
    """Every target a graph node calling this op can carry (the packet as Dynamo may record it, its default
    overload, or the function itself once inlined), each mapped to the function its registration runs."""
    return {packet: function, packet.default: function, function: function}


COLLECTIVE_FUNCTIONS = _call_targets(torch.ops.spyre_engine.all_reduce_, _all_reduce_)
"""The collective ops a compiled graph may hold, each mapped to the function its registration runs."""


def is_collective(node: torch.fx.Node) -> bool:
    """Is this FX node a call of the card all-reduce op (as Dynamo recorded it, or as a direct call)?"""
    return node.op == "call_function" and node.target in COLLECTIVE_FUNCTIONS


def all_reduce(tensor: torch.Tensor, group: TensorParallelGroup) -> torch.Tensor:
    """Sum ``tensor`` over the group in place (the partial outputs of a row-parallel matmul); returns it.

    A card tensor goes through the opaque op (so a compiled graph is cut there); a host tensor straight to
    ``torch.distributed``."""
    if tensor.device.type == "spyre" and group.process_group is None:
        card_all_reduce_(tensor)
    else:
        dist.all_reduce(tensor, group=group.process_group)
    return tensor


def gather_to_first(tensor: torch.Tensor, group: TensorParallelGroup) -> list[torch.Tensor] | None:
    """Every rank's ``tensor`` on rank 0, in rank order (None elsewhere): the vocab slices of the logits."""
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(group.size)] if group.rank == 0 else None
    dist.gather(tensor, parts, dst=0, group=group.process_group)
    return parts
