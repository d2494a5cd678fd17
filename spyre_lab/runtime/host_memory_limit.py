"""When the machine simulating the card runs out of RAM: an out-of-memory error that names the card.

Why this exists: the modeled card's DRAM is bookkeeping (:mod:`~spyre_lab.device.memory`), but the values of
every spyre tensor live in this host's RAM, which can be much smaller than the card (a 23 GiB laptop
simulating 95 GiB of tensor DRAM). An op whose result fits the card can then fail in the host allocator
("DefaultCPUAllocator: can't allocate memory"), a message that names neither the card nor what to do.
:func:`host_out_of_memory` turns it into :class:`SpyreHostOutOfMemoryError`, a ``torch.OutOfMemoryError``
(what ``torch.cuda.OutOfMemoryError`` is), so ``except torch.OutOfMemoryError:`` catches it as it would on
CUDA; its message names the card, the sizes on both sides and the fix.
"""

from __future__ import annotations

import re

import torch

from spyre_lab.device.memory import DeviceOutOfMemoryError, format_bytes
from spyre_lab.runtime.errors import SpyreUsageError

_HOST_ALLOCATOR_FAILED = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes")


class SpyreHostOutOfMemoryError(SpyreUsageError, torch.OutOfMemoryError):
    """The host simulating a spyre card had no RAM left for an op's data, although the modeled card had room."""


def host_out_of_memory(op: torch._ops.OpOverload, args: tuple, kwargs: dict,
                       error: BaseException) -> SpyreHostOutOfMemoryError | None:
    """The error to raise instead of ``error`` (a failed host allocation inside a spyre op), or None if
    ``error`` is something else."""
    if isinstance(error, DeviceOutOfMemoryError):    # the modeled card is full: its own error says so already
        return None
    if isinstance(error, MemoryError):
        requested = None
    else:
        found = _HOST_ALLOCATOR_FAILED.search(str(error))
        if found is None:
            return None
        requested = int(found.group(1))
    index = _card_of(args, kwargs)
    free, total = torch.spyre.mem_get_info(index)
    asked = f"allocating {format_bytes(requested)} more" if requested is not None else "a host allocation"
    return SpyreHostOutOfMemoryError(
        f"spyre:{index} out of host memory in aten::{op.overloadpacket.__name__}: {asked} failed in the host "
        f"allocator, while the modeled card has {format_bytes(free)} free of {format_bytes(total)} (the card "
        "itself would hold this). The simulator keeps the values of every spyre tensor in this machine's RAM, "
        "and it is smaller than the card. Use smaller tensors (a smaller batch, shorter sequences), delete "
        "spyre tensors you no longer need, or run on a host with more RAM."
    )


def _card_of(args: tuple, kwargs: dict) -> int:
    """The card of the op's first spyre tensor (its ``device=`` for a factory, else the current card)."""
    from torch.utils._pytree import tree_leaves

    from spyre_lab.runtime.devices import device_index

    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "spyre":
            return leaf.device.index
    device = kwargs.get("device")
    return device_index(device if device is not None and torch.device(device).type == "spyre" else None)
