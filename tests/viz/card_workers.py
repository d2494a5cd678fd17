"""What the many-card view tests run on every rank (through ``run_ranks``): each returns JSON for the parent."""

from __future__ import annotations

import torch
import torch.distributed as dist

from spyre_lab.compiler.explain import group_collectives
from spyre_lab.runtime import recording


def recorded_allreduces(rank: int, world: int, sizes: list[int]) -> dict:
    """This rank's modeled trace of one all-reduce per size, and the collectives its group recorded."""
    with recording() as trace:
        for n in sizes:
            dist.all_reduce(torch.ones(n, dtype=torch.float16, device="spyre"))
    return {"trace": trace.to_chrome_trace(),
            "collectives": [c.describe() for c in group_collectives()]}
