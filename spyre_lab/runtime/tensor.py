"""Spyre tensors: plain PrivateUse1 tensors whose storage carries a :class:`DeviceBuffer`.

Why this shape: torch 2.13 lets a pure-Python backend own *storages*, not tensor subclasses. Every
spyre tensor is an ordinary ``torch.Tensor`` on ``spyre:i`` whose storage was made by
``torch._C._construct_storage_from_data_pointer`` with the modeled DRAM address as its data
pointer; the storage's Python object holds the payload. Views, ``.data``, ``detach`` and autograd's
saved tensors share the storage, so they all find the same payload.

The payload keeps the data the way the card does: stickified (:func:`~spyre_lab.device.layout.stickify`)
in the device dtype, in an allocation of the device's DRAM model.

**Dtype policy** (one rule for every source dtype, :mod:`~spyre_lab.runtime.dtype_policy`). The card computes
and stores floating point in fp16: a float32 / float64 / bfloat16 tensor keeps its dtype on the host side but is
stored as fp16 (one warning per dtype), and a finite value beyond fp16's range raises
:class:`~spyre_lab.runtime.errors.SpyreRangeError` rather than becoming inf.

A host mirror (the unstickified storage, flat) is cached per buffer and dropped on every write, so
kernels that read the same buffer repeatedly do not unstickify it every time.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from spyre_lab.device.layout import contiguous_strides
from spyre_lab.device.layout import device_dtype as layout_device_dtype
from spyre_lab.runtime.device_buffer import DeviceBuffer, buffer_layout, buffer_tag, storage_numel
from spyre_lab.runtime.devices import get_device
from spyre_lab.runtime.dtype_policy import (
    NARROWED_TO_FP16,
    storage_dtype,
    warn_if_narrowed,
)
from spyre_lab.runtime.errors import SpyreDtypeError, SpyreRangeError, SpyreUsageError  # noqa: F401  (raised here)

_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

# --- making tensors ---------------------------------------------------------------------------
def _seed_tensor(index: int, dtype: torch.dtype) -> torch.Tensor:
    """A 0-element PrivateUse1 tensor on ``spyre:index`` to clone fresh TensorImpls from.

    ``torch._C._acc.create_empty_tensor`` only makes ``spyre:0`` tensors; for other indices a CPU
    tensor's DLPack capsule is relabelled as an external device (kDLExtDev = PrivateUse1).
    """
    seeds = get_device(index).seed_tensors                 # kept by the card
    seed = seeds.get(dtype)
    if seed is None:
        # made inside inference_mode, the seed (and every tensor aliased from it later) would be an inference tensor
        with torch.inference_mode(False):
            seed = seeds[dtype] = _new_seed(index, dtype)
    return seed


def _new_seed(index: int, dtype: torch.dtype) -> torch.Tensor:
    if index == 0:
        return torch._C._acc.create_empty_tensor((0,), dtype)
    import ctypes

    capsule = torch.empty(0, dtype=dtype).__dlpack__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    device_field = (ctypes.c_int32 * 2).from_address(get_pointer(capsule, b"dltensor") + 8)
    device_field[0], device_field[1] = 12, index  # DLDeviceType.kDLExtDev, device id
    return torch._C._from_dlpack(capsule)


def empty_spyre(size: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype,
                device_index: int, exact: bool = False) -> torch.Tensor:
    """A new spyre tensor backed by a fresh DRAM allocation (contents zero).

    ``exact``: store ``dtype`` itself (float32 has a device format) instead of fp16. Compiled programs
    use it for the fp32 intermediates they keep inside (a norm's sum of squares), never for a tensor
    the caller sees, which follows the fp16 storage policy."""
    size, stride, numel, shape = _geometry(tuple(size), None if stride is None else tuple(stride))
    device = get_device(device_index)
    buffer = DeviceBuffer(device, numel, dtype, shape, exact=exact)
    storage = torch._C._construct_storage_from_data_pointer(buffer.address, torch_device(device_index),
                                                            numel * dtype.itemsize)
    tensor = _ALIAS(_META, _seed_tensor(device_index, dtype))
    _SET_STORAGE(_CPU, tensor, storage, 0, size, stride)
    attached = tensor.untyped_storage()
    attached.spyre_buffer = buffer
    attached.spyre_release = _Release(buffer)
    return tensor


class FreshTensors:
    """Makes new spyre tensors of one size, stride and dtype on one card, as :func:`empty_spyre` does, with what
    that works out at every call (the geometry, the buffer's layout and tag, the seed tensor, the storage's
    device and size) worked out once: a cached eager launch makes its outputs with one of these per output."""

    __slots__ = ("device", "dtype", "layout", "nbytes", "numel", "seed", "size", "storage_bytes", "stride", "tag",
                 "torch_device")

    def __init__(self, size: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype,
                 device_index: int) -> None:
        self.size, self.stride, self.numel, shape = _geometry(tuple(size), None if stride is None else tuple(stride))
        self.device = device = get_device(device_index)
        self.dtype = dtype
        self.layout = buffer_layout(shape, dtype, device.config.stick_bytes, False)
        self.nbytes = self.layout.device_nbytes
        self.tag = buffer_tag(dtype, shape)
        self.seed = _seed_tensor(device_index, dtype)
        self.torch_device = torch_device(device_index)
        self.storage_bytes = self.numel * dtype.itemsize

    def __call__(self) -> torch.Tensor:
        """A new tensor on a fresh DRAM allocation: ``empty_spyre(size, stride, dtype, index)``."""
        device, dtype = self.device, self.dtype
        if dtype in NARROWED_TO_FP16:
            warn_if_narrowed(dtype)
        buffer = _new_object(DeviceBuffer)         # DeviceBuffer.__init__'s own-allocation road, its layout known
        buffer.device, buffer.numel, buffer.host_dtype, buffer.layout = device, self.numel, dtype, self.layout
        buffer.generation = device.generation
        buffer._data = buffer._host = None
        buffer._views = {}
        allocation = buffer.allocation = device.memory.allocate(self.nbytes, self.tag)
        device.live_buffers[allocation.address] = buffer
        storage = _construct_storage(allocation.address, self.torch_device, self.storage_bytes)
        storage.spyre_buffer = buffer              # the storage keeps its Python object: the tensor's finds these
        storage.spyre_release = _Release(buffer)
        tensor = _ALIAS(_META, self.seed)
        _SET_STORAGE(_CPU, tensor, storage, 0, self.size, self.stride)
        return tensor


_new_object = object.__new__
_construct_storage = torch._C._construct_storage_from_data_pointer


class _Release:
    """Frees a tensor's DRAM when its storage dies: kept on the storage (as ``spyre_buffer`` is), so it goes
    with the storage's Python object, which torch keeps exactly as long as the storage lives. (A
    ``weakref.finalize`` would do the same at several times the cost, on every eager op's result.)"""

    __slots__ = ("buffer",)

    def __init__(self, buffer: DeviceBuffer) -> None:
        self.buffer = buffer

    def __del__(self) -> None:
        buffer = self.buffer               # DeviceBuffer.free and SpyreDevice.free written out: two calls fewer
        device = buffer.device
        if buffer.generation == device.generation:
            allocation = buffer.allocation
            device.live_buffers.pop(allocation.address, None)
            device.memory.free(allocation)


_ALIAS = torch.ops.aten.alias.default._handle.redispatch_boxed
_SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed


@functools.lru_cache(maxsize=4096)
def _geometry(size: tuple[int, ...], stride: tuple[int, ...] | None
              ) -> tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]:
    """A new tensor's size and stride as ints, its storage's element count, and the shape its buffer is laid
    out by: a contiguous tensor by its own shape, anything else as its flat storage."""
    size = tuple(map(int, size))
    contiguous = contiguous_strides(size)
    stride = contiguous if stride is None else tuple(map(int, stride))
    numel = storage_numel(size, stride)
    return size, stride, numel, size if stride == contiguous else (numel,)


@functools.lru_cache(maxsize=64)
def torch_device(index: int) -> torch.device:
    return torch.device("spyre", index)


def owns_its_memory(values: torch.Tensor) -> bool:
    """Does ``values`` (a kernel's result) hold a whole storage of its own, from its start, that no other
    tensor shares? Then it can become a buffer's mirror without a copy: nobody else can see or change it.

    Asked of the storage's reference count, not of ``values._base``: under ``torch.inference_mode()`` a
    view has no ``_base``, and a view of an input at an offset, adopted, would be read at the wrong offset."""
    if values.storage_offset() or not values.is_contiguous():
        return False
    storage = values.untyped_storage()
    return (storage.nbytes() == values.numel() * values.element_size()
            and _storage_use_count(storage._cdata) <= 2)   # this tensor and the ``storage`` handle above


_storage_use_count = torch._C._storage_Use_Count


def buffer_of(t: torch.Tensor) -> DeviceBuffer:
    """The payload behind a spyre tensor (errors clearly for anything else)."""
    try:
        buffer = t.untyped_storage().spyre_buffer      # every launch asks this of every operand: the short road
    except (AttributeError, RuntimeError, NotImplementedError):
        buffer = None
    if buffer is not None:                            # only the spyre runtime's storages carry one
        buffer.check_valid()
        return buffer
    if t.device.type != "spyre":
        raise SpyreUsageError(f"expected a spyre tensor, got one on {t.device}")
    raise SpyreUsageError(
        "this spyre tensor has no device buffer: its storage was not made by the spyre runtime (a slice of a "
        "storage, or one torch built around a storage's memory); create spyre tensors with .to('spyre') or "
        "factories with device='spyre', and save or pickle CPU copies (t.cpu()) instead of spyre tensors"
    )


def _typed_buffer(t: torch.Tensor) -> DeviceBuffer:
    buffer = buffer_of(t)
    if t.dtype != buffer.host_dtype:
        refuse_reinterpretation(t.dtype, buffer)
    return buffer


def refuse_reinterpretation(dtype: torch.dtype, buffer: DeviceBuffer) -> None:
    """Raise the error for reading or writing ``buffer`` as ``dtype`` when it holds ``buffer.host_dtype``.

    torch reaches a storage's bytes through a uint8 tensor over it (every ``UntypedStorage`` method: ``fill_``,
    ``tolist``, ``cpu``, item access; ``torch.save``); the card has no such bytes: it keeps each tensor
    stickified in its device dtype, so the request is refused where it starts, naming the tensor-level way."""
    if dtype == torch.uint8:
        raise SpyreUsageError(
            f"raw byte access to a spyre storage (untyped_storage().fill_/tolist/cpu/[i], torch.save, pickle) is "
            f"not supported: the card holds this {buffer.host_dtype} storage stickified in its device dtype, not as "
            "bytes. Work on the tensor instead (t.zero_(), t.fill_(v), t.tolist()), and save or pickle CPU copies: "
            "t.cpu(), model.cpu().state_dict()"
        )
    raise SpyreUsageError(
        f"this {dtype} tensor views a storage written as {buffer.host_dtype}: it reinterprets the bits, but "
        "spyre keeps data stickified in its device dtype. Reinterpret on the CPU: t.cpu().view(dtype)"
    )


def tensor_over(storage: torch.UntypedStorage, size: Sequence[int], stride: Sequence[int],
                offset: int = 0) -> torch.Tensor:
    """A spyre tensor on an existing spyre ``storage`` (no new DRAM), in the dtype the storage was written in."""
    buffer: DeviceBuffer = storage.spyre_buffer           # type: ignore[attr-defined]
    tensor = _ALIAS(_META, _seed_tensor(buffer.device.index, buffer.host_dtype))
    _SET_STORAGE(_CPU, tensor, storage, offset, tuple(size), tuple(stride))
    return tensor


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with ``t``'s values, viewing the buffer's host mirror (read-only by convention)."""
    return _typed_buffer(t).read_window(t.size(), t.stride(), t.storage_offset())


def write_into(t: torch.Tensor, values: torch.Tensor) -> None:
    """Write host ``values`` (broadcast and cast like ``copy_``) into spyre tensor ``t``'s window."""
    _typed_buffer(t).write_window(t.size(), t.stride(), t.storage_offset(), values)


def from_host(cpu: torch.Tensor, device_index: int) -> torch.Tensor:
    """A new spyre tensor holding ``cpu``'s values (no trace; the callers model the DMA)."""
    if cpu.layout != torch.strided:
        raise SpyreUsageError(f"spyre holds only dense (strided) tensors, not {cpu.layout} ones; compute this on "
                              "the CPU (x.cpu()) and convert with .to_dense() before moving the result to spyre")
    out = empty_spyre(cpu.shape, None, cpu.dtype, device_index)
    if out.numel():
        write_into(out, cpu)
    return out


def device_nbytes(t: torch.Tensor) -> int:
    """Bytes a DMA of ``t``'s elements moves in the device format (fp16 for floats, int32 for int64)."""
    return t.numel() * layout_device_dtype(storage_dtype(t.dtype)).itemsize


def resize(t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...] | None) -> None:
    """Give ``t`` a new shape; grow its storage (a new DRAM block, old contents kept) if needed."""

    stride = contiguous_strides(size) if stride is None else tuple(stride)
    need = storage_numel(size, stride, t.storage_offset())
    buffer = buffer_of(t)
    if need <= buffer.numel:
        torch.ops.aten.set_.source_Storage_storage_offset.redispatch(_CPU, t, t.untyped_storage(), t.storage_offset(),
                                                           size, stride)
        return
    grown = empty_spyre((need,), None, t.dtype, t.device.index)
    if buffer.numel:
        write_into(grown[: buffer.numel], buffer.host_flat())
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(_CPU, t, grown.untyped_storage(), t.storage_offset(),
                                                       size, stride)
