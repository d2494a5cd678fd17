"""What every tile-program emitter shares: operands in iteration dims, stick padding, the ring
reduction chain, and which cores load the same bytes at once (DRAM broadcast groups).

The emitters (:mod:`~spyre_lab.compiler.tiling_rows`, :mod:`~spyre_lab.compiler.tiling_matmul`,
:mod:`~spyre_lab.compiler.tiling_mlp`) turn one core's slice into a
:class:`~spyre_lab.device.isa.CoreOps` and list the LX buffers one steady-state tile period needs,
so the scratchpad planner can place them and tile sizes can shrink until they fit. Their conventions:

* **Double buffering** is written into the dependencies: the loads of tile ``t`` wait for tile
  ``t - 2`` to finish (``t - 1`` when ``double_buffer`` is off), so a load can overlap the compute of
  the tile before it and LX never holds more than two copies of a streamed buffer.
* **Accumulate and in-place ops** write into a buffer another op owns: they have no ``out`` and every
  later reader depends on the owner too, which keeps the owner's LX claim alive (the simulator frees
  a buffer when all ops depending on its producer are done).
* **Bytes** are whole sticks: each operand tile is padded along its tensor's last dim (its stick dim)
  to a multiple of ``elems_per_stick``. A keepdim reduction's output (``[..., 1]``) therefore moves one
  stick per value: the sparse "1 value per stick" output of a reduction along the stick dim.
* **Views**: an input a node reads through a permute, expand or reshape (``NodeGroup.input_views``) is an
  operand over the viewed axes it moves through, outermost stride first (:func:`view_operand`): a tile
  of a transposed read loads the sticks that tile touches, an expanded axis loads nothing more, and
  each core's DRAM start address follows the view's strides.
* **Broadcast loads**: cores whose slices differ only along dims an operand does not vary in load the
  very same tile of it. Every core of such a group walks its slice in the same loop order, so they ask
  for that tile at the same step, and the load is tagged ``share=<group size>``: DRAM serves it once
  (up to ``cfg.dram_broadcast_cores`` cores per read).
* Partial results of a split reduction dim (matmul K, the MLP's I, a reduced dim of a lone reduction)
  go down a chain over the ring: partner ``r`` receives from ``r + 1``, combines, and forwards to
  ``r - 1``; partner 0 finishes the tile and stores it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from spyre_lab.compiler.ir import InputView, IRNode, Reduction
from spyre_lab.compiler.scratchpad import LXBuffer
from spyre_lab.compiler.work_division import ring_hops
from spyre_lab.device.isa import CoreOps

ACC_BYTES = 4
"""Matmul partial sums accumulate (and travel the ring) in fp32."""

Fits = Callable[[list[LXBuffer]], bool]
"""Does a list of steady-state buffers fit LX? (codegen runs the scratchpad planner to answer)"""

PartnerInfo = tuple[int, list[int], int]
"""(rank among the partners of a split reduction, the partners' physical cores, this core)."""

IN_PLACE_OPS = frozenset({"exp", "sub", "add", "rsqrt"})
"""Pointwise ops torch-spyre lets write into their first input's LX slot."""

PIPELINE_TILES = 4
"""Row tiles a core's slice is cut into at least (when it has the rows): load, compute and store overlap."""

COMBINE_OP = {"sum": "add", "mean": "add", "amax": "max", "max": "max", "amin": "min", "min": "min",
              "matmul": "add"}
"""How partners combine partial results of a split reduction."""


@dataclass(frozen=True)
class Operand:
    """A buffer as one kernel sees it: which iteration dim each tensor dim runs along (None = broadcast).

    Dims are in memory order, the last one the stick dim. For a plain read they are the buffer's own;
    for a read through views (:func:`view_operand`) they are the viewed axes the read touches, ordered
    by stride, with ``strides``/``offset`` (elements of the base buffer) saying where each lies.
    """

    buffer: str
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    itemsize: int
    strides: tuple[int, ...] = ()
    offset: int = 0

    @property
    def dims(self) -> frozenset[str]:
        return frozenset(a for a in self.axes if a is not None)

    def tile_bytes(self, extent: Mapping[str, int], stick_bytes: int) -> int:
        """Bytes of one tile whose extent along iteration dim ``d`` is ``extent[d]``, in whole sticks."""
        if not self.shape:
            return stick_bytes
        sizes = [extent.get(a, n) if a is not None else n for a, n in zip(self.axes, self.shape)]
        eps = stick_bytes // self.itemsize
        rows = math.prod(sizes[:-1])
        return rows * math.ceil(sizes[-1] / eps) * stick_bytes


def view_operand(buffer: str, view: InputView, sizes: Mapping[str, int], itemsize: int) -> Operand | None:
    """An input read through views, as the bytes a tile of the node's iteration space touches in the base buffer.

    The viewed axes that move through memory (size > 1, stride > 0; expanded axes read the same bytes
    again) are sorted outermost first by stride, so the last one is the stick dim of the base buffer
    when its stride is 1. When no axis has stride 1, every element lies in a stick of its own: a unit
    stick dim is appended. None when the axes overlap in memory (then the caller falls back to the
    buffer's own dims).
    """
    if len(view.axes) != len(view.shape) or len(view.strides) != len(view.shape):
        return None
    moving = sorted(((st, n, a if a is not None and sizes.get(a) == n else None)
                     for n, st, a in zip(view.shape, view.strides, view.axes) if n > 1 and st > 0), reverse=True)
    for (outer, _, _), (inner, n, _) in itertools.pairwise(moving):
        if outer < inner * n:
            return None
    if not moving or moving[-1][0] != 1:
        moving.append((1, 1, None))
    return Operand(buffer, tuple(n for _, n, _ in moving), tuple(a for _, _, a in moving), itemsize,
                   tuple(st for st, _, _ in moving), view.offset)


def share_group(varies_along: Iterable[str], splits: Mapping[str, int], exclude: Iterable[str] = ()) -> int:
    """How many cores load the very same tile of an operand at the same step.

    Cores whose slices differ only along split dims the operand does not vary along need identical
    bytes of it: the group is the product of those dims' splits. ``exclude`` names split dims whose
    cores do not all load the operand (only partner 0 of a split reduction runs an epilogue).
    """
    varies, skip = set(varies_along), set(exclude)
    return math.prod(count for dim, count in splits.items() if dim not in varies and dim not in skip)


def align_axes(shape: Sequence[int], dims: Sequence[str], sizes: Mapping[str, int]) -> tuple[str | None, ...]:
    """Match a buffer's dims to iteration dims: positionally when ranks agree, else right-aligned (broadcast)."""
    pad = len(dims) - len(shape)
    axes: list[str | None] = []
    for i, n in enumerate(shape):
        d = dims[pad + i] if 0 <= pad + i < len(dims) else None
        axes.append(d if d is not None and sizes[d] == n and n > 1 else None)
    return tuple(axes)


def node_axes(node: IRNode, buffer_shape: Sequence[int], is_output: bool) -> tuple[str | None, ...]:
    """Iteration dims of one of ``node``'s buffers (a reduction's output drops its reduced dims)."""
    dims = list(node.dims)
    if is_output and isinstance(node, Reduction) and len(buffer_shape) != len(dims):
        dims = [d for d in dims if d not in node.reduction_dims]
    return align_axes(buffer_shape, dims, node.dims)


def renamed(node: IRNode, anchor_dims: Sequence[str]) -> dict[str, str]:
    """Map ``node``'s dim names onto the anchor's by right alignment (nodes of lower rank broadcast)."""
    own = list(node.dims)
    pad = len(anchor_dims) - len(own)
    return {d: anchor_dims[pad + i] if pad + i >= 0 else d for i, d in enumerate(own)}


def pad_to_sticks(n: int, eps: int) -> int:
    return math.ceil(n / eps) * eps


def chunks(total: int, size: int) -> list[int]:
    """``total`` cut into pieces of ``size`` (the last one shorter)."""
    return [min(size, total - start) for start in range(0, total, size)]


def halvings(n: int, quantum: int, floor: int) -> list[int]:
    """``n`` (a multiple of ``quantum``), halved repeatedly in multiples of ``quantum`` down to ``floor``."""
    out, v = [], n
    while True:
        out.append(v)
        nxt = max(quantum, math.ceil(v / 2 / quantum) * quantum)
        if nxt >= v or nxt < floor:
            return out
        v = nxt


def tile_grid(extent: Mapping[str, int], tile: Mapping[str, int]) -> list[dict[str, int]]:
    """Every tile of a slice, row-major, with its actual extent per dim (edge tiles may be short)."""
    dims = list(extent)
    counts = [math.ceil(extent[d] / tile[d]) for d in dims]
    tiles = []
    for flat in range(math.prod(counts)):
        idx, rest = [], flat
        for c in reversed(counts):
            idx.append(rest % c)
            rest //= c
        idx.reverse()
        tiles.append({d: min(tile[d], extent[d] - i * tile[d]) for d, i in zip(dims, idx)})
    return tiles


def slot_wait(history: Sequence[int], double_buffer: bool) -> tuple[int, list[int]]:
    """(buffer copy, deps) for the next streamed load: it reuses the copy the op ``gap`` steps back used."""
    gap = 2 if double_buffer else 1
    s = len(history)
    return (s % 2 if double_buffer else 0), ([history[s - gap]] if s >= gap else [])


def chain_reduce(p: CoreOps, partner_info: PartnerInfo, nbytes: int, elements: int, owner: int, last: int,
                 tag: str, cores: int, combine: str) -> int:
    """Reduce a partial result down the partner chain; returns the op after which this partner is done.

    Partner ``rank`` receives partner ``rank + 1``'s partial, combines it into its own (in place, into
    the buffer ``owner`` holds), then sends the result to ``rank - 1``. Partner 0 ends with the total.
    """
    rank, partners, core = partner_info
    done = last
    if rank + 1 < len(partners):
        recv = p.ring_recv("psum_in", nbytes, partners[rank + 1], f"{tag}:{rank + 1}->{rank}", deps=[last],
                           name=f"recv psum {tag}")
        done = p.vector(None, elements, deps=[recv, owner, last], out_bytes=0, name=f"{combine} psum {tag}")
    if rank > 0:
        hops = ring_hops(core, partners[rank - 1], cores)
        done = p.ring_send(nbytes, partners[rank - 1], hops, f"{tag}:{rank}->{rank - 1}", deps=[done, owner],
                           name=f"send psum {tag}")
    return done
