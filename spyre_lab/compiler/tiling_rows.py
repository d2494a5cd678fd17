"""Row-tile programs for pointwise, reduction, softmax, norm and restickify kernels.

A core's slice is cut into tiles that keep every reduced dim (and the innermost dim) whole, so a
fused chain such as max -> sub -> exp -> sum -> div runs on one tile entirely in LX: load the
streamed inputs, run every node on the SFU, store the outputs. Inputs with no row dims (a bias row,
a norm weight) are loaded once per core and stay resident. Loads of bytes several cores need at the
same step are DRAM broadcasts (``shares``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from spyre_lab.compiler.ir import IRNode, Pointwise, Reduction
from spyre_lab.compiler.scratchpad import LXBuffer
from spyre_lab.compiler.tiling_common import (
    COMBINE_OP,
    IN_PLACE_OPS,
    PIPELINE_TILES,
    Fits,
    Operand,
    PartnerInfo,
    chain_reduce,
    pad_to_sticks,
    renamed,
    slot_wait,
    tile_grid,
)
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, LXOverflowError


@dataclass
class RowTiling:
    """What the row-tile emitter needs to know about a non-matmul kernel."""

    name: str
    nodes: list[IRNode]
    dims: dict[str, int]                # anchor iteration space
    col_dims: tuple[str, ...]           # kept whole in every tile (reduced dims + the innermost dim)
    operands: dict[str, Operand]        # every buffer the kernel touches, in anchor dims
    inputs: list[str]
    outputs: list[str]
    copy_only: bool = False             # restickify: load and store, no compute
    reduced: frozenset[str] = frozenset()  # anchor dims some node reduces (never cut inside a tile)
    split_reduction: bool = False       # a reduced dim is split across cores: partials meet over the ring
    inner_whole: bool = True            # tiles span the whole innermost dim (row_tile_shape may cut it)
    shares: dict[str, int] = field(default_factory=dict)  # input -> cores loading its tiles at once
    # LX planning steps (CompileOptions.lx_*): off, the intermediates they cover go through DRAM
    lx_pin_reductions: bool = True      # reduction results stay in LX
    lx_in_place: bool = True            # pointwise intermediates stay in LX (exp/sub/add/rsqrt in their input's slot)
    lx_clone_inputs: bool = True        # an input several nodes read is loaded once per tile, not once per reader

    def __post_init__(self) -> None:
        self.operands = _gathered(self.nodes, self.operands)

    def spilled(self) -> frozenset[str]:
        """Intermediates of a fused chain that the LX planning steps switched off leave in DRAM: stored after
        the node that makes them, loaded again by each node that reads them."""
        if len(self.nodes) < 2 or self.copy_only:
            return frozenset()
        return frozenset(n.output for n in self.nodes if n.output not in self.outputs
                         and not (self.lx_pin_reductions if isinstance(n, Reduction) else self.lx_in_place))

    @property
    def lone_reduction(self) -> bool:
        """One reduction and nothing else: its reduced dims may be cut into chunks that accumulate in LX."""
        return len(self.nodes) == 1 and isinstance(self.nodes[0], Reduction)

    def reduction_chunks(self, extent: Mapping[str, int], tile: Mapping[str, int]) -> int:
        """Tiles that accumulate into one output tile (1 unless a reduced dim is cut)."""
        return math.prod(math.ceil(extent[d] / tile[d]) for d in self.reduced if d in extent)

    def resident(self) -> list[str]:
        """Inputs with no row dims (a bias row, a scalar): loaded once per core and kept in LX."""
        if not self.inner_whole:
            return []
        return [b for b in self.inputs if not (self.operands[b].dims - set(self.col_dims))]


def _gathered(nodes: list[IRNode], operands: dict[str, Operand]) -> dict[str, Operand]:
    """The source of an ``index_select`` as the tiles read it: only the rows the output tile selects.

    Lowering leaves the gathered dim of the source unaligned (any row may be picked), which as a plain
    operand would make every tile load the whole source, a whole KV cache for a page gather. A gather
    reads one source row per output row, so for its bytes the gathered dim follows the output's."""
    out = dict(operands)
    for n in nodes:
        if n.op != "index_select" or not n.inputs or n.inputs[0] not in out or n.output not in out:
            continue
        src, dst = out[n.inputs[0]], out[n.output]
        if len(src.axes) != len(dst.axes):
            continue
        # the gathered dim: unaligned in the source, and sized by the index (the output's size there)
        gathered = [a is None and n != m for a, n, m in zip(src.axes, src.shape, dst.shape)]
        if sum(gathered) != 1:
            continue
        out[src.buffer] = Operand(src.buffer, tuple(m if g else s for s, m, g in zip(src.shape, dst.shape, gathered)),
                                  tuple(b if g else a for a, b, g in zip(src.axes, dst.axes, gathered)), src.itemsize,
                                  src.strides, src.offset)
    return out


def _row_tile_ops(k: RowTiling) -> list[tuple[IRNode, str, bool]]:
    """(node, out buffer, in place?) in order; in place when the op allows it and its first input dies here."""
    last_use: dict[str, int] = {}
    for i, n in enumerate(k.nodes):
        for b in n.inputs:
            last_use[b] = i
    plan = []
    resident = set(k.resident())
    for i, n in enumerate(k.nodes):
        first = n.inputs[0] if n.inputs else None
        in_place = (k.lx_in_place and isinstance(n, Pointwise) and n.op in IN_PLACE_OPS and first is not None
                    and last_use.get(first) == i and first not in k.outputs and first not in resident
                    and k.operands[first].shape == k.operands[n.output].shape
                    and k.operands[first].itemsize == k.operands[n.output].itemsize)
        plan.append((n, n.output, in_place))
    return plan


def row_lx_buffers(k: RowTiling, tile: Mapping[str, int], cfg: SpyreConfig, double_buffer: bool) -> list[LXBuffer]:
    """LX buffers of one tile period: loads at step 0, node ``i`` at step ``i + 1``, stores at the last step."""
    steps = len(k.nodes) + 1
    sb = cfg.stick_bytes
    copies = 2 if double_buffer else 1
    bufs: list[LXBuffer] = []
    last_use: dict[str, int] = {}
    for i, n in enumerate(k.nodes):
        for b in n.inputs:
            last_use[b] = i + 1
    for b in k.outputs:
        last_use[b] = steps
    resident = set(k.resident())
    for b in k.inputs:
        size = k.operands[b].tile_bytes(tile, sb)
        if b in resident:
            bufs.append(LXBuffer(b, size, 0, steps))
            continue
        end = steps if k.copy_only else last_use.get(b, 0)
        bufs.append(LXBuffer(f"{b}[0]", size, 0, end))
        bufs.extend(LXBuffer(f"{b}[{c}]", size, 0, steps) for c in range(1, copies))
    slot_of = {b: f"{b}[0]" for b in k.inputs if b not in resident}
    for i, (n, out, in_place) in enumerate(_row_tile_ops(k)):
        size = k.operands[out].tile_bytes(tile, sb)
        parent = slot_of.get(n.inputs[0]) if in_place else None
        name = f"{out}[0]"
        bufs.append(LXBuffer(name, size, i + 1, max(i + 1, last_use.get(out, i + 1)), parent))
        slot_of[out] = name
        if k.split_reduction and isinstance(n, Reduction):
            bufs.append(LXBuffer("psum_in", size, i + 1, i + 1))
        if out in k.outputs:
            bufs.extend(LXBuffer(f"{out}[{c}]", size, 0, steps) for c in range(1, copies))
    return bufs


def row_tile_shape(k: RowTiling, extent: Mapping[str, int], cfg: SpyreConfig, double_buffer: bool,
                   fits: Fits) -> dict[str, int]:
    """The biggest tile of a core's slice that ``fits`` LX: whole col dims, rows halved from the outermost
    row dim inwards; a pointwise kernel may finally cut its innermost dim into fewer sticks, and a lone
    reduction its reduced dims into chunks that accumulate into one output tile. A slice with
    rows to spare is still cut into at least ``PIPELINE_TILES`` tiles, so one tile's load, SFU work and
    store overlap its neighbours' instead of running back to back."""
    tile = dict(extent)
    rows = [d for d in k.dims if d not in k.col_dims]
    while not fits(row_lx_buffers(k, tile, cfg, double_buffer)):
        shrinkable = [d for d in rows if tile[d] > 1]
        if shrinkable:
            d = shrinkable[0]
            tile[d] = math.ceil(tile[d] / 2)
            continue
        inner = list(k.dims)[-1]
        eps = cfg.stick_bytes // max(op.itemsize for op in k.operands.values())
        if inner not in k.reduced and tile[inner] > eps:
            tile[inner] = math.ceil(math.ceil(tile[inner] / eps) / 2) * eps
            k.inner_whole = False
            continue
        quantum = {d: eps if d == inner else 1 for d in k.dims}
        chunkable = [d for d in k.dims if d in k.reduced and tile[d] > quantum[d]] if k.lone_reduction else []
        if chunkable:  # accumulate the reduction over chunks of its reduced dims
            d = chunkable[0]
            tile[d] = math.ceil(math.ceil(tile[d] / quantum[d]) / 2) * quantum[d]
            k.inner_whole = k.inner_whole and d != inner
            continue
        need = sum(b.size for b in row_lx_buffers(k, tile, cfg, double_buffer))
        raise LXOverflowError(k.name, 0, need, 0, cfg.lx_budget_bytes)
    while math.prod(math.ceil(extent[d] / tile[d]) for d in rows) < PIPELINE_TILES:
        shrinkable = [d for d in rows if tile[d] > 1]
        if not shrinkable:
            break
        tile[shrinkable[0]] = math.ceil(tile[shrinkable[0]] / 2)
    return tile


def _load_streamed(p: CoreOps, k: RowTiling, resident: Mapping[str, int], te: Mapping[str, int], t: int, slot: int,
                   wait: list[int], sb: int) -> dict[str, int]:
    """Tile ``t``'s streamed inputs into their ``slot`` (the resident ones were loaded once): buffer -> its load."""
    loaded = dict(resident)
    for b in k.inputs:
        if b not in resident:
            loaded[b] = p.load(f"{b}[{slot}]", k.operands[b].tile_bytes(te, sb), deps=wait, name=f"load {b} t{t}",
                               share=k.shares.get(b, 1))
    return loaded


def emit_rows(k: RowTiling, extent: Mapping[str, int], tile: Mapping[str, int], cfg: SpyreConfig,
              double_buffer: bool, partner_info: PartnerInfo | None = None) -> CoreOps:
    """One core's program: per tile, load the streamed inputs, run every node on the SFU, store the outputs.

    ``partner_info`` = (rank, partner cores, this core) when a reduced dim is split across cores. Tiles walk
    the reduced dims innermost, so the chunks of a cut reduced dim follow each other: the first claims the
    output tile, the rest accumulate into it, and the last combines with the partners and stores.
    """
    shares = k.shares
    p = CoreOps()
    sb = cfg.stick_bytes
    inner = list(k.dims)[-1]
    ops = _row_tile_ops(k)
    resident = k.resident()
    res_op = {b: p.load(b, k.operands[b].tile_bytes(tile, sb), name=f"load {b} (once)", share=shares.get(b, 1))
              for b in resident}
    tile_done: list[int] = []
    order = [d for d in extent if d not in k.reduced] + [d for d in extent if d in k.reduced]
    per_out = k.reduction_chunks(extent, tile)
    spilled = k.spilled() if per_out == 1 and partner_info is None else frozenset()
    readers = {b: sum(b in n.inputs for n in k.nodes) for b in k.inputs}
    acc_owner = acc_last = -1
    for t, te in enumerate(tile_grid({d: extent[d] for d in order}, {d: tile[d] for d in order})):
        chunk, final = t % per_out, t % per_out == per_out - 1
        slot, wait = slot_wait(tile_done, double_buffer)
        produced = _load_streamed(p, k, res_op, te, t, slot, wait, sb)
        owner = dict(produced)
        last = None
        stored: dict[str, int] = {}     # spilled intermediate -> its store
        read: set[str] = set()          # streamed inputs some node has read this tile
        for n, out, in_place in ops:
            for b in dict.fromkeys(n.inputs):
                again = (not k.lx_clone_inputs and b in read and readers.get(b, 0) > 1 and b not in res_op)
                if b in stored or again:  # through DRAM: read back what was stored, or the input once more
                    produced[b] = owner[b] = p.load(f"{b}:reload[0]", k.operands[b].tile_bytes(te, sb),
                                                    deps=[stored[b]] if b in stored else wait,
                                                    name=f"reload {b} t{t}", share=1 if b in stored else
                                                    shares.get(b, 1))
                if b in readers:
                    read.add(b)
            ax = {d: (pad_to_sticks(te[d], sb // k.operands[out].itemsize) if d == inner else te[d])
                  for d in k.dims}
            elements = math.prod(ax[d] for d in k.dims if d in _node_dims(n, k))
            deps = sorted({produced[b] for b in n.inputs if b in produced} | {owner[b] for b in n.inputs if b in owner})
            emit = p.special if isinstance(n, Pointwise) and n.transcendental else p.vector
            size = k.operands[out].tile_bytes(te, sb)
            if in_place:
                op = emit(None, elements, deps=deps, out_bytes=0, name=f"{n.op} t{t} (in place)")
                owner[out] = owner[n.inputs[0]]
            elif chunk > 0:  # a later chunk of a cut reduced dim: fold into the output tile
                op = acc_last = emit(None, elements, deps=[*deps, acc_owner, acc_last], out_bytes=0,
                                     name=f"{n.op} t{t} (accumulate)")
                owner[out] = acc_owner
            else:
                op = emit(f"{out}[{slot if out in k.outputs else 0}]", elements, deps=deps, out_bytes=size,
                          name=f"{n.op} t{t}")
                owner[out] = acc_owner = acc_last = op
            produced[out] = op
            last = op
            if out in spilled:
                stored[out] = last = p.store(size, deps=sorted({op, owner[out]}), name=f"spill {out} t{t}")
            if not final:
                continue
            if partner_info is not None and isinstance(n, Reduction):
                last = produced[out] = chain_reduce(p, partner_info, size, size // k.operands[out].itemsize,
                                                    owner[out], op, f"{k.name}:{out}:t{t}", cfg.cores,
                                                    COMBINE_OP.get(n.op, "add"))
        stores = []
        for b in k.outputs if final else ():
            src = b if b in produced else (k.inputs[0] if k.copy_only else None)
            if src is None or (partner_info is not None and partner_info[0] != 0):
                continue
            stores.append(p.store(k.operands[b].tile_bytes(te, sb), deps=sorted({produced[src], owner[src]}),
                                  name=f"store {b} t{t}"))
        tile_done.append(stores[-1] if stores else (last if last is not None else len(p) - 1))
    return p


def _node_dims(n: IRNode, k: RowTiling) -> set[str]:
    return set(renamed(n, list(k.dims)).values())
