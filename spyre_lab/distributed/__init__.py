"""spyre_lab.distributed: many cards on ``torch.distributed``, one card per process.

Importing this package registers the ``spyreccl`` c10d backend, so
``dist.init_process_group("cpu:gloo,spyre:spyreccl")`` works as in torch-spyre. Collectives on spyre tensors
compute their values through gloo and charge **modeled** time from named algorithms over modeled links
(the card-to-card link is an estimate: :data:`~spyre_lab.distributed.links.CARD_LINK`).
"""

from __future__ import annotations

from spyre_lab.compiler.explain import COLLECTIVE_SOURCES
from spyre_lab.distributed.algorithms import (
    CollectiveCost,
    allgather_cost,
    allreduce_cost,
    barrier_cost,
    broadcast_cost,
    gather_cost,
    reduce_cost,
    send_cost,
)
from spyre_lab.distributed.backend import BACKEND_NAME, SpyreCCLNotSupportedError, SpyreCCLProcessGroup, register
from spyre_lab.distributed.links import (
    CardLinkEstimate,
    Link,
    card_link,
    host_staged_link,
    pcie_link,
    set_card_link,
)

__all__ = [
    "BACKEND_NAME", "CardLinkEstimate", "CollectiveCost", "Link", "SpyreCCLNotSupportedError",
    "SpyreCCLProcessGroup", "allgather_cost", "allreduce_cost", "barrier_cost", "broadcast_cost", "card_link",
    "gather_cost", "host_staged_link", "pcie_link", "reduce_cost", "register", "send_cost", "set_card_link",
]



def _world_history() -> list[CollectiveCost]:
    """The collectives the default process group has run, when it is a spyreccl group (for explain())."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return []
    group = dist.group.WORLD
    return list(group.history) if isinstance(group, SpyreCCLProcessGroup) else []


register()
COLLECTIVE_SOURCES.append(_world_history)
