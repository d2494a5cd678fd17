"""Pinned host memory: a host concept, so a pinned tensor here is a CPU tensor the runtime remembers.

Why this exists: once the device is registered, torch treats spyre as *the* accelerator and asks it
for a pinned-memory allocator whenever CPU code pins memory (``t.pin_memory()``,
``DataLoader(pin_memory=True)``) or copies device data back with ``non_blocking=True``. A Python
backend cannot hand torch a C++ allocator in torch 2.13, so all of these used to fail in plain CPU
code. On a real card, pinning page-locks host memory so DMA can read it directly; the modeled host
has no pages to lock, so pinning here is bookkeeping: ``pin_memory()`` returns a CPU copy whose
storage is remembered, ``is_pinned()`` answers from that record, and copies from pinned and
unpinned memory are modeled alike (the copy model lives in ``ops_special``).

Three kernels, registered per op: ``_pin_memory`` and ``is_pinned`` for CPU tensors, and ``_to_copy``
for spyre tensors (torch's composite ``_to_copy`` asks for a pinned buffer when a device tensor goes
to the CPU with ``non_blocking=True``; this one gives a plain CPU buffer and records it as pinned,
which is what CUDA returns).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

BACKEND = "spyre"
_PINNED: weakref.WeakValueDictionary[int, torch.UntypedStorage] = weakref.WeakValueDictionary()


def _remember(t: torch.Tensor) -> torch.Tensor:
    storage = t.untyped_storage()
    if storage.data_ptr():
        _PINNED[storage.data_ptr()] = storage
    return t


def is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    """CPU kernel of ``aten::is_pinned``: was this storage made by ``pin_memory()`` (or a pinned copy)?"""
    storage = self.untyped_storage()
    return storage.data_ptr() != 0 and _PINNED.get(storage.data_ptr()) is storage


def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """CPU kernel of ``aten::_pin_memory``: a CPU copy with the same strides, recorded as pinned."""
    if device is not None and torch.device(device).type not in ("cpu", BACKEND):
        raise RuntimeError(f"pin_memory(device={device!r}): this process's accelerator is {BACKEND}; "
                           "call pin_memory() without a device")
    return _remember(self.clone())


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some permutation of ``t`` is contiguous (then its strides can be kept)."""
    expected = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def to_copy(self: torch.Tensor, dtype: torch.dtype | None = None, layout: torch.layout | None = None,
            device: torch.device | None = None, pin_memory: bool | None = None, non_blocking: bool = False,
            memory_format: torch.memory_format | None = None) -> torch.Tensor:
    """PrivateUse1 kernel of ``aten::_to_copy`` (any copy to or from spyre): torch's composite, without
    asking for a pinned allocator."""
    if layout not in (None, torch.strided):
        raise RuntimeError(f"spyre tensors are strided; cannot copy to layout {layout}")
    dtype = self.dtype if dtype is None else dtype
    device = self.device if device is None else torch.device(device)
    pinned = bool(pin_memory) or (non_blocking and device.type == "cpu")
    if pinned and device.type != "cpu":
        raise RuntimeError(f"only CPU memory can be pinned, not {device}")
    memory_format = torch.preserve_format if memory_format is None else memory_format
    if memory_format == torch.preserve_format and _dense(self):
        out = torch.empty_strided(self.shape, self.stride(), dtype=dtype, device=device)
    else:
        if memory_format == torch.preserve_format:
            memory_format = (torch.channels_last if self.dim() == 4 and self.is_contiguous(
                memory_format=torch.channels_last) else torch.contiguous_format)
        out = torch.empty(self.shape, dtype=dtype, device=device, memory_format=memory_format)
    out.copy_(self, non_blocking=non_blocking)
    return _remember(out) if pinned else out
