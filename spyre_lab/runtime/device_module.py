"""``torch.spyre``: the device module, shaped like ``torch.cuda`` where that makes sense.

The cards themselves live in :mod:`spyre_lab.runtime.devices`, streams, events and the modeled clock in
:mod:`~spyre_lab.runtime.stream`, :mod:`~spyre_lab.runtime.event` and :mod:`~spyre_lab.runtime.timeline`; this
module is the ``torch.cuda``-shaped face over them.

Memory numbers are real bookkeeping of the modeled DRAM (tensors only; loaded programs live in a
separate program segment); times are modeled (see ``timeline``). ``empty_cache()`` releases what the
runtime keeps cached (one-op programs), never a live tensor, as ``torch.cuda.empty_cache`` does;
``reset_device()`` is the hard reset that frees everything on the card.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spyre_lab.device.config import SpyreConfig
from spyre_lab.runtime import devices
from spyre_lab.runtime.devices import (  # noqa: F401  (re-exported: torch.spyre.get_device, ...)
    DEVICES_ENV,
    PROGRAM_SEGMENT_BYTES,
    DeviceLike,
    SpyreDevice,
    configure,
    get_device,
)
from spyre_lab.runtime.event import Event
from spyre_lab.runtime.stream import Stream, current_stream, default_stream, set_stream, stream, synchronize
from spyre_lab.runtime.timeline import TIMELINE

__all__ = [
    "Event",
    "SpyreDeviceProperties",
    "Stream",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_device",
    "reset_peak_memory_stats",
    "set_device",
    "set_rng_state",
    "set_stream",
    "stream",
    "synchronize",
]

DeviceArg = DeviceLike | Stream
"""What the ``torch.spyre`` functions accept as a card: an index, ``"spyre:1"``, a ``torch.device``, a Stream
(its card), or None (the current card)."""


def _device_index(device: DeviceArg = None) -> int:
    """Normalise None / int / "spyre:1" / torch.device / Stream to a device index."""
    return device.device_index if isinstance(device, Stream) else devices.device_index(device)


# --- the torch.cuda-like API -------------------------------------------------------------------
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return devices.device_count()


def current_device() -> int:
    return devices.current_device()


def set_device(device: DeviceArg) -> None:
    devices.set_device(_device_index(device))


def _set_device_index(device: DeviceArg) -> None:
    """What ``torch.accelerator.set_device_index`` does on spyre: a negative index is a no-op, as torch documents."""
    if isinstance(device, int) and device < 0:
        return
    set_device(device)


class device:  # lower case, like torch.cuda.device
    """``with torch.spyre.device(1):`` makes ``spyre:1`` the current card inside the block."""

    def __init__(self, device: DeviceArg) -> None:
        self.index = -1 if device is None else _device_index(device)
        self.previous = -1

    def __enter__(self) -> None:
        self.previous = devices.current_device()
        if self.index >= 0:
            devices.set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        devices.set_device(self.previous)


def get_device_name(device: DeviceArg = None) -> str:
    dev = get_device(_device_index(device))
    return f"IBM Spyre (modeled, {dev.config.name})"


@dataclass(frozen=True)
class SpyreDeviceProperties:
    """What ``torch.cuda.get_device_properties`` answers, for a modeled card; ``config`` has every number."""

    name: str
    total_memory: int                 # bytes tensors can use: usable DRAM minus the two runtime segments
    multi_processor_count: int        # the card's cores
    config: SpyreConfig
    type: str = "spyre"


def get_device_properties(device: DeviceArg = None) -> SpyreDeviceProperties:
    """Name, ``total_memory`` and core count of the card, plus its :class:`SpyreConfig` as ``.config``."""
    dev = get_device(_device_index(device))
    return SpyreDeviceProperties(name=get_device_name(dev.index), total_memory=dev.memory.capacity,
                                 multi_processor_count=dev.config.cores, config=dev.config)


def memory_allocated(device: DeviceArg = None) -> int:
    """Bytes of modeled DRAM held by live tensors (stick-aligned, padded device format)."""
    dev = get_device(_device_index(device))
    return dev.memory.allocated_bytes - dev.reserved_bytes


def max_memory_allocated(device: DeviceArg = None) -> int:
    dev = get_device(_device_index(device))
    return max(0, dev.memory.peak_allocated_bytes - dev.reserved_bytes)


def memory_reserved(device: DeviceArg = None) -> int:
    """No caching allocator sits above DeviceMemory, so reserved equals allocated."""
    return memory_allocated(device)


def max_memory_reserved(device: DeviceArg = None) -> int:
    return max_memory_allocated(device)


def mem_get_info(device: DeviceArg = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the card's tensor DRAM, like ``torch.cuda.mem_get_info``."""
    memory = get_device(_device_index(device)).memory
    return memory.free_bytes, memory.capacity


def memory_stats(device: DeviceArg = None) -> dict[str, Any]:
    """Counters named like ``torch.cuda.memory_stats()``; reserved equals allocated (no caching allocator)."""
    dev = get_device(_device_index(device))
    stats: dict[str, Any] = dict(dev.memory.stats())
    stats["reserved_bytes.all.current"] = stats["allocated_bytes.all.current"]
    stats["reserved_bytes.all.peak"] = stats["allocated_bytes.all.peak"]
    stats["program_segment.allocated_bytes"] = dev.program_memory.allocated_bytes
    stats["program_segment.num_programs"] = dev.program_memory.num_allocations
    return dict(sorted(stats.items()))


def memory_summary(device: DeviceArg = None, abbreviated: bool = False) -> str:
    """A readable table of the card's memory, in the spirit of ``torch.cuda.memory_summary``."""
    dev = get_device(_device_index(device))
    mem, stats = dev.memory, memory_stats(dev.index)

    def size(n: float) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            n /= 1024
        return f"{n:.2f} GiB"

    rows = [
        ("tensors allocated (now)", size(memory_allocated(dev.index))),
        ("tensors allocated (peak)", size(max_memory_allocated(dev.index))),
        ("live tensor blocks", f"{stats['allocation.all.current']}"),
        ("free", size(mem.free_bytes)),
        ("largest free block", size(mem.largest_free_block)),
        ("fragmentation", f"{mem.fragmentation:.1%}"),
        ("total (tensor DRAM)", size(mem.capacity)),
        ("program segment in use", size(dev.program_memory.allocated_bytes)),
        ("intermediates (largest plan)", f"{size(dev.intermediates_peak_bytes)} of {size(dev.intermediates_bytes)}"),
        ("out-of-memory errors", f"{stats['num_ooms']}"),
    ]
    if abbreviated:
        rows = rows[:2] + rows[3:4]
    width = max(len(k) for k, _ in rows)
    lines = [f"spyre:{dev.index} memory summary ({dev.config.name}; modeled DRAM, reserved = allocated)"]
    lines += [f"  {k:<{width}}  {v:>12}" for k, v in rows]
    return "\n".join(lines)


def reset_peak_memory_stats(device: DeviceArg = None) -> None:
    get_device(_device_index(device)).memory.reset_peak()


def reset_accumulated_memory_stats(device: DeviceArg = None) -> None:
    """The allocator's running totals are part of its bookkeeping; only the peaks reset here."""
    reset_peak_memory_stats(device)


def empty_cache(device: DeviceArg = None) -> None:
    """Release what the runtime keeps cached: the compiled one-op programs and their program-segment
    memory. Live tensors are untouched, as with ``torch.cuda.empty_cache`` (the modeled DRAM has no
    caching allocator, so tensor memory is returned the moment a tensor dies). To wipe the card,
    use :func:`reset_device`."""
    _device_index(device)
    from spyre_lab.runtime import eager_programs

    eager_programs.clear_program_cache()


def reset_device(device: DeviceArg = None) -> None:
    """Reset the card: free all of its DRAM and drop compiled one-op programs.

    Tensors still alive on it are invalid afterwards, and any use raises an error that says so.
    Move what you need to keep to the CPU first.
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


def get_rng_state(device: DeviceArg = None) -> torch.Tensor:
    """The generator state random spyre ops draw from (the CPU generator, see manual_seed)."""
    return torch.default_generator.get_state()


def set_rng_state(state: torch.Tensor, device: DeviceArg = None) -> None:
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
    devices.device_count()


def _is_compiled() -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("spyre", dtype=...)`` accepts: fp16 only, the card's one float dtype."""
    from spyre_lab.runtime.autocast import AMP_DTYPES

    return list(AMP_DTYPES)


def current_stream_id(device: DeviceArg = None) -> int:
    return current_stream(device).stream_id
