"""The modeled cards: one :class:`SpyreDevice` per ``spyre:i`` (config, DRAM allocator, live buffers by address).

The number of cards comes from the ``SPYRE_LAB_DEVICES`` environment variable (default 1), read once
at first use. Everything in the runtime that needs "which card, and what is on it" asks here; the
``torch.spyre`` API on top of it is :mod:`~spyre_lab.runtime.device_module`.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from spyre_lab.device.config import SPYRE, SpyreConfig

if TYPE_CHECKING:
    from spyre_lab.device.memory import Allocation, DeviceMemory

class LiveBuffer(Protocol):
    """What the card keeps per live allocation (a :class:`~spyre_lab.runtime.tensor.DeviceBuffer`, which this
    module does not import): enough for a patched kernel to check what it found at an address."""

    host_dtype: torch.dtype

    def check_valid(self) -> None: ...


DeviceLike = int | str | torch.device | None
"""What names a card: an index, ``"spyre:1"``, a ``torch.device``, or None for the current one."""

DEVICES_ENV = "SPYRE_LAB_DEVICES"
# estimate: DRAM kept for loaded programs (binaries and their correction areas), at the top of the
# usable range so tensor addresses and memory_allocated() count tensors only, as torch.cuda does.
PROGRAM_SEGMENT_BYTES = 1 << 30
# the compiler's segment 0 of its address map (7 x 16 GiB): the intermediates pool, where every compiled program
# keeps the buffers only it sees, planned by live range (spyre_lab.runtime.intermediates). Kept below the program
# segment, so tensor addresses start at the bottom of DRAM.
INTERMEDIATES_SEGMENT_BYTES = 16 << 30


class SpyreDevice:
    """One modeled card: config, DRAM allocator and the live buffers by address."""

    def __init__(self, index: int, config: SpyreConfig = SPYRE) -> None:
        from spyre_lab.device.memory import DeviceMemory

        self.index = index
        self.config = config
        tensor_bytes = config.dram_usable_bytes - PROGRAM_SEGMENT_BYTES - INTERMEDIATES_SEGMENT_BYTES
        self.memory: DeviceMemory = DeviceMemory(tensor_bytes, alignment=config.stick_bytes, name=f"spyre:{index}")
        self.program_memory: DeviceMemory = DeviceMemory(PROGRAM_SEGMENT_BYTES, alignment=config.stick_bytes,
                                                         name=f"spyre:{index} program segment")
        self.intermediates_base = tensor_bytes
        self.intermediates_bytes = INTERMEDIATES_SEGMENT_BYTES
        self.intermediates_peak_bytes = 0       # the largest plan of a program bound here (they share the segment)
        self.program_base = tensor_bytes + INTERMEDIATES_SEGMENT_BYTES
        # address -> live buffer; every buffer leaves through free() (its tensor's storage or slot dies)
        self._buffers: dict[int, LiveBuffer] = {}
        self.live_buffers = self._buffers      # the same dict, read by the launch hot path without a call
        self.generation = 0
        # what the card keeps for each launched program (its CorrectionArea), forgotten by a reset and with the
        # program: a cache that belongs to the card lives on it
        self.correction_areas: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        # per dtype, the 0-element tensor new spyre tensors of this card are cloned from (they hold no DRAM)
        self.seed_tensors: dict[torch.dtype, torch.Tensor] = {}
        self._reserve_null_stick()

    def _reserve_null_stick(self) -> None:
        # Address 0 would be a null data pointer to torch; keep the first stick unused, as hosts do.
        self.memory.allocate(self.config.stick_bytes, tag="reserved: null address")
        self.reserved_bytes = self.config.stick_bytes

    def allocate(self, nbytes: int, tag: str) -> Allocation:
        """A DRAM block; running out raises DeviceOutOfMemoryError with requested and free bytes."""
        return self.memory.allocate(nbytes, tag)

    def allocate_program_region(self, nbytes: int, tag: str) -> Allocation:
        """A block of the program segment; its ``address`` is relative to :attr:`program_base`."""
        return self.program_memory.allocate(nbytes, tag)

    def free_program_region(self, allocation: Allocation, generation: int) -> None:
        if generation == self.generation:
            self.program_memory.free(allocation)

    def register_buffer(self, address: int, buffer: LiveBuffer) -> None:
        self._buffers[address] = buffer

    def claim(self, buffers: dict[int, LiveBuffer]) -> None:
        """Make ``buffers`` (address -> buffer) the ones found at those addresses: a kernel about to run claims
        the places in the intermediates segment it was planned to use, which other kernels used before it."""
        self._buffers.update(buffers)

    def buffer_at(self, address: int) -> LiveBuffer:
        """The live buffer whose allocation starts at ``address`` (how patched kernels find operands)."""
        try:
            return self._buffers[address]
        except KeyError:
            raise RuntimeError(
                f"spyre:{self.index}: no live buffer at DRAM address {address:#x}; a program was patched "
                "with a stale address (was the tensor freed or the device reset?)"
            ) from None

    def free(self, allocation: Allocation, generation: int) -> None:
        if generation == self.generation:
            self._buffers.pop(allocation.address, None)
            self.memory.free(allocation)

    def reset(self) -> None:
        """Free all DRAM; buffers of the old generation become invalid and say so when used."""
        self.generation += 1
        self.intermediates_peak_bytes = 0
        self._buffers.clear()
        self.correction_areas.clear()
        self.memory.reset()
        self.program_memory.reset()
        self._reserve_null_stick()
        for hook in _RESET_HOOKS:
            hook()

    def __repr__(self) -> str:
        return f"SpyreDevice(spyre:{self.index}, {self.memory.allocated_bytes} B allocated)"


_RESET_HOOKS: list[Callable[[], None]] = []


def on_reset(hook: Callable[[], None]) -> None:
    """Call ``hook`` after any card is reset (``torch.spyre.empty_cache()``): caches of what was loaded
    on the card (the eager program cache) register here, so the card never has to know them."""
    if hook not in _RESET_HOOKS:
        _RESET_HOOKS.append(hook)


_DEVICES: list[SpyreDevice] = []
_CONFIG: SpyreConfig = SPYRE


class _Current(threading.local):
    """The current card, per thread as CUDA's current device is (a worker thread starts on spyre:0)."""

    index = 0


_CURRENT = _Current()


def _count_from_env() -> int:
    raw = os.environ.get(DEVICES_ENV, "1")
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"{DEVICES_ENV}={raw!r} is not an integer; set it to the number of modeled cards") from None
    if not 1 <= count <= 64:
        raise ValueError(f"{DEVICES_ENV}={count} is out of range; use 1..64 modeled cards")
    return count


def _devices() -> list[SpyreDevice]:
    if not _DEVICES:
        _DEVICES.extend(SpyreDevice(i, _CONFIG) for i in range(_count_from_env()))
    return _DEVICES


def device_count() -> int:
    return len(_devices())


def get_device(index: int | None = None) -> SpyreDevice:
    """The :class:`SpyreDevice` for ``index`` (default: current device)."""
    devices = _DEVICES or _devices()
    index = _CURRENT.index if index is None else index
    if not 0 <= index < len(devices):
        raise RuntimeError(
            f"spyre:{index} does not exist: {len(devices)} modeled device(s) (spyre:0..spyre:{len(devices) - 1}). "
            f"Set {DEVICES_ENV} before first use to model more cards."
        )
    return devices[index]


def configure(config: SpyreConfig | None = None) -> None:
    """Use ``config`` for every card. Only before the first device tensor exists (it sizes DRAM)."""
    global _CONFIG
    if any(d.memory.num_allocations for d in _DEVICES):
        raise RuntimeError("spyre_lab.runtime.configure() must run before any spyre tensor is allocated")
    _CONFIG = SPYRE if config is None else config
    _DEVICES.clear()


def device_index(device: DeviceLike = None) -> int:
    """Normalise None / int / "spyre:1" / torch.device to the index of an existing card."""
    if device is None:
        return _CURRENT.index
    if type(device) is int and 0 <= device < len(_DEVICES):   # the launch path's question: an existing card
        return device
    if isinstance(device, int):
        index = device
    else:
        dev = torch.device(device)
        if dev.type != "spyre":
            raise ValueError(f"expected a spyre device, got {dev}")
        index = _CURRENT.index if dev.index is None else dev.index
    get_device(index)
    return index


def current_device() -> int:
    """The current card of this thread: what an index-less ``"spyre"`` means."""
    return _CURRENT.index


def set_device(device: int | str | torch.device) -> None:
    """Make ``device`` this thread's current card, for every way torch can be told ``"spyre"`` without an index
    (factories, ``.to("spyre")``, ``torch.tensor(..., device="spyre")``: see :mod:`~spyre_lab.runtime.current_card`)."""
    index = device_index(device)
    if index != _CURRENT.index:
        from spyre_lab.runtime.current_card import follow

        follow(index)
        _CURRENT.index = index


INDEX_OF: dict[torch.device, int | None] = {}


def spyre_index(device: torch.device) -> int | None:
    """The card index of ``device`` if it is a spyre device (the current card for plain ``"spyre"``), else None.
    Asked of every operand of every launch, so answered from a table: ``torch.device.type`` builds a new string
    at each call."""
    try:
        return INDEX_OF[device]
    except KeyError:
        if device.type != "spyre":
            INDEX_OF[device] = None
            return None
        if device.index is None:
            return _CURRENT.index
        index = INDEX_OF[device] = device.index
        return index
