"""The ops a backend must provide itself: allocation, copies across PCIe, scalars, resize and set_.

These are not computations, so they bypass the eager launch path: ``empty``/``empty_strided``
allocate DRAM, ``_copy_from`` moves data over PCIe (H2D, D2H, and between cards), ``.item()`` is a
small D2H, ``resize_`` grows a storage into a new DRAM block, ``set_`` rebinds metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from spyre_lab.device.layout import contiguous_strides
from spyre_lab.runtime.devices import device_index, get_device
from spyre_lab.runtime.eager_programs import launch_eager
from spyre_lab.runtime.stream import current_stream
from spyre_lab.runtime.tensor import (
    SpyreUsageError,
    device_nbytes,
    empty_spyre,
    host_view,
    refuse_reinterpretation,
    resize,
    write_into,
)
from spyre_lab.runtime.timeline import TIMELINE, dma_us, pcie_lane

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
aten = torch.ops.aten


def _empty_memory_format(size: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                         pin_memory: Any = None, memory_format: Any = None) -> torch.Tensor:
    dtype = dtype or torch.get_default_dtype()
    stride = None
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
    return empty_spyre(size, stride, dtype, device_index(device))


def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> torch.Tensor:
    return empty_spyre(size, stride, dtype or torch.get_default_dtype(), device_index(device))


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Copies across the PCIe link (and within / between cards), each one a traced DMA."""
    if src.dtype.is_complex or dst.dtype.is_complex:
        raise TypeError("spyre has no complex dtypes; keep complex tensors on the CPU")
    if dst.device.type == "spyre" and src.device.type != "spyre":
        with TIMELINE.launch("H2D copy", bytes=device_nbytes(dst)):
            write_into(dst, src.to(dst.dtype) if src.dtype != dst.dtype else src)
            stream = current_stream(dst.device.index)
            nbytes = device_nbytes(dst)
            stream.enqueue(f"H2D {tuple(dst.shape)} {dst.dtype}", "pcie.h2d", pcie_lane(dst.device.index),
                           dma_us(nbytes, get_device(dst.device.index)), bytes=nbytes, kind="H2D")
            if not non_blocking:
                stream.synchronize()
        return dst
    if src.device.type == "spyre" and dst.device.type != "spyre":
        with TIMELINE.launch("D2H copy", bytes=device_nbytes(src)):
            values = host_view(src)
            stream = current_stream(src.device.index)
            nbytes = device_nbytes(src)
            stream.enqueue(f"D2H {tuple(src.shape)} {src.dtype}", "pcie.d2h", pcie_lane(src.device.index),
                           dma_us(nbytes, get_device(src.device.index)), bytes=nbytes, kind="D2H")
            stream.synchronize()
            dst.copy_(values)
        return dst
    # spyre -> spyre
    if src.device.index == dst.device.index:
        return launch_eager(aten.copy_.default, (dst, src), {})
    with TIMELINE.launch("D2D copy between cards"):
        values = host_view(src).clone()
        nbytes = device_nbytes(src)
        s_src, s_dst = current_stream(src.device.index), current_stream(dst.device.index)
        _, end = s_src.enqueue("D2H peer copy", "pcie.d2h", pcie_lane(src.device.index),
                               dma_us(nbytes, get_device(src.device.index)), bytes=nbytes, kind="D2H")
        s_dst.enqueue("H2D peer copy", "pcie.h2d", pcie_lane(dst.device.index),
                      dma_us(nbytes, get_device(dst.device.index)), after_us=end, bytes=nbytes, kind="H2D")
        write_into(dst, values)
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(src.shape):
        if dst.device.type == "spyre":
            resize(dst, tuple(src.shape), None)
        else:
            dst.resize_(src.shape)
    return _copy_from(src, dst)


def _copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if src.device.type != "spyre" or dst.device.type != "spyre" or src.device.index != dst.device.index:
        return _copy_from(src, dst, non_blocking)
    return launch_eager(aten.copy_.default, (dst, src), {"non_blocking": non_blocking})


def _local_scalar_dense(t: torch.Tensor) -> Any:
    with TIMELINE.launch("item"):
        stream = current_stream(t.device.index)
        nbytes = device_nbytes(t)
        stream.enqueue("D2H item", "pcie.d2h", pcie_lane(t.device.index), dma_us(nbytes, get_device(t.device.index)),
                       bytes=nbytes, kind="D2H")
        stream.synchronize()
        return host_view(t).item()


def _resize_(t: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    stride = None
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
    resize(t, tuple(size), stride)
    return t


def _set_storage(t: torch.Tensor, source: Any, storage_offset: int = 0, size: Any = None,
                 stride: Any = None) -> torch.Tensor:
    buffer = getattr(source, "spyre_buffer", None)
    if buffer is None:
        raise SpyreUsageError(
            "set_() on a spyre tensor needs a storage the spyre runtime made for a tensor (t.untyped_storage()); a "
            "slice of one (storage[a:b]) or a storage made elsewhere has no device buffer. Slice the tensor instead"
        )
    if t.dtype != buffer.host_dtype:          # how torch reaches a storage's bytes: refused here, where it starts
        refuse_reinterpretation(t.dtype, buffer)
    if size is None:
        size, stride = (source.nbytes() // t.element_size(),), (1,)
    elif stride is None:                      # the schema's default (stride=[]): contiguous, as ATen reads it
        stride = contiguous_strides(tuple(size))
    return aten.set_.source_Storage_storage_offset.redispatch(_CPU, t, source, storage_offset, size, stride)


def _set_tensor(t: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    return _set_storage(t, source.untyped_storage(), source.storage_offset(), source.size(), source.stride())


def _pin_memory(*args: Any, **kwargs: Any) -> Any:
    raise SpyreUsageError("pin_memory() is for CPU tensors that feed a device; a spyre tensor is already on the device")


SPECIAL: dict[Any, Callable[..., Any]] = {
    aten.empty.memory_format: _empty_memory_format,
    aten.empty_strided.default: _empty_strided,
    aten._copy_from.default: _copy_from,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.resize_.default: _resize_,
    aten.set_.source_Storage: _set_storage,
    aten.set_.source_Storage_storage_offset: _set_storage,
    aten.set_.source_Tensor: _set_tensor,
    aten.record_stream.default: lambda *a, **k: None,
    aten.is_pinned.default: lambda *a, **k: False,
    aten._pin_memory.default: _pin_memory,
}
