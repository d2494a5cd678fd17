"""The payload of a spyre storage: its DRAM allocation and its contents, kept the way the card keeps them.

The payload is stickified (:func:`~spyre_lab.device.layout.stickify`) in the device dtype, in an allocation of the
device's DRAM model. A host mirror (the unstickified storage, flat) is cached per buffer and dropped on every write,
so kernels that read the same buffer repeatedly do not unstickify it every time. :mod:`spyre_lab.runtime.tensor`
puts one of these on every spyre tensor's storage.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence

import torch

from spyre_lab.device.layout import StickLayout, contiguous_strides, stickify, unstickify
from spyre_lab.device.memory import Allocation
from spyre_lab.runtime.devices import SpyreDevice
from spyre_lab.runtime.dtype_policy import (
    NARROWED_TO_FP16,
    check_fits_fp16,
    check_fits_int32,
    storage_dtype,
    warn_if_narrowed,
)
from spyre_lab.runtime.errors import SpyreDtypeError, SpyreRangeError, SpyreUsageError  # noqa: F401  (raised here)

_WINDOWS_KEPT = 8
"""Windows of one buffer's mirror kept for reuse (:meth:`DeviceBuffer.read_window`)."""


class DeviceBuffer:
    """The payload of one spyre storage: its DRAM allocation and its stickified contents."""

    __slots__ = ("__weakref__", "_data", "_host", "_views", "allocation", "device", "generation", "host_dtype",
                 "layout", "numel")

    def __init__(self, device: SpyreDevice, numel: int, host_dtype: torch.dtype, shape: Sequence[int],
                 exact: bool = False, placed_at: int | None = None) -> None:
        self.device = device
        self.numel = numel
        self.host_dtype = host_dtype
        shape = tuple(shape)
        self.layout = buffer_layout(shape, host_dtype, device.config.stick_bytes, exact)
        if not exact and host_dtype in NARROWED_TO_FP16:
            warn_if_narrowed(host_dtype)
        self.generation = device.generation
        self._data: torch.Tensor | None = None  # materialised on first use: a copy-in writes it whole
        self._host: torch.Tensor | None = None
        self._views: dict[tuple, torch.Tensor] = {}   # windows of ``_host`` handed out (see read_window)
        if placed_at is None:                   # a tensor's own DRAM block, found by its address from now on
            self.allocation: Allocation = device.allocate(self.layout.device_nbytes, tag=buffer_tag(host_dtype, shape))
            device.register_buffer(self.allocation.address, self)
        else:                                   # a place a compiled program planned in the intermediates segment
            nbytes = self.layout.device_nbytes   # (whoever placed it registers it while it is in use)
            self.allocation = Allocation(placed_at, nbytes, nbytes, buffer_tag(host_dtype, shape))

    @property
    def data(self) -> torch.Tensor:
        """The stickified contents (device size and dtype); a buffer never written reads as zeros.

        Stickified when first asked for after a write: kernels read and write the host mirror, and
        stickify/unstickify are pure rearrangements (the round trip is exact), so no launch pays for them."""
        if self._data is None:
            if self._host is not None:
                self._data = stickify(self._host.reshape(self.layout.host_shape).to(self.layout.dtype), self.layout)
            else:
                self._data = torch.zeros(self.layout.device_size, dtype=self.layout.device_dtype)
        return self._data

    @property
    def address(self) -> int:
        return self.allocation.address

    def free(self) -> None:
        """Give the DRAM back (what the death of the buffer's tensor storage or launch slot does)."""
        self.device.free(self.allocation, self.generation)

    @property
    def device_nbytes(self) -> int:
        return self.layout.device_nbytes

    def check_valid(self) -> None:
        if self.generation != self.device.generation:
            raise SpyreUsageError(
                f"this tensor lived on spyre:{self.device.index} before torch.spyre.reset_device() reset the device; "
                "its DRAM was freed. Move tensors you want to keep to the CPU before reset_device(), then move "
                "them back."
            )

    def host_flat(self) -> torch.Tensor:
        """The storage as a flat host tensor in ``host_dtype`` (cached until the next write). Do not mutate."""
        self.check_valid()
        if self._host is None:
            if self._data is None:             # never written: zeros, as the card's fresh DRAM reads here
                zeros = torch.zeros(self.layout.host_shape, dtype=self.layout.dtype)
                self._replace_mirror(zeros.reshape(-1).to(self.host_dtype), written=False)
            else:
                self._replace_mirror(unstickify(self._data, self.layout).reshape(-1).to(self.host_dtype),
                                     written=False)
        host = self._host
        if host.dim() != 1:                   # a kernel's result adopted in its own shape (see write_window)
            host = self._host = host.view(-1)
        return host

    def _replace_mirror(self, host: torch.Tensor, written: bool = True) -> None:
        """Make ``host`` the mirror: the windows handed out of the old one are dropped, and (``written``: the
        values are new) so is the stickified copy."""
        self._host, self._views = host, {}
        if written:
            self._data = None

    def write_flat(self, flat: torch.Tensor, adopt: bool = False) -> None:
        """Replace the whole storage with ``flat`` (host dtype, ``numel`` elements).

        The values are narrowed to the stored dtype (and checked: fp16 range, int32 range) now; the
        stickified copy is made only when someone reads :attr:`data`. ``adopt``: ``flat`` is a kernel's
        result that owns its memory (:func:`owns_its_memory`), so it becomes the mirror without a copy."""
        if self.generation != self.device.generation:
            self.check_valid()
        dtype = flat.dtype
        if (dtype == self.host_dtype and dtype == self.layout.dtype and dtype != torch.int64 and flat.dim() == 1
                and flat.numel() == self.numel):
            # nothing to narrow or check (fp16 kept as fp16): the mirror is the result itself, or a private copy
            # (what _replace_mirror does, written out: every kernel output comes here)
            self._host = flat if adopt else flat.clone() if flat.is_contiguous() else flat.contiguous()
            self._views, self._data = {}, None
            return
        source = flat.reshape(self.layout.host_shape)
        staged = source.to(self.layout.dtype)
        if self.layout.dtype == torch.float16 and self.host_dtype in NARROWED_TO_FP16:
            check_fits_fp16(source, staged)
        elif staged.dtype == torch.int64:
            check_fits_int32(staged)
        host = staged.reshape(-1).to(self.host_dtype)
        if host.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr():
            host = host.clone()                # the mirror owns its memory: the caller may reuse ``flat``
        self._replace_mirror(host)

    def read_window(self, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
        """The strided window (size, stride, offset) of this storage as a host tensor (do not mutate).

        Kept until the next write replaces the mirror: a weight or a cached operand is read by every launch
        through the same window, and making the view again costs more than the lookup."""
        host = self._host
        if host is None or self.generation != self.device.generation:
            host = self.host_flat()            # made now, or the error of a reset device
        key = (size, stride, offset)
        views = self._views
        try:
            view = views.get(key)
        except TypeError:                      # a list for a size: not kept
            return host.as_strided(size, stride, offset)
        if view is None:
            if len(views) >= _WINDOWS_KEPT:
                views.clear()
            view = views[key] = host.as_strided(size, stride, offset)
        return view

    def write_window(self, size: Sequence[int], stride: Sequence[int], offset: int, values: torch.Tensor,
                     adopt: bool = False) -> None:
        """Write ``values`` (broadcast and cast like ``copy_``) into the strided window of this storage.
        ``adopt``: ``values`` owns its memory (see :meth:`write_flat`)."""
        if values.dtype != self.host_dtype:
            values, adopt = values.to(self.host_dtype), True
        if offset == 0 and _covers(tuple(size), tuple(stride), self.numel):
            if values.shape != size:
                values, adopt = values.expand(size), False
            elif (adopt and values.dtype == self.layout.dtype and values.dtype != torch.int64
                  and values.is_contiguous() and self.generation == self.device.generation):
                # write_flat's adopting road without the flat view: the result is the mirror in its own shape
                # (windows are read from its storage, and host_flat flattens it when asked)
                self._host, self._views, self._data = values, {}, None
                return
            self.write_flat(values.reshape(-1), adopt=adopt and values.is_contiguous())
            return
        flat = self.host_flat().clone()
        flat.as_strided(size, stride, offset).copy_(values)
        self.write_flat(flat)

    def write_rows(self, size: Sequence[int], stride: Sequence[int], offset: int, index: torch.Tensor,
                   values: torch.Tensor) -> None:
        """``window.index_copy_(0, index, values)`` on the strided window (size, stride, offset): only those
        rows are written (values narrowed and checked as any write), the rest of the storage is left as it is.

        What a kernel that stores a few rows of a large buffer needs (a paged-attention launch writes this
        step's K/V slots of a whole cache). Mirrors handed out may be shared, so they are never changed in
        place: the first row write copies the mirror into one this buffer keeps to itself, and later row
        writes update that copy until some other write replaces it."""
        self.check_valid()
        host = self.host_flat()
        own = _ROW_MIRRORS.get(self)
        if own is None or own() is not host:
            with torch.inference_mode(False):       # a normal tensor: later row writes may come from outside it
                host = host.clone()
            self._replace_mirror(host)
            _ROW_MIRRORS[self] = weakref.ref(host)
        staged = values.to(self.layout.dtype)
        if self.layout.dtype == torch.float16 and values.dtype in NARROWED_TO_FP16:
            check_fits_fp16(values, staged)
        elif staged.dtype == torch.int64:
            check_fits_int32(staged)
        host.as_strided(size, stride, offset).index_copy_(0, index, staged.to(self.host_dtype))
        self._data = None

    def __repr__(self) -> str:
        return (f"DeviceBuffer(spyre:{self.device.index} @ {self.address:#x}, {self.device_nbytes} B, "
                f"host {self.host_dtype} x {self.numel}, device {self.layout.device_dtype} {self.layout.device_size})")


_ROW_MIRRORS: weakref.WeakKeyDictionary[DeviceBuffer, weakref.ref] = weakref.WeakKeyDictionary()
"""Per buffer, the mirror its row writes made for themselves (see :meth:`DeviceBuffer.write_rows`), held weakly: a
mirror another write replaced is not kept alive."""


@functools.lru_cache(maxsize=4096)
def _covers(size: tuple[int, ...], stride: tuple[int, ...], numel: int) -> bool:
    """Is the window (size, stride, offset 0) the whole storage of ``numel`` elements, in order?"""
    return stride == contiguous_strides(size) and storage_numel(size, stride) == numel


@functools.lru_cache(maxsize=4096)
def buffer_tag(dtype: torch.dtype, shape: tuple[int, ...]) -> str:
    return f"{dtype} {shape}"


@functools.lru_cache(maxsize=4096)
def buffer_layout(shape: tuple[int, ...], host_dtype: torch.dtype, stick_bytes: int, exact: bool = False
                  ) -> StickLayout:
    """How a buffer of ``host_dtype`` values is laid out on the card: in its storage dtype (fp16 for floats),
    or ``exact``: in ``host_dtype`` itself (the fp32 intermediates compiled programs keep). Layouts are immutable
    and validated on construction, and asked for at every allocation: each is built once."""
    stored = host_dtype if exact else storage_dtype(host_dtype)
    return StickLayout.default(shape, stored, stick_bytes=stick_bytes)


def storage_numel(size: Sequence[int], stride: Sequence[int], offset: int = 0) -> int:
    if 0 in size:
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(size, stride))
