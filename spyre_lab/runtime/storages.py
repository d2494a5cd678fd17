"""Spyre storages: what ``torch.UntypedStorage`` can do with one, and a clear error for what it cannot.

Why this exists: torch's storage methods make new storages with the backend's C++ allocator
(``UntypedStorage(n, device=...)``, ``storage.clone()``, ``storage.new()``, ``copy.deepcopy`` of a tensor
or a storage), and a Python backend cannot register one in torch 2.13: the interpreter would crash with a
segfault. A spyre storage is made by the runtime for a tensor (its Python object carries the tensor's
:class:`~spyre_lab.runtime.tensor.DeviceBuffer`), so:

* ``storage.clone()`` (and with it ``copy.deepcopy`` of a storage, of a tensor, of a tensor subclass, and of
  a container of views, which keep sharing one storage as on the CPU) copies the buffer on the card: a
  one-op ``clone`` launch, on the trace like any device copy;
* ``torch.UntypedStorage(..., device="spyre")`` (and ``TypedStorage``, ``storage.new()``,
  ``_new_shared``) and ``storage.resize_()`` are refused with an error naming the tensor-level way: the card
  keeps each tensor stickified for its dtype, which a raw byte storage does not carry;
* pickling a spyre storage (``pickle.dumps`` of a spyre tensor) and writing one in torch's legacy checkpoint
  format are refused with the advice ``torch.save`` gives: pickle or save a CPU copy.

Byte-level access (``untyped_storage().fill_/tolist/cpu``) is refused where it starts, in ``set_`` of a
uint8 tensor onto the storage (:func:`~spyre_lab.runtime.tensor.refuse_reinterpretation`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

BACKEND = "spyre"


def _usage_error(message: str) -> Exception:
    from spyre_lab.runtime.errors import SpyreUsageError

    return SpyreUsageError(message)


def _is_spyre(storage: Any) -> bool:
    untyped = getattr(storage, "_untyped_storage", storage)   # a TypedStorage's own .device warns it is deprecated
    return untyped.device.type == BACKEND


def _own_buffer(storage: Any, what: str) -> Any:
    """The DeviceBuffer a spyre storage was made with (refusing a slice of one, or a storage from elsewhere)."""
    buffer = getattr(storage, "spyre_buffer", None)
    if buffer is None:
        raise _usage_error(
            f"{what}: this spyre storage has no device buffer of its own (a slice of a storage, or one not made by "
            "the spyre runtime); work on the tensor instead: t.clone()"
        )
    buffer.check_valid()
    return buffer


def clone_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new spyre storage with ``storage``'s contents, copied on the card (one ``clone`` launch)."""
    from spyre_lab.runtime.tensor import tensor_over

    buffer = _own_buffer(storage, "storage.clone()")
    with torch.no_grad():
        copied = tensor_over(storage, (buffer.numel,), (1,)).clone()
    return copied.untyped_storage()


def _cloning(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def clone(self: Any) -> Any:
        if not _is_spyre(self):
            return original(self)
        return clone_storage(self)

    clone.__spyre_routed__ = original  # type: ignore[attr-defined]
    return clone


def _refusing_new(original: Callable[..., Any]) -> Any:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == BACKEND:
            raise _usage_error(
                f"torch.UntypedStorage(..., device={str(torch.device(device))!r}) cannot make a raw storage on the "
                "card: spyre keeps each tensor stickified for its shape and dtype, which a storage of bytes does not "
                "carry. "
                "Make a tensor and take its storage: torch.empty(n, dtype=torch.float16, device='spyre')"
                ".untyped_storage()"
            )
        return original(cls, *args, **kwargs)

    __new__.__spyre_routed__ = original  # type: ignore[attr-defined]
    return staticmethod(__new__)


def _new_storage(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def new(self: Any) -> Any:
        """An empty storage on the same card, for the same dtype (what ``storage.new()`` gives on the CPU)."""
        if not _is_spyre(self):
            return original(self)
        from spyre_lab.runtime.tensor import empty_spyre

        buffer = _own_buffer(self, "storage.new()")
        return empty_spyre((0,), None, buffer.host_dtype, buffer.device.index).untyped_storage()

    new.__spyre_routed__ = original  # type: ignore[attr-defined]
    return new


def _refusing_resize(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def resize_(self: Any, size: int) -> Any:
        if not _is_spyre(self):
            return original(self, size)
        raise _usage_error(
            "a spyre storage cannot be resized in place (its DRAM block is laid out for its tensor's shape and "
            "dtype); resize the tensor instead, t.resize_(n), which moves it to a larger block and keeps its values"
        )

    resize_.__spyre_routed__ = original  # type: ignore[attr-defined]
    return resize_


def _refusing_write_file(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _write_file(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_spyre(self):
            return original(self, *args, **kwargs)
        raise _usage_error(
            "torch.save cannot write a spyre storage: the card keeps its data stickified in the device dtype, not "
            "as the bytes a checkpoint holds. Save CPU copies: torch.save(t.cpu(), f), "
            "torch.save(model.cpu().state_dict(), f)"
        )

    _write_file.__spyre_routed__ = original  # type: ignore[attr-defined]
    return _write_file


def _refusing_reduce(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __reduce__(self: Any) -> Any:
        if not _is_spyre(self):
            return original(self)
        raise _usage_error(
            "pickle cannot serialize a spyre tensor or storage: the card keeps its data stickified in the device "
            "dtype, not as the bytes pickle writes. Pickle a CPU copy and move it back after loading: "
            "pickle.dumps(t.cpu()); pickle.loads(data).to('spyre')"
        )

    __reduce__.__spyre_routed__ = original  # type: ignore[attr-defined]
    return __reduce__


def install() -> None:
    """Route the storage methods above (idempotent; runs inside ``import torch``, so it imports nothing heavy)."""
    import torch.storage as storage

    untyped = storage.UntypedStorage
    for cls in (storage._StorageBase, untyped):
        if "clone" in vars(cls) and not hasattr(vars(cls)["clone"], "__spyre_routed__"):
            cls.clone = _cloning(vars(cls)["clone"])
    if not hasattr(untyped.__new__, "__spyre_routed__"):
        untyped.__new__ = _refusing_new(untyped.__new__)
    if not hasattr(untyped.new, "__spyre_routed__"):
        untyped.new = _new_storage(untyped.new)
    if not hasattr(untyped.resize_, "__spyre_routed__"):
        untyped.resize_ = _refusing_resize(untyped.resize_)
    if not hasattr(untyped._write_file, "__spyre_routed__"):
        untyped._write_file = _refusing_write_file(untyped._write_file)
    for cls in (storage._StorageBase, storage.TypedStorage):
        if not hasattr(cls.__reduce__, "__spyre_routed__"):
            cls.__reduce__ = _refusing_reduce(cls.__reduce__)
