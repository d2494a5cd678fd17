"""KTIR's three-step access on a flat model of device memory: memory view -> access tile -> load / store.

Each pointer argument of a kernel is one flat buffer of elements. A memory view places an N-d index
space on it (``sizes``, ``strides`` in elements, a ``coordinate_set`` of valid coordinates); an access
tile picks a box of that space at some indices (``access_tile_set``, ``access_tile_order``); a load
gathers the box into a tensor, a store scatters a tensor back. Coordinates outside either set read as
zero and are not written: that is how a ragged last tile stays in bounds. A transfer costs the
128-byte sticks it touches, the unit of LPDDR5 <-> LX transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spyre_lab.ktir.affine import AffineMap, AffineSet


@dataclass
class Buffer:
    """One kernel argument's memory: a flat tensor that grows (zero-filled) as views reach further."""

    name: str
    data: torch.Tensor

    def reach(self, n: int) -> None:
        if n > self.data.numel():
            grown = torch.zeros(n, dtype=self.data.dtype)
            grown[: self.data.numel()] = self.data
            self.data = grown


@dataclass(frozen=True)
class Pointer:
    buffer: str
    offset: int = 0       # in elements


@dataclass
class MemoryView:
    pointer: Pointer
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    coordinates: AffineSet | None
    dtype: torch.dtype
    on_chip: bool         # ct_local / LX memory: transfers are free, as in ktir-cpu

    def flat(self, coords: torch.Tensor) -> torch.Tensor:
        """Element index in the buffer of each coordinate row (coords: [..., rank])."""
        strides = torch.tensor(self.strides, dtype=torch.int64)
        return self.pointer.offset + (coords * strides).sum(-1)

    def valid(self, coords: torch.Tensor) -> torch.Tensor:
        ok = torch.ones(coords.shape[:-1], dtype=torch.bool)
        for d, n in enumerate(self.sizes):
            ok &= (coords[..., d] >= 0) & (coords[..., d] < n)
        if self.coordinates is not None:
            ok &= torch.as_tensor(self.coordinates.contains([coords[..., d] for d in range(coords.shape[-1])]))
        return ok


@dataclass
class AccessTile:
    view: MemoryView
    base: tuple[int, ...]
    shape: tuple[int, ...]
    tile_set: AffineSet | None
    order: tuple[int, ...]            # tensor dim j runs along tile dim order[j]

    def coords(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(view coordinates [*shape, rank], mask [*shape]) of the tile's elements, in tile-dim order."""
        grids = torch.meshgrid(*[torch.arange(n) for n in self.shape], indexing="ij") if self.shape else []
        local = torch.stack(list(grids), -1) if self.shape else torch.zeros((0,), dtype=torch.int64)
        mask = self.view.valid(local + torch.tensor(self.base)) if self.shape else torch.ones((), dtype=torch.bool)
        if self.tile_set is not None and self.shape:
            mask &= torch.as_tensor(self.tile_set.contains([local[..., d] for d in range(len(self.shape))]))
        return local + torch.tensor(self.base, dtype=torch.int64), mask

    def result_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[d] for d in self.order)


def sticks_touched(flat: torch.Tensor, itemsize: int, stick_bytes: int) -> int:
    """Bytes moved: whole sticks, counted once each."""
    if flat.numel() == 0:
        return 0
    return int(torch.unique(flat * itemsize // stick_bytes).numel()) * stick_bytes


def load(tile: AccessTile, buffers: dict[str, Buffer], stick_bytes: int) -> tuple[torch.Tensor, int, tuple]:
    """Gather the tile: (tensor, bytes moved, a key that is equal for two loads of the same sticks)."""
    view = tile.view
    buf = buffers[view.pointer.buffer]
    coords, mask = tile.coords()
    flat = view.flat(coords)
    live = flat[mask]
    if live.numel():
        buf.reach(int(live.max()) + 1)
    out = torch.zeros(tile.shape, dtype=view.dtype)
    out[mask] = buf.data[live].to(view.dtype)
    out = out.permute(*tile.order) if tile.order != tuple(range(len(tile.order))) else out
    key = (view.pointer.buffer, _digest(live))
    return out, 0 if view.on_chip else sticks_touched(live, view.dtype.itemsize, stick_bytes), key


def store(value: torch.Tensor, tile: AccessTile, buffers: dict[str, Buffer], stick_bytes: int) -> int:
    """Scatter ``value`` into the tile; returns bytes moved."""
    view = tile.view
    buf = buffers[view.pointer.buffer]
    coords, mask = tile.coords()
    inverse = [tile.order.index(d) for d in range(len(tile.order))]
    value = value.permute(*inverse) if tile.order != tuple(range(len(tile.order))) else value
    if tuple(value.shape) != tile.shape:
        value = value.reshape(tile.shape) if value.numel() == math.prod(tile.shape) else value.expand(tile.shape)
    flat = view.flat(coords)
    live = flat[mask]
    if live.numel():
        buf.reach(int(live.max()) + 1)
    buf.data[live] = value[mask].to(buf.data.dtype)
    return 0 if view.on_chip else sticks_touched(live, view.dtype.itemsize, stick_bytes)


def _digest(flat: torch.Tensor) -> tuple:
    if flat.numel() == 0:
        return ()
    return (int(flat.numel()), int(flat.min()), int(flat.max()), int(flat.sum()))


def order_of(order: AffineMap | None, rank: int) -> tuple[int, ...]:
    """An access_tile_order map as a permutation of tile dims (identity when absent)."""
    if order is None:
        return tuple(range(rank))
    probe = [10 ** d for d in range(rank)]
    out = order.apply(probe)
    return tuple(probe.index(v) for v in out)
