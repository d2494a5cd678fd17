"""Stick layouts: how a host tensor is cut into 128-byte sticks and ordered in device memory.

Spyre moves data between LPDDR5 and a core's LX scratchpad one *stick* at a time: 128 aligned,
contiguous bytes (64 fp16, 32 fp32, 128 int8 values). So a tensor is not stored row-major on the
card. One host dim, the *stick dim*, is cut into sticks (padded up to a whole stick), and the
sticks are ordered by the default rule of torch-spyre's ``SpyreTensorLayout``::

    device dims = [host dims 1..n-2 (in dim_order), ceil(stick dim / eps), host dim 0, eps]

where ``eps`` is elements per stick and the stick dim is the last entry of ``dim_order``. Each
device dim also carries a *stride map* entry, the host element stride of one step along it, so
``host_offset = dot(device_coords, stride_map)``. Size-1 host dims are dropped before the rule is
applied: they do not change where any element lives, so ``(512, 1, 256)`` and ``(512, 256)`` get
the same device layout (and if the stick dim has size 1, the next dim of ``dim_order`` becomes the
stick dim).

Worked examples (fp16)::

    (1024, 256)                     -> device (4, 1024, 64),    stride_map (64, 256, 1)
    (5, 100, 150)                   -> device (100, 3, 5, 64),  stride_map (150, 64, 15000, 1)
    (5, 100, 150), dim_order 1,0,2  -> device (5, 3, 100, 64),  stride_map (15000, 64, 150, 1)
    (300,)   (rank 1)               -> device (5, 64),          stride_map (64, 1)
    ()  or (1, 1) (no dim > 1)      -> device (1, 64),          stride_map (-1, -1)

A rank-1 tensor is just its stick dim: ``[ceil(n / eps), eps]``. A scalar (or a tensor whose dims
are all size 1) occupies one stick whose two device dims are synthetic (stride -1); its single
value sits at device position ``(0, 0)`` and the rest of the stick is padding.

Device element formats follow torch-spyre's ``types_mapping.h``: fp16, bf16, fp32, int32, int8,
uint8 and fp8 keep their width; **int64 is stored as int32** (the real stack warns and narrows;
here :func:`stickify` refuses values outside int32 range rather than corrupt them) and **bool is
stored as a 2-byte fp16 value** (the device's 16-bit format ``SEN169_FP16``), so a bool stick holds
64 values. bf16 keeps its own bits here; the real card converts it to its 16-bit DL16 format.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from spyre_lab.device.config import dtype_bytes

_DEVICE_DTYPE: dict[torch.dtype, torch.dtype] = {
    torch.int64: torch.int32,  # narrowed on the card, as torch-spyre does
    torch.bool: torch.float16,  # the card's 16-bit format, 0.0 / 1.0
}


def device_dtype(dtype: torch.dtype) -> torch.dtype:
    """The element type a host ``dtype`` is stored as on the card (int64 -> int32, bool -> fp16)."""
    dtype_bytes(dtype)  # raises a clear TypeError for dtypes the card cannot hold
    return _DEVICE_DTYPE.get(dtype, dtype)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides, counting size-0 dims as 1 exactly like torch does."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _default_geometry(host_shape: tuple[int, ...], dim_order: tuple[int, ...],
                      eps: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(device_size, stride_map)`` of the default stick rule (see the module docstring)."""
    host_strides = contiguous_strides(host_shape)
    kept = [d for d in dim_order if host_shape[d] != 1]
    if not kept:
        return (1, eps), (-1, -1)
    stick = kept[-1]
    tiles = math.ceil(host_shape[stick] / eps)
    if len(kept) == 1:
        return (tiles, eps), (eps * host_strides[stick], host_strides[stick])
    outer, middle = kept[0], kept[1:-1]
    device_size = (*(host_shape[d] for d in middle), tiles, host_shape[outer], eps)
    stride_map = (*(host_strides[d] for d in middle), eps * host_strides[stick], host_strides[outer],
                  host_strides[stick])
    return device_size, stride_map


class DmaNest(NamedTuple):
    """One DMA loop nest between host and device memory.

    For every index vector ``i`` in ``loop_ranges``:
    ``device[device_offset + dot(i, device_strides)] <-> host[host_offset + dot(i, host_strides)]``
    (offsets and strides in elements). Loops run in decreasing device stride, so the device side
    is walked in address order.
    """

    loop_ranges: tuple[int, ...]
    device_strides: tuple[int, ...]
    host_strides: tuple[int, ...]
    device_offset: int = 0
    host_offset: int = 0

    def as_code(self) -> str:
        """The nest as the Python loops a learner would write."""
        names = [f"i{k}" for k in range(len(self.loop_ranges))]
        lines = [f"{'  ' * k}for {name} in range({n}):" for k, (name, n) in enumerate(zip(names, self.loop_ranges))]

        def offset(base: int, strides: tuple[int, ...]) -> str:
            terms = [f"{s}*{name}" if s != 1 else name for name, s in zip(names, strides) if s > 0]
            return " + ".join(([str(base)] if base else []) + terms) or "0"

        lines.append(f"{'  ' * len(names)}device[{offset(self.device_offset, self.device_strides)}] = "
                     f"host[{offset(self.host_offset, self.host_strides)}]")
        return "\n".join(lines)


@dataclass(frozen=True)
class StickLayout:
    """Where every element of a host tensor lives in device memory (torch-spyre's SpyreTensorLayout).

    Build one with :meth:`default`; the fields are the record, and direct construction is checked
    against the same rule so a layout can never disagree with :func:`stickify`.

    ``dim_order`` is a permutation of the host dims whose last entry is the stick dim;
    ``device_size`` is row-major with the stick (``elems_per_stick`` values) innermost;
    ``stride_map`` gives the host element stride of each device dim, -1 for synthetic dims.
    """

    host_shape: tuple[int, ...]
    dtype: torch.dtype
    dim_order: tuple[int, ...]
    device_size: tuple[int, ...]
    stride_map: tuple[int, ...]
    elems_per_stick: int

    @classmethod
    def default(cls, shape: Sequence[int], dtype: torch.dtype, dim_order: Sequence[int] | None = None,
                stick_bytes: int = 128) -> StickLayout:
        """The default layout of ``shape``: stick dim = ``dim_order[-1]`` (the last host dim by default)."""
        host_shape = _as_shape(shape)
        order = tuple(range(len(host_shape))) if dim_order is None else _as_dim_order(dim_order, len(host_shape))
        eps = _elems_per_stick(dtype, stick_bytes)
        device_size, stride_map = _default_geometry(host_shape, order, eps)
        return cls(host_shape, dtype, order, device_size, stride_map, eps)

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_shape", _as_shape(self.host_shape))
        object.__setattr__(self, "dim_order", _as_dim_order(self.dim_order, len(self.host_shape)))
        object.__setattr__(self, "device_size", tuple(int(s) for s in self.device_size))
        object.__setattr__(self, "stride_map", tuple(int(s) for s in self.stride_map))
        stick_bytes = self.elems_per_stick * dtype_bytes(self.device_dtype)
        if self.elems_per_stick < 1 or _elems_per_stick(self.dtype, stick_bytes) != self.elems_per_stick:
            raise ValueError(f"elems_per_stick={self.elems_per_stick} does not fill a power-of-two stick with "
                             f"{self.device_dtype} elements; build the layout with StickLayout.default(...)")
        expected = _default_geometry(self.host_shape, self.dim_order, self.elems_per_stick)
        if (self.device_size, self.stride_map) != expected:
            raise ValueError(
                f"device_size {self.device_size} / stride_map {self.stride_map} do not follow the stick rule for "
                f"host shape {self.host_shape} with dim_order {self.dim_order} (expected {expected[0]} / "
                f"{expected[1]}); build the layout with StickLayout.default(shape, dtype, dim_order)"
            )
        # read on every stickify/unstickify: computed once (not a field, so equality and hashing ignore it)
        object.__setattr__(self, "_kept", tuple(d for d in self.dim_order if self.host_shape[d] != 1))

    # --- what the layout is made of ------------------------------------------------------------
    @property
    def device_dtype(self) -> torch.dtype:
        """Element type of the device copy (int64 -> int32, bool -> fp16, others unchanged)."""
        return device_dtype(self.dtype)

    @property
    def stick_bytes(self) -> int:
        return self.elems_per_stick * dtype_bytes(self.device_dtype)

    @property
    def _kept_dims(self) -> tuple[int, ...]:
        """``dim_order`` without size-1 dims: the dims the stick rule actually places."""
        return self._kept

    @property
    def stick_dim(self) -> int | None:
        """Host index of the dim cut into sticks; None when no dim is larger than 1 (a scalar)."""
        kept = self._kept_dims
        return kept[-1] if kept else None

    @property
    def _tile_dim(self) -> int:
        """Device index of the "which stick along the stick dim" dim."""
        return max(len(self.device_size) - 3, 0)

    @property
    def tile_dim(self) -> int:
        """Device index of the dim that counts sticks along the stick dim (which stick of a row an element is in)."""
        return self._tile_dim

    @property
    def device_strides(self) -> tuple[int, ...]:
        """Row-major element strides of ``device_size`` (the device copy is always contiguous)."""
        return contiguous_strides(self.device_size)

    # --- sizes ---------------------------------------------------------------------------------
    @property
    def host_numel(self) -> int:
        return math.prod(self.host_shape)

    @property
    def device_numel(self) -> int:
        return math.prod(self.device_size)

    @property
    def num_sticks(self) -> int:
        return math.prod(self.device_size[:-1])

    @property
    def device_nbytes(self) -> int:
        """Bytes the tensor occupies on the card: whole sticks, padding included."""
        return self.num_sticks * self.stick_bytes

    @property
    def host_nbytes(self) -> int:
        return self.host_numel * dtype_bytes(self.dtype)

    @property
    def padding_fraction(self) -> float:
        """Share of device elements that are padding (0 for an empty tensor)."""
        return 1 - self.host_numel / self.device_numel if self.device_numel else 0.0

    # --- addressing ----------------------------------------------------------------------------
    def host_offset(self, device_coords: Sequence[int]) -> int:
        """Host element offset (row-major) of the value at ``device_coords``: ``dot(coords, stride_map)``.

        Raises ``ValueError`` if the position is padding, ``IndexError`` if it is outside the device tensor.
        """
        coords = self._check_device_coords(device_coords)
        for c, s in zip(coords, self.stride_map):
            if s == -1 and c != 0:
                raise ValueError(f"device position {coords} is padding: device dims with stride_map -1 are "
                                 "synthetic and hold a value only at coordinate 0")
        stick = self.stick_dim
        if stick is not None:
            eps = self.elems_per_stick
            along = coords[self._tile_dim] * eps + coords[-1]
            if along >= self.host_shape[stick]:
                raise ValueError(f"device position {coords} is padding: it is element {along} along stick dim "
                                 f"{stick}, which has only {self.host_shape[stick]} elements")
        return sum(c * s for c, s in zip(coords, self.stride_map) if s != -1)

    def device_coords(self, host_index: Sequence[int]) -> tuple[int, ...]:
        """Device coordinates of host element ``host_index`` (the inverse of :meth:`host_offset`)."""
        index = tuple(int(i) for i in host_index)
        if len(index) != len(self.host_shape) or any(not 0 <= i < n for i, n in zip(index, self.host_shape)):
            raise IndexError(f"host index {index} is outside host shape {self.host_shape}")
        kept = self._kept_dims
        if not kept:
            return (0, 0)
        eps, stick = self.elems_per_stick, kept[-1]
        tile, lane = divmod(index[stick], eps)
        if len(kept) == 1:
            return (tile, lane)
        return (*(index[d] for d in kept[1:-1]), tile, index[kept[0]], lane)

    def device_offset(self, device_coords: Sequence[int]) -> int:
        """Element offset of ``device_coords`` in the contiguous device copy (x itemsize for bytes)."""
        coords = self._check_device_coords(device_coords)
        return sum(c * s for c, s in zip(coords, self.device_strides))

    def _check_device_coords(self, device_coords: Sequence[int]) -> tuple[int, ...]:
        coords = tuple(int(c) for c in device_coords)
        if len(coords) != len(self.device_size) or any(not 0 <= c < n for c, n in zip(coords, self.device_size)):
            raise IndexError(f"device coordinates {coords} are outside device size {self.device_size}")
        return coords

    def dci(self) -> tuple[DmaNest, ...]:
        """The DMA loop nests that move exactly the host elements (torch-spyre's DCI stride infos).

        The first nest covers every whole stick; when the stick dim is not a multiple of a stick, a
        second nest (with offsets) covers the partial last stick, as the real remainder entries do.
        For fp16 (1024, 256) there is one nest: ``((4, 1024, 64), (65536, 64, 1), (64, 256, 1))``.
        Padding is never transferred; an empty tensor needs no nest at all.
        """
        if self.host_numel == 0:
            return ()
        device_strides = self.device_strides
        stick = self.stick_dim
        if stick is None:  # one value in one stick
            return (DmaNest((1, 1), device_strides, self.stride_map),)
        tile, eps = self._tile_dim, self.elems_per_stick
        full, rem = divmod(self.host_shape[stick], eps)
        nests = []
        if full:
            ranges = list(self.device_size)
            ranges[tile] = full
            nests.append(DmaNest(tuple(ranges), device_strides, self.stride_map))
        if rem:
            ranges = list(self.device_size)
            ranges[tile], ranges[-1] = 1, rem
            nests.append(DmaNest(tuple(ranges), device_strides, self.stride_map,
                                 device_offset=full * device_strides[tile],
                                 host_offset=full * self.stride_map[tile]))
        return tuple(nests)

    def describe(self) -> str:
        """A few lines for learners: shapes, stride map, sticks, padding and the DMA loop nest."""
        dt = str(self.dtype).removeprefix("torch.")
        dev_dt = str(self.device_dtype).removeprefix("torch.")
        stored = "" if self.device_dtype == self.dtype else f", stored as {dev_dt}"
        stick = "none (scalar)" if self.stick_dim is None else f"host dim {self.stick_dim}"
        lines = [
            f"host    {dt} {self.host_shape}, dim_order {self.dim_order}, stick dim: {stick}",
            f"device  size {self.device_size}, {self.elems_per_stick} values per {self.stick_bytes} B stick{stored}",
            f"        stride_map {self.stride_map} (host elements per device step; -1 = synthetic)",
            f"sticks  {self.num_sticks:,} = {self.device_nbytes:,} B on the card for {self.host_nbytes:,} B on the "
            f"host; {self.padding_fraction:.1%} of device elements are padding",
        ]
        nests = self.dci()
        if not nests:
            lines.append("DMA:    nothing to move (the tensor is empty)")
        for k, nest in enumerate(nests):
            title = "DMA" if k == 0 else "DMA remainder (partial last stick)"
            lines.append(f"{title}:")
            lines.extend("  " + line for line in nest.as_code().splitlines())
        return "\n".join(lines)


def _as_shape(shape: Sequence[int]) -> tuple[int, ...]:
    try:
        dims = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"shape must be a sequence of ints (like torch.Size), got {shape!r}") from None
    if any(s < 0 for s in dims):
        raise ValueError(f"shape {dims} has a negative size")
    return dims


def _as_dim_order(dim_order: Sequence[int], rank: int) -> tuple[int, ...]:
    order = tuple(int(d) for d in dim_order)
    if sorted(order) != list(range(rank)):
        raise ValueError(f"dim_order {order} must be a permutation of the host dims {tuple(range(rank))}; "
                         "its last entry names the stick dim")
    return order


def _elems_per_stick(dtype: torch.dtype, stick_bytes: int) -> int:
    itemsize = dtype_bytes(device_dtype(dtype))
    if stick_bytes < itemsize or stick_bytes & (stick_bytes - 1):
        raise ValueError(f"stick_bytes must be a power of two of at least {itemsize} B for {dtype}, got {stick_bytes}")
    return stick_bytes // itemsize


# --- moving real data --------------------------------------------------------------------------
def _host_view(host: torch.Tensor, layout: StickLayout) -> torch.Tensor:
    """``host`` viewed in placement order: size-1 dims dropped, dims permuted to ``dim_order``."""
    squeezed = [d for d, n in enumerate(layout.host_shape) if n == 1]
    position = {d: k for k, d in enumerate(d for d in range(host.dim()) if d not in squeezed)}
    return host.squeeze(tuple(squeezed)).permute([position[d] for d in layout._kept_dims])


def _device_view(device: torch.Tensor) -> torch.Tensor:
    """The device tensor viewed as ``(outer, middle..., tiles, eps)``, i.e. in placement order with the
    stick dim split into (which stick, position in stick)."""
    rank = device.dim() - 1
    if rank < 2:
        return device
    return device.permute(rank - 1, *range(rank - 1), rank)


def _check_int64_fits(t: torch.Tensor) -> None:
    if t.dtype == torch.int64 and t.numel():
        low, high = (int(v) for v in torch.aminmax(t))
        info = torch.iinfo(torch.int32)
        if low < info.min or high > info.max:
            raise ValueError(f"int64 values in [{low}, {high}] do not fit the card's int32 storage "
                             f"([{info.min}, {info.max}]); keep such tensors on the host")


def stickify(t: torch.Tensor, layout: StickLayout | None = None) -> torch.Tensor:
    """The device copy of ``t``: a contiguous tensor of shape ``layout.device_size`` and dtype
    ``layout.device_dtype``, padding filled with zeros (what a host -> device DMA writes).

    ``layout`` defaults to :meth:`StickLayout.default` of ``t``'s shape and dtype.
    """
    if layout is None:
        layout = StickLayout.default(t.shape, t.dtype)
    elif tuple(t.shape) != layout.host_shape or t.dtype != layout.dtype:
        raise ValueError(f"tensor is {t.dtype} {tuple(t.shape)} but the layout is for {layout.dtype} "
                         f"{layout.host_shape}; pass StickLayout.default(t.shape, t.dtype, dim_order)")
    t = t.detach()
    _check_int64_fits(t)
    out = torch.empty(layout.device_size, dtype=layout.device_dtype)
    if layout.stick_dim is None:
        out.zero_()
        out.view(-1)[:1].copy_(t.reshape(1))
        return out
    src, dst = _host_view(t, layout), _device_view(out)
    full, rem = divmod(src.shape[-1], layout.elems_per_stick)
    if full:
        dst[..., :full, :].copy_(src[..., : full * layout.elems_per_stick].unflatten(-1, (full, -1)))
    if rem:
        dst[..., full, :rem].copy_(src[..., full * layout.elems_per_stick:])
        dst[..., full, rem:].zero_()
    return out


def unstickify(d: torch.Tensor, layout: StickLayout) -> torch.Tensor:
    """The host tensor (contiguous, ``layout.host_shape``, ``layout.dtype``) held by device copy ``d``."""
    if tuple(d.shape) != layout.device_size or d.dtype != layout.device_dtype:
        raise ValueError(f"device tensor is {d.dtype} {tuple(d.shape)} but the layout expects "
                         f"{layout.device_dtype} {layout.device_size}; pass the layout it was stickified with")
    out = torch.empty(layout.host_shape, dtype=layout.dtype)
    if layout.stick_dim is None:
        out.view(-1).copy_(d.reshape(-1)[: out.numel()])
        return out
    dst, src = _host_view(out, layout), _device_view(d)
    full, rem = divmod(dst.shape[-1], layout.elems_per_stick)
    if full:
        dst[..., : full * layout.elems_per_stick].unflatten(-1, (full, -1)).copy_(src[..., :full, :])
    if rem:
        dst[..., full * layout.elems_per_stick:].copy_(src[..., full, :rem])
    return out


def iter_device_positions(layout: StickLayout) -> Iterator[tuple[int, ...]]:
    """Every device coordinate tuple in address order (for small teaching examples, not bulk data)."""
    return itertools.product(*(range(n) for n in layout.device_size))
