"""``torch.spyre``: the device module, shaped like ``torch.cuda`` where that makes sense.

Each modeled card ``spyre:i`` is a :class:`~spyre_lab.runtime.devices.SpyreDevice`: its
:class:`SpyreConfig`, its own DRAM allocator (:class:`~spyre_lab.device.memory.DeviceMemory`) and the
map from DRAM address to the buffer living there (what a patched program resolves its operands
through). The number of cards comes from the ``SPYRE_LAB_DEVICES`` environment variable (default 1),
read once at first use.

Memory numbers are real bookkeeping of the modeled DRAM (tensors only; loaded programs live in a
separate program segment); times are modeled (see ``streams``). ``empty_cache()`` is a device reset
here (the model keeps no cache to empty): tensors still on the card become invalid and say so.
"""

from __future__ import annotations

from typing import Any

import torch

from spyre_lab.device.config import SpyreConfig
from spyre_lab.runtime import devices
from spyre_lab.runtime.devices import current_device, device_count, device_index, get_device
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

__all__ = [
    "Event", "Stream", "current_device", "current_stream", "default_stream", "device_count", "empty_cache",
    "get_device_name", "get_device_properties", "get_rng_state", "is_available", "is_initialized", "manual_seed",
    "manual_seed_all", "max_memory_allocated", "memory_allocated", "memory_reserved", "memory_stats",
    "reset_peak_memory_stats", "set_device", "set_rng_state", "set_stream", "stream", "synchronize",
]

def _device_index(device: Any = None) -> int:
    """Normalise None / int / "spyre:1" / torch.device / Stream to a device index."""
    return device.device_index if isinstance(device, Stream) else device_index(device)


# --- the torch.cuda-like API -------------------------------------------------------------------
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def set_device(device: Any) -> None:
    devices.set_device(_device_index(device))


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
    get_device(index).reset()          # the eager program cache is dropped by its reset hook


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
    device_count()


def _is_compiled() -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def current_stream_id(device: Any = None) -> int:
    return current_stream(device).stream_id

