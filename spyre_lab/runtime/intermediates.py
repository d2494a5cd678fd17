"""The intermediates pool: the card's segment where a compiled program keeps the buffers only it sees.

A compiled program's intermediates (a norm's fp32 sum of squares, a matmul's result the next kernel reads) are
seen by no one outside the program. So they are placed once, when the program is loaded on a card: each gets an
offset in the card's intermediates segment (segment 0 of the compiler's address map), *first fit by live range*,
so two intermediates whose lives do not overlap share the same bytes. Every launch then binds the same addresses:
no DRAM is allocated or freed per launch, and ``torch.spyre.memory_allocated()`` counts tensors only.

Every program plans from the start of the segment: programs run one after another on the card, so what one leaves
there is dead before the next one starts. Which buffer an address holds therefore changes from kernel to kernel:
each kernel *claims* its intermediates' addresses just before it runs (:attr:`IntermediatesPool.claims`), which is
where its patched prologue finds them (``SpyreDevice.buffer_at``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spyre_lab.device.layout import contiguous_strides
from spyre_lab.device.memory import DeviceOutOfMemoryError, FreeList, format_bytes
from spyre_lab.runtime.devices import get_device
from spyre_lab.runtime.tensor import DeviceBuffer, buffer_layout, storage_numel, torch_device


@dataclass(frozen=True)
class Placement:
    """Where one intermediate lives: its byte offset in the segment, its size (whole sticks), and the first and last
    kernel (by launch order) that touch it."""

    slot: str
    offset: int
    nbytes: int
    first: int
    last: int


def plan_live_ranges(sizes: dict[str, int], kernel_slots: Sequence[Sequence[str]], alignment: int,
                     capacity: int) -> list[Placement]:
    """Offsets for the intermediates ``sizes`` (slot -> bytes) of a program whose kernels touch ``kernel_slots``:
    in order of first use, each takes the lowest free range that fits, after the ranges of every intermediate last
    used by an earlier kernel were given back. Raises DeviceOutOfMemoryError past ``capacity``."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, slots in enumerate(kernel_slots):
        for slot in slots:
            if slot in sizes:
                first.setdefault(slot, k)
                last[slot] = k
    free = FreeList(0, capacity)
    live: list[Placement] = []
    placed: list[Placement] = []
    for slot in sorted(first, key=first.__getitem__):     # stable: declaration order within a kernel
        for ended in [p for p in live if p.last < first[slot]]:
            free.give_back(ended.offset, ended.nbytes)
            live.remove(ended)
        nbytes = max(1, -(-sizes[slot] // alignment)) * alignment
        offset = free.take_first_fit(nbytes)
        if offset is None:
            in_use = sum(p.nbytes for p in live)
            raise DeviceOutOfMemoryError("intermediates segment", nbytes, capacity - in_use, free.largest_block,
                                         capacity, tag=f"intermediate {slot}")
        placement = Placement(slot, offset, nbytes, first[slot], last[slot])
        live.append(placement)
        placed.append(placement)
    return placed


@dataclass(eq=False)
class IntermediatesPool:
    """A loaded program's intermediates on one card: where each one lives, the slot a launch binds for it, and per
    kernel the addresses that kernel claims before it runs."""

    placements: list[Placement]
    slots: dict[str, DeviceSlot]
    claims: list[dict[int, DeviceBuffer]]

    @property
    def peak_bytes(self) -> int:
        """The segment bytes the program uses at most (its live-range plan's high-water mark)."""
        return max((p.offset + p.nbytes for p in self.placements), default=0)

    @property
    def total_bytes(self) -> int:
        """What the intermediates would take, each in its own buffer (what live-range sharing saves from)."""
        return sum(p.nbytes for p in self.placements)

    def describe(self) -> str:
        """One line per intermediate: offset, size and the kernels it lives across."""
        lines = [f"intermediates: {len(self.placements)} buffers in {format_bytes(self.peak_bytes)} of the "
                 f"intermediates segment ({format_bytes(self.total_bytes)} without sharing)"]
        lines += [f"  {p.slot:<12} +{p.offset:#010x}  {format_bytes(p.nbytes):>10}  kernels {p.first}..{p.last}"
                  for p in self.placements]
        return "\n".join(lines)


def place_intermediates(private: Sequence[tuple[str, tuple[int, ...], torch.dtype, bool]],
                        kernel_slots: Sequence[Sequence[str]], device_index: int) -> IntermediatesPool:
    """The pool of a program whose kernels touch ``kernel_slots``, for its ``private`` intermediates (slot, shape,
    dtype, kept in its exact dtype), on card ``device_index``."""
    device = get_device(device_index)
    stick = device.config.stick_bytes
    specs = {slot: (shape, dtype, exact) for slot, shape, dtype, exact in private}
    sizes = {slot: buffer_layout(tuple(shape), dtype, stick, exact).device_nbytes
             for slot, (shape, dtype, exact) in specs.items()}
    placements = plan_live_ranges(sizes, kernel_slots, stick, device.intermediates_bytes)
    slots = {p.slot: DeviceSlot(specs[p.slot][0], specs[p.slot][1], device_index,
                                address=device.intermediates_base + p.offset, exact=specs[p.slot][2])
             for p in placements}
    claims = [{slots[s].buffer.address: slots[s].buffer for s in kernel if s in slots} for kernel in kernel_slots]
    pool = IntermediatesPool(placements, slots, claims)
    device.intermediates_peak_bytes = max(device.intermediates_peak_bytes, pool.peak_bytes)
    return pool


class DeviceSlot:
    """A DRAM buffer a compiled program keeps to itself (an intermediate between two of its kernels): placed in
    the card's intermediates segment when the program is loaded (:mod:`~spyre_lab.runtime.intermediates`), bound
    and patched like a tensor at every launch, but with no torch tensor around it, since nothing outside the
    program ever sees it.

    It answers what the launch path asks of a bound tensor: its card, dtype, size, stride and buffer."""

    __slots__ = ("_size", "_stride", "buffer", "device", "dtype", "spyre_buffer")

    def __init__(self, size: tuple[int, ...], dtype: torch.dtype, device_index: int, address: int,
                 exact: bool = False) -> None:
        self._size = torch.Size(size)
        self._stride = contiguous_strides(self._size)
        self.dtype = dtype
        self.device = torch_device(device_index)
        self.buffer = self.spyre_buffer = DeviceBuffer(get_device(device_index), storage_numel(size, self._stride),
                                                       dtype, self._size, exact=exact, placed_at=address)

    def size(self) -> torch.Size:
        return self._size

    @property
    def shape(self) -> torch.Size:
        return self._size

    def stride(self) -> tuple[int, ...]:
        return self._stride

    def storage_offset(self) -> int:
        return 0

    def numel(self) -> int:
        return self.buffer.numel

    def untyped_storage(self) -> DeviceSlot:
        return self                           # ``buffer_of`` finds ``spyre_buffer`` here, as on a storage
