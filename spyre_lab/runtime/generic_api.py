"""torch's device-generic entry points (``torch.accelerator``, ``torch.Generator``, ``torch.load``) answered for spyre.

Why: once spyre is registered it is the process's accelerator, and these entry points go straight to
C++ hooks a Python backend cannot fill in torch 2.13 (a ``DeviceAllocator``, a generator factory, a
storage allocator). Left alone they end in "INTERNAL ASSERT FAILED ... report a bug to PyTorch" or in
messages about ``PrivateUse1HooksInterface``, in plain code that never meant to touch the card.
Each is routed here to what ``torch.spyre`` knows, or to an error that says what to do instead:

* ``torch.accelerator`` memory functions and ``synchronize`` -> the same-named ``torch.spyre`` ones
  (``get_memory_info`` -> ``mem_get_info``); calls made while another accelerator is current go to
  torch unchanged.
* ``torch.Generator("spyre")`` -> a CPU generator: random ops on spyre tensors draw on the host
  (``torch.spyre.manual_seed`` seeds the same CPU generator), so a seeded CPU generator gives the
  same numbers as on the CPU. ``torch.Generator`` stays the class every generator is an instance of.
* ``torch.load(..., map_location="spyre")`` and ``storage.to("spyre")`` / ``storage.spyre()`` -> an
  error naming the alternative: the card keeps tensors stickified per shape and dtype, which a raw
  storage does not carry (torch would otherwise build a storage with the PrivateUse1 C++ allocator a
  Python backend cannot register, and the interpreter would crash).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

BACKEND = "spyre"
LOAD_PRIORITY = 15
"""Before torch's own PrivateUse1 deserializer (priority 23), which would try to allocate a raw storage."""

ACCELERATOR_ROUTES = {
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "get_memory_info": "mem_get_info",
    "empty_cache": "empty_cache",
    "synchronize": "synchronize",
    "current_device_index": "current_device",
    "set_device_index": "_set_device_index",
}
"""``torch.accelerator.<name>`` -> ``torch.spyre.<name>``. The current card is asked of ``torch.spyre`` too: torch's
C++ answer comes from the Python device guard, which in torch 2.13 always says index 0 and ignores a set."""


def _spyre_is_current() -> bool:
    current = torch.accelerator.current_accelerator()
    return current is not None and current.type == BACKEND


def _routed(original: Callable[..., Any], target: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def accelerator_function(*args: Any, **kwargs: Any) -> Any:
        if not _spyre_is_current():
            return original(*args, **kwargs)
        return getattr(torch.spyre, target)(*args, **kwargs)

    accelerator_function.__spyre_routed__ = original  # type: ignore[attr-defined]
    return accelerator_function


class _DeviceIndex(torch.accelerator.device_index):
    """``with torch.accelerator.device_index(i):`` switches ``torch.spyre``'s current card while spyre is the
    accelerator (torch's own exchanges the index through the device guard, which cannot hold one)."""

    def __enter__(self) -> None:
        self.spyre = self.idx is not None and _spyre_is_current()
        if not self.spyre:
            return super().__enter__()
        self.prev_idx = torch.spyre.current_device()
        torch.spyre.set_device(self.idx)
        return None

    def __exit__(self, *exc_info: object) -> None:
        if not getattr(self, "spyre", False):
            return super().__exit__(*exc_info)
        torch.spyre.set_device(self.prev_idx)
        return None


_DeviceIndex.__module__, _DeviceIndex.__qualname__ = "torch.accelerator", "device_index"


def route_accelerator() -> None:
    """Point the ``torch.accelerator`` functions listed in :data:`ACCELERATOR_ROUTES` at ``torch.spyre``, and its
    ``device_index`` context at the current card of ``torch.spyre``."""
    import torch.accelerator.memory as accelerator_memory

    for name, target in ACCELERATOR_ROUTES.items():
        for namespace in (torch.accelerator, accelerator_memory):
            original = getattr(namespace, name, None)
            if original is None or hasattr(original, "__spyre_routed__"):
                continue
            setattr(namespace, name, _routed(original, target))
    if not issubclass(torch.accelerator.device_index, _DeviceIndex):
        torch.accelerator.device_index = _DeviceIndex  # type: ignore[misc]


class _GeneratorType(type(torch._C.Generator)):  # type: ignore[misc]
    """Makes ``torch.Generator`` keep working as the class of every generator (``isinstance``) while its
    calls build torch's own generator objects, with ``device="spyre"`` meaning the host's generator."""

    def __call__(cls, device: Any = "cpu") -> torch._C.Generator:
        if device is not None and torch.device(device).type == BACKEND:
            device = "cpu"                      # random spyre ops draw on the host (see module docstring)
        return torch._C.Generator(device)

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_GeneratorType):
    __doc__ = torch._C.Generator.__doc__


Generator.__module__, Generator.__qualname__ = "torch", "Generator"


def route_generator() -> None:
    """``torch.Generator("spyre")`` returns a CPU generator instead of failing in torch's C++ hooks."""
    if torch.Generator is torch._C.Generator:
        torch.Generator = Generator  # type: ignore[misc]


def _load_tag(storage: Any) -> None:
    return None                          # saving spyre storages is refused earlier, with its own message


def _load_to_spyre(storage: Any, location: str) -> None:
    if location != BACKEND and not location.startswith(BACKEND + ":"):
        return None
    from spyre_lab.runtime.errors import SpyreUsageError

    raise SpyreUsageError(
        f"torch.load(..., map_location={location!r}) cannot put raw storages on the card: spyre keeps each tensor "
        "stickified for its shape and dtype, which a storage does not carry. Load to the CPU, then move: "
        "state = torch.load(f, map_location='cpu'); model.load_state_dict(state); model.to('spyre') "
        "(or t.to('spyre') for a tensor)."
    )


def _storage_error(what: str) -> Exception:
    from spyre_lab.runtime.errors import SpyreUsageError

    return SpyreUsageError(
        f"{what} cannot put a raw storage on the card: spyre keeps each tensor stickified for its shape and "
        "dtype, which a storage does not carry. Move tensors instead: t.to('spyre')"
    )


def _refusing_storage_to(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device", args[0] if args else None)
        if device is not None and torch.device(device).type == BACKEND:
            raise _storage_error(f"storage.to({str(device)!r})")
        return original(self, *args, **kwargs)

    to.__spyre_routed__ = original  # type: ignore[attr-defined]
    return to


def route_storage() -> None:
    """``storage.to("spyre")`` and ``storage.spyre()`` raise our error instead of crashing the interpreter."""
    import torch.storage as storage

    def spyre(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise _storage_error("storage.spyre()")

    for cls in (storage._StorageBase, storage.TypedStorage):
        if not hasattr(cls.to, "__spyre_routed__"):
            cls.to = _refusing_storage_to(cls.to)
    for cls in (storage.UntypedStorage, storage.TypedStorage):
        cls.spyre = spyre


def route_load() -> None:
    """Register the ``torch.load`` deserializer that explains ``map_location="spyre"``."""
    import torch.serialization as serialization

    if not any(entry[2] is _load_to_spyre for entry in serialization._package_registry):
        serialization.register_package(LOAD_PRIORITY, _load_tag, _load_to_spyre)


def install() -> None:
    """Every route (idempotent; runs inside ``import torch``, so it imports nothing heavy)."""
    route_accelerator()
    route_generator()
    route_load()
    route_storage()
