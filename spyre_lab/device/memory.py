"""Device memory: the card's DRAM allocator and each core's LX scratchpad allocator.

Both are the same machine: a range of addresses handed out in stick-aligned blocks (128 B, the
unit of every DRAM <-> LX transfer) by *first fit*, i.e. the lowest-address free block that is big
enough, with a freed block merged into free neighbours so free space does not splinter. What
differs is the vocabulary: DRAM returns :class:`Allocation` records and runs out with
:class:`DeviceOutOfMemoryError`; LX hands out plain offsets and overflows with the compiler's
:class:`~spyre_lab.device.isa.LXOverflowError`.

The free blocks live in :class:`~spyre_lab.device.free_list.FreeList` (an address-ordered treap
whose first fit is one walk from the root).
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import torch

from spyre_lab.device.config import SPYRE, GiB, KiB, MiB, SpyreConfig
from spyre_lab.device.free_list import FreeList
from spyre_lab.device.isa import LXOverflowError


def format_bytes(nbytes: int) -> str:
    """``1610612736`` -> ``"1.50 GiB"``; small numbers stay in bytes."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


class Allocation(NamedTuple):
    """One live block: ``size`` is ``nbytes`` rounded up to whole alignment units (at least one). (A named tuple,
    not a frozen dataclass: every eager op's result makes one, and a tuple is made without four ``__setattr__``.)"""

    address: int
    nbytes: int
    size: int
    tag: str = ""

    @property
    def end(self) -> int:
        return self.address + self.size


class DeviceOutOfMemoryError(torch.OutOfMemoryError, MemoryError):
    """The card's DRAM has no free block large enough for a request.

    A ``torch.OutOfMemoryError`` (a RuntimeError), so ``except torch.OutOfMemoryError`` catches a full card as it
    catches a full CUDA device."""

    def __init__(self, device: str, requested: int, free: int, largest_free_block: int, capacity: int,
                 tag: str = "") -> None:
        self.device, self.requested, self.free = device, requested, free
        self.largest_free_block, self.capacity, self.tag = largest_free_block, capacity, tag
        what = f" for {tag!r}" if tag else ""
        fragmented = (" The free space is fragmented: no single block is large enough."
                      if free >= requested else "")
        super().__init__(
            f"{device} out of memory: tried to allocate {format_bytes(requested)}{what} with "
            f"{format_bytes(free)} free of {format_bytes(capacity)} (largest free block "
            f"{format_bytes(largest_free_block)}).{fragmented} Free device tensors you no longer need "
            "(del them, then empty the cache), or use a smaller batch or shorter sequences."
        )


# --- allocators ---------------------------------------------------------------------------------
class _FirstFitArena:
    """Bookkeeping shared by both allocators: alignment, live blocks, counters and peaks."""

    def __init__(self, capacity: int, alignment: int, name: str) -> None:
        if not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"{name}: capacity must be a positive number of bytes, got {capacity!r}")
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"{name}: alignment must be a positive power of two (a stick is 128 B), got {alignment!r}")
        if capacity < alignment:
            raise ValueError(f"{name}: capacity {capacity} B is smaller than one {alignment} B block")
        self.capacity, self.alignment, self.name = capacity, alignment, name
        self.usable_bytes = capacity - capacity % alignment  # whole aligned blocks only
        self.peak_allocated_bytes = self.peak_requested_bytes = self.peak_num_allocations = 0
        self.total_allocations = self.total_frees = self.total_allocated_bytes = self.total_freed_bytes = 0
        self.num_failures = 0
        self.reset()

    @property
    def label(self) -> str:
        """How messages name this memory."""
        return self.name

    def reset(self) -> None:
        """Free everything at once (an empty-cache flow); peaks and totals are kept."""
        self._free = FreeList(0, self.usable_bytes)
        self._live: dict[int, Allocation] = {}
        self.allocated_bytes = self.requested_bytes = 0

    def reset_peak(self) -> None:
        """Start peak tracking again from what is allocated now."""
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_requested_bytes = self.requested_bytes
        self.peak_num_allocations = len(self._live)

    @property
    def free_bytes(self) -> int:
        return self._free.free_bytes

    @property
    def largest_free_block(self) -> int:
        return self._free.largest_block

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free_block / free_bytes``: 0 when free space is one block (or there is none)."""
        free = self.free_bytes
        return 1 - self.largest_free_block / free if free else 0.0

    @property
    def num_allocations(self) -> int:
        return len(self._live)

    def allocations(self) -> list[Allocation]:
        """Live allocations, lowest address first."""
        return [self._live[a] for a in sorted(self._live)]

    def free_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every free block, lowest address first."""
        return self._free.blocks()

    def _take(self, nbytes: int, tag: str) -> Allocation:
        if type(nbytes) is not int:
            try:
                nbytes = operator.index(nbytes)  # ints and numpy ints; never floats
            except TypeError:
                raise TypeError(f"{self.label}: nbytes must be an int, got {type(nbytes).__name__} "
                                f"{nbytes!r}") from None
        if nbytes < 0:
            raise ValueError(f"{self.label}: cannot allocate a negative number of bytes ({nbytes})")
        alignment = self.alignment
        size = (-(-nbytes // alignment) or 1) * alignment  # a zero-byte request still gets a block
        address = self._free.take_first_fit(size)
        if address is None:
            self.num_failures += 1
            raise self._no_room(nbytes, size, tag)
        allocation = Allocation(address, nbytes, size, tag)
        live = self._live
        live[address] = allocation
        allocated = self.allocated_bytes = self.allocated_bytes + size
        requested = self.requested_bytes = self.requested_bytes + nbytes
        self.total_allocations += 1
        self.total_allocated_bytes += size
        if allocated > self.peak_allocated_bytes:
            self.peak_allocated_bytes = allocated
        if requested > self.peak_requested_bytes:
            self.peak_requested_bytes = requested
        if len(live) > self.peak_num_allocations:
            self.peak_num_allocations = len(live)
        return allocation

    def _release(self, handle: Allocation | int) -> Allocation:
        address = handle.address if type(handle) is Allocation else handle
        allocation = self._live.get(address)
        if allocation is None or (type(handle) is Allocation and allocation is not handle):
            raise ValueError(self._explain_bad_free(handle, address, allocation))
        del self._live[address]
        size = allocation.size
        self._free.give_back(address, size)
        self.allocated_bytes -= size
        self.requested_bytes -= allocation.nbytes
        self.total_frees += 1
        self.total_freed_bytes += size
        return allocation

    def _explain_bad_free(self, handle: Allocation | int, address: Any, current: Allocation | None) -> str:
        if not isinstance(address, int):
            return f"{self.label}: free() takes an Allocation or an int address, got {type(handle).__name__}"
        if current is not None:  # a stale Allocation whose address has been handed out again
            return (f"{self.label}: this allocation at {address:#x} was already freed (double free); the address "
                    f"now belongs to a newer allocation tagged {current.tag!r}")
        inside = next((a for a in self._live.values() if a.address < address < a.end), None)
        if inside is not None:
            return (f"{self.label}: {address:#x} lies inside the allocation at {inside.address:#x} "
                    f"(tag {inside.tag!r}); free it by its start address")
        return (f"{self.label}: no live allocation at {address:#x}: it was already freed (double free) "
                "or never allocated here")

    def _no_room(self, nbytes: int, size: int, tag: str) -> Exception:
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.label!r}: {format_bytes(self.allocated_bytes)} of "
                f"{format_bytes(self.capacity)} allocated in {self.num_allocations} blocks, "
                f"peak {format_bytes(self.peak_allocated_bytes)}, fragmentation {self.fragmentation:.0%})")


class DeviceMemory(_FirstFitArena):
    """The card's DRAM (LPDDR5) allocator: stick-aligned first fit over ``capacity`` bytes."""

    def __init__(self, capacity: int, alignment: int = 128, name: str = "spyre:0") -> None:
        super().__init__(capacity, alignment, name)

    @classmethod
    def for_config(cls, config: SpyreConfig = SPYRE, name: str = "spyre:0") -> DeviceMemory:
        """DRAM of a modeled card: its usable bytes (112 GiB for Spyre), aligned to its stick."""
        return cls(config.dram_usable_bytes, config.stick_bytes, name)

    def allocate(self, nbytes: int, tag: str = "") -> Allocation:
        """A block of at least ``nbytes`` at the lowest address that fits; raises DeviceOutOfMemoryError."""
        return self._take(nbytes, tag)

    def free(self, allocation: Allocation | int) -> None:
        """Return a block, by the :class:`Allocation` that :meth:`allocate` gave or by its address."""
        self._release(allocation)

    def _no_room(self, nbytes: int, size: int, tag: str) -> Exception:
        return DeviceOutOfMemoryError(self.name, nbytes, self.free_bytes, self.largest_free_block, self.capacity, tag)

    def stats(self) -> dict[str, int | float]:
        """Counters named like ``torch.cuda.memory_stats()`` (``allocated_bytes.all.current``, ...)."""
        return {
            "allocated_bytes.all.current": self.allocated_bytes,
            "allocated_bytes.all.peak": self.peak_allocated_bytes,
            "allocated_bytes.all.allocated": self.total_allocated_bytes,
            "allocated_bytes.all.freed": self.total_freed_bytes,
            "requested_bytes.all.current": self.requested_bytes,
            "requested_bytes.all.peak": self.peak_requested_bytes,
            "allocation.all.current": self.num_allocations,
            "allocation.all.peak": self.peak_num_allocations,
            "allocation.all.allocated": self.total_allocations,
            "allocation.all.freed": self.total_frees,
            "num_ooms": self.num_failures,
            "capacity_bytes": self.capacity,
            "free_bytes": self.free_bytes,
            "largest_free_block": self.largest_free_block,
            "num_free_blocks": self._free.num_blocks,
            "fragmentation": self.fragmentation,
        }


class Scratchpad(_FirstFitArena):
    """One core's LX scratchpad: explicit byte offsets, stick-aligned first fit.

    ``capacity`` is what the planner may use (``SpyreConfig.lx_budget_bytes``, 1,677,721 B by
    default); only whole sticks of it are handed out.
    """

    def __init__(self, capacity: int, core: int = 0, name: str = "LX", alignment: int = 128) -> None:
        super().__init__(capacity, alignment, name)
        self.core = core

    @property
    def label(self) -> str:
        return f"{self.name} of core {self.core}"

    @classmethod
    def for_config(cls, config: SpyreConfig = SPYRE, core: int = 0) -> Scratchpad:
        return cls(config.lx_budget_bytes, core, alignment=config.stick_bytes)

    @property
    def in_use(self) -> int:
        return self.allocated_bytes

    @property
    def peak(self) -> int:
        return self.peak_allocated_bytes

    def allocate(self, nbytes: int, tag: str = "") -> int:
        """LX offset of a block of at least ``nbytes``; raises LXOverflowError (``tag`` names the kernel)."""
        return self._take(nbytes, tag).address

    def free(self, offset: int) -> None:
        self._release(offset)

    def _no_room(self, nbytes: int, size: int, tag: str) -> Exception:
        error = LXOverflowError(tag, self.core, nbytes, self.in_use, self.capacity)
        if self.in_use + size <= self.usable_bytes:
            error.add_note(f"{format_bytes(self.free_bytes)} of LX is free but fragmented: the largest free block is "
                           f"{format_bytes(self.largest_free_block)}")
        return error
