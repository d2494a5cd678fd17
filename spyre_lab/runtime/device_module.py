"""``torch.spyre``: the device module, shaped like ``torch.cuda`` where that makes sense.

Each modeled card ``spyre:i`` is a :class:`SpyreDevice`: its :class:`SpyreConfig`, its own DRAM
allocator (:class:`~spyre_lab.device.memory.DeviceMemory`) and the map from DRAM address to the
buffer living there (what a patched program resolves its operands through). The number of cards
comes from the ``SPYRE_LAB_DEVICES`` environment variable (default 1), read once at first use.

Memory numbers are real bookkeeping of the modeled DRAM (tensors only; loaded programs live in a
separate program segment); times are modeled (see ``streams``). ``empty_cache()`` is a device reset
here (the model keeps no cache to empty): tensors still on the card become invalid and say so.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

import torch

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.runtime.streams import (
    TIMELINE,
    Event,
    Stream,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize,
)

if TYPE_CHECKING:
    from spyre_lab.device.memory import Allocation, DeviceMemory

__all__ = [
    "Event", "Stream", "current_device", "current_stream", "default_stream", "device_count", "empty_cache",
    "get_device_name", "get_device_properties", "get_rng_state", "is_available", "is_initialized", "manual_seed",
    "manual_seed_all", "max_memory_allocated", "memory_allocated", "memory_reserved", "memory_stats",
    "reset_peak_memory_stats", "set_device", "set_rng_state", "set_stream", "stream", "synchronize",
]

DEVICES_ENV = "SPYRE_LAB_DEVICES"
# estimate: DRAM kept for loaded programs (binaries and their correction areas), at the top of the
# usable range so tensor addresses and memory_allocated() count tensors only, as torch.cuda does.
PROGRAM_SEGMENT_BYTES = 1 << 30


class SpyreDevice:
    """One modeled card: config, DRAM allocator and the live buffers by address."""

    def __init__(self, index: int, config: SpyreConfig = SPYRE) -> None:
        from spyre_lab.device.memory import DeviceMemory

        self.index = index
        self.config = config
        tensor_bytes = config.dram_usable_bytes - PROGRAM_SEGMENT_BYTES
        self.memory: DeviceMemory = DeviceMemory(tensor_bytes, alignment=config.stick_bytes, name=f"spyre:{index}")
        self.program_memory: DeviceMemory = DeviceMemory(PROGRAM_SEGMENT_BYTES, alignment=config.stick_bytes,
                                                         name=f"spyre:{index} program segment")
        self.program_base = tensor_bytes
        self._buffers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.generation = 0
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

    def register_buffer(self, address: int, buffer: Any) -> None:
        self._buffers[address] = buffer

    def buffer_at(self, address: int) -> Any:
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
        self._buffers.clear()
        self.memory.reset()
        self.program_memory.reset()
        self._reserve_null_stick()

    def __repr__(self) -> str:
        return f"SpyreDevice(spyre:{self.index}, {self.memory.allocated_bytes} B allocated)"


_DEVICES: list[SpyreDevice] = []
_CURRENT_INDEX = 0
_CONFIG: SpyreConfig = SPYRE


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


def get_device(index: int | None = None) -> SpyreDevice:
    """The :class:`SpyreDevice` for ``index`` (default: current device)."""
    devices = _devices()
    index = _CURRENT_INDEX if index is None else index
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


def _device_index(device: Any = None) -> int:
    """Normalise None / int / "spyre:1" / torch.device / Stream to a device index."""
    if device is None:
        return _CURRENT_INDEX
    if isinstance(device, Stream):
        return device.device_index
    if isinstance(device, int):
        index = device
    else:
        dev = torch.device(device)
        if dev.type != "spyre":
            raise ValueError(f"expected a spyre device, got {dev}")
        index = _CURRENT_INDEX if dev.index is None else dev.index
    get_device(index)
    return index


# --- the torch.cuda-like API -------------------------------------------------------------------
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return len(_devices())


def current_device() -> int:
    return _CURRENT_INDEX


def set_device(device: Any) -> None:
    global _CURRENT_INDEX
    _CURRENT_INDEX = _device_index(device)


def get_device_name(device: Any = None) -> str:
    dev = get_device(_device_index(device))
    return f"IBM Spyre (modeled, {dev.config.name})"


def get_device_properties(device: Any = None) -> SpyreConfig:
    """The hardware numbers of the card (its :class:`SpyreConfig`)."""
    return get_device(_device_index(device)).config


def memory_allocated(device: Any = None) -> int:
    """Bytes of modeled DRAM held by live tensors (stick-aligned, padded device format)."""
    dev = get_device(_device_index(device))
    return dev.memory.allocated_bytes - dev.reserved_bytes


def max_memory_allocated(device: Any = None) -> int:
    dev = get_device(_device_index(device))
    return max(0, dev.memory.peak_allocated_bytes - dev.reserved_bytes)


def memory_reserved(device: Any = None) -> int:
    """No caching allocator sits above DeviceMemory, so reserved equals allocated."""
    return memory_allocated(device)


def max_memory_reserved(device: Any = None) -> int:
    return max_memory_allocated(device)


def memory_stats(device: Any = None) -> dict[str, Any]:
    dev = get_device(_device_index(device))
    stats: dict[str, Any] = dict(dev.memory.stats())
    stats["program_segment.allocated_bytes"] = dev.program_memory.allocated_bytes
    stats["program_segment.num_programs"] = dev.program_memory.num_allocations
    return stats


def reset_peak_memory_stats(device: Any = None) -> None:
    get_device(_device_index(device)).memory.reset_peak()


def empty_cache(device: Any = None) -> None:
    """Reset the card: free all of its DRAM and drop compiled eager programs.

    Unlike ``torch.cuda.empty_cache`` (which only returns cached blocks), the modeled card keeps no
    cache: this is a device reset, so tensors still alive on it are invalid afterwards and any use
    raises an error that says so. Move what you need to keep to the CPU first.
    """
    index = _device_index(device)
    synchronize(index)
    get_device(index).reset()
    from spyre_lab.runtime import ops

    ops.clear_program_cache()


def manual_seed(seed: int) -> None:
    """Random ops run as CPU computations with the CPU generator; seed it (not via torch.manual_seed,
    which would call back into this module)."""
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    """The generator state random spyre ops draw from (the CPU generator, see manual_seed)."""
    return torch.default_generator.get_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    torch.default_generator.set_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for state in states[:1]:
        set_rng_state(state)


def modeled_time_us() -> float:
    """The host's modeled clock (microseconds since the runtime started or was reset)."""
    return TIMELINE.host_us


def _lazy_init() -> None:
    _devices()


def _is_compiled() -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def current_stream_id(device: Any = None) -> int:
    return current_stream(device).stream_id

