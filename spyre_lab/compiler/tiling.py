"""Per-core tile programs: how each core walks its slice of a kernel, tile by tile.

Every emitter here turns one core's slice into a :class:`~spyre_lab.device.isa.CoreProgram` and
lists the LX buffers one steady-state tile period needs (:class:`~spyre_lab.compiler.scratchpad.LXBuffer`),
so the scratchpad planner can place them and the tile sizes can shrink until they fit.

Conventions shared by all emitters:

* **Double buffering** is written into the dependencies: the loads of tile ``t`` wait for tile
  ``t - 2`` to finish (``t - 1`` when ``double_buffer`` is off), so a load can overlap the compute of
  the tile before it and LX never holds more than two copies of a streamed buffer.
* **Accumulate and in-place ops** write into a buffer another op owns: they have no ``out`` and every
  later reader depends on the owner too, which keeps the owner's LX claim alive (the simulator frees
  a buffer when all ops depending on its producer are done).
* **Bytes** are whole sticks: each operand tile is padded along its tensor's last dim (its stick dim)
  to a multiple of ``elems_per_stick``. A keepdim reduction's output (``[..., 1]``) therefore moves one
  stick per value: the sparse "1 value per stick" output of a reduction along the stick dim.
* Partial results of a split reduction dim (matmul K, or a reduced dim of a lone reduction) go down a
  chain over the ring: partner ``r`` receives from ``r + 1``, combines, and forwards to ``r - 1``;
  partner 0 finishes the tile and stores it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spyre_lab.compiler.ir import IRNode, Pointwise, Reduction
from spyre_lab.compiler.scratchpad import LXBuffer
from spyre_lab.compiler.work_division import ring_hops
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreProgram, LXOverflowError

ACC_BYTES = 4
"""Matmul partial sums accumulate (and travel the ring) in fp32."""

Fits = Callable[[list[LXBuffer]], bool]
"""Does a list of steady-state buffers fit LX? (codegen runs the scratchpad planner to answer)"""

IN_PLACE_OPS = frozenset({"exp", "sub", "add", "rsqrt"})
"""Pointwise ops torch-spyre lets write into their first input's LX slot."""

PIPELINE_TILES = 4
"""Row tiles a core's slice is cut into at least (when it has the rows): load, compute and store overlap."""

COMBINE_OP = {"sum": "add", "mean": "add", "amax": "max", "max": "max", "amin": "min", "min": "min",
              "matmul": "add"}
"""How partners combine partial results of a split reduction."""


@dataclass(frozen=True)
class Operand:
    """A buffer as one kernel sees it: which iteration dim each tensor dim runs along (None = broadcast)."""

    buffer: str
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    itemsize: int

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


def chain_reduce(p: CoreProgram, rank: int, partners: Sequence[int], core: int, nbytes: int, elements: int,
                 owner: int, last: int, tag: str, cores: int, combine: str) -> int:
    """Reduce a partial result down the partner chain; returns the op after which partner ``rank`` is done.

    Partner ``rank`` receives partner ``rank + 1``'s partial, combines it into its own (in place, into
    the buffer ``owner`` holds), then sends the result to ``rank - 1``. Partner 0 ends with the total.
    """
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


# --- pointwise / reduction / softmax / restickify: row tiles ---------------------------------------

@dataclass
class RowKernel:
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

    def resident(self) -> list[str]:
        """Inputs with no row dims (a bias row, a scalar): loaded once per core and kept in LX."""
        if not self.inner_whole:
            return []
        return [b for b in self.inputs if not (self.operands[b].dims - set(self.col_dims))]


def _row_tile_ops(k: RowKernel) -> list[tuple[IRNode, str, bool]]:
    """(node, out buffer, in place?) in order; in place when the op allows it and its first input dies here."""
    last_use: dict[str, int] = {}
    for i, n in enumerate(k.nodes):
        for b in n.inputs:
            last_use[b] = i
    plan = []
    resident = set(k.resident())
    for i, n in enumerate(k.nodes):
        first = n.inputs[0] if n.inputs else None
        in_place = (isinstance(n, Pointwise) and n.op in IN_PLACE_OPS and first is not None
                    and last_use.get(first) == i and first not in k.outputs and first not in resident
                    and k.operands[first].shape == k.operands[n.output].shape
                    and k.operands[first].itemsize == k.operands[n.output].itemsize)
        plan.append((n, n.output, in_place))
    return plan


def row_lx_buffers(k: RowKernel, tile: Mapping[str, int], cfg: SpyreConfig, double_buffer: bool) -> list[LXBuffer]:
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


def row_tile_shape(k: RowKernel, extent: Mapping[str, int], cfg: SpyreConfig, double_buffer: bool,
                   fits: Fits) -> dict[str, int]:
    """The biggest tile of a core's slice that ``fits`` LX: whole col dims, rows halved from the outermost
    row dim inwards; a pointwise kernel may finally cut its innermost dim into fewer sticks. A slice with
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
        need = sum(b.size for b in row_lx_buffers(k, tile, cfg, double_buffer))
        raise LXOverflowError(k.name, 0, need, 0, cfg.lx_budget_bytes)
    while math.prod(math.ceil(extent[d] / tile[d]) for d in rows) < PIPELINE_TILES:
        shrinkable = [d for d in rows if tile[d] > 1]
        if not shrinkable:
            break
        tile[shrinkable[0]] = math.ceil(tile[shrinkable[0]] / 2)
    return tile


def emit_rows(k: RowKernel, extent: Mapping[str, int], tile: Mapping[str, int], cfg: SpyreConfig,
              double_buffer: bool, partner_info: tuple[int, list[int], int] | None = None) -> CoreProgram:
    """One core's program: per tile, load the streamed inputs, run every node on the SFU, store the outputs.

    ``partner_info`` = (rank, partner cores, this core) when a reduced dim is split across cores.
    """
    p = CoreProgram()
    sb = cfg.stick_bytes
    inner = list(k.dims)[-1]
    ops = _row_tile_ops(k)
    resident = k.resident()
    res_op = {b: p.load(b, k.operands[b].tile_bytes(tile, sb), name=f"load {b} (once)") for b in resident}
    tile_done: list[int] = []
    gap = 2 if double_buffer else 1
    for t, te in enumerate(tile_grid(extent, tile)):
        slot = t % 2 if double_buffer else 0
        wait = [tile_done[t - gap]] if t >= gap else []
        produced: dict[str, int] = dict(res_op)
        owner: dict[str, int] = dict(res_op)
        for b in k.inputs:
            if b not in res_op:
                op = p.load(f"{b}[{slot}]", k.operands[b].tile_bytes(te, sb), deps=wait, name=f"load {b} t{t}")
                produced[b] = owner[b] = op
        last = None
        for n, out, in_place in ops:
            ax = {d: (pad_to_sticks(te[d], sb // k.operands[out].itemsize) if d == inner else te[d])
                  for d in k.dims}
            elements = math.prod(ax[d] for d in k.dims if d in _node_dims(n, k))
            deps = sorted({produced[b] for b in n.inputs if b in produced} | {owner[b] for b in n.inputs if b in owner})
            emit = p.special if isinstance(n, Pointwise) and n.transcendental else p.vector
            size = k.operands[out].tile_bytes(te, sb)
            if in_place:
                op = emit(None, elements, deps=deps, out_bytes=0, name=f"{n.op} t{t} (in place)")
                owner[out] = owner[n.inputs[0]]
            else:
                op = emit(f"{out}[{slot if out in k.outputs else 0}]", elements, deps=deps, out_bytes=size,
                          name=f"{n.op} t{t}")
                owner[out] = op
            produced[out] = op
            last = op
            if partner_info is not None and isinstance(n, Reduction):
                rank, partners, core = partner_info
                last = produced[out] = chain_reduce(p, rank, partners, core, size, size // k.operands[out].itemsize,
                                                    owner[out], op, f"{k.name}:{out}:t{t}", cfg.cores,
                                                    COMBINE_OP.get(n.op, "add"))
        stores = []
        for b in k.outputs:
            src = b if b in produced else (k.inputs[0] if k.copy_only else None)
            if src is None or (partner_info is not None and partner_info[0] != 0):
                continue
            stores.append(p.store(k.operands[b].tile_bytes(te, sb), deps=sorted({produced[src], owner[src]}),
                                  name=f"store {b} t{t}"))
        tile_done.append(stores[-1] if stores else (last if last is not None else len(p) - 1))
    return p


def _node_dims(n: IRNode, k: RowKernel) -> set[str]:
    return set(renamed(n, list(k.dims)).values())


# --- matmul (+ epilogue) ----------------------------------------------------------------------------

@dataclass
class MatmulKernel:
    """A matmul ``C = A @ B`` with optional pointwise epilogue nodes applied to C's tile in LX."""

    name: str
    a: str
    b: str
    mm_out: str
    a_item: int
    b_item: int
    epilogue: list[IRNode]
    operands: dict[str, Operand]        # epilogue inputs and outputs, axes in "B"/"M"/"N"
    outputs: list[str]                  # buffers stored to DRAM


def _epilogue_inputs(mk: MatmulKernel) -> list[str]:
    produced = {mk.mm_out} | {n.output for n in mk.epilogue}
    seen: list[str] = []
    for n in mk.epilogue:
        seen.extend(b for b in n.inputs if b not in produced and b not in seen)
    return seen


def _epilogue_in_place(mk: MatmulKernel, n: IRNode) -> bool:
    """May epilogue node ``n`` write into its first input's tile? (the accumulator or an earlier epilogue
    result of the same shape, which nothing after ``n`` reads and which is not stored)"""
    if n.op not in IN_PLACE_OPS or not n.inputs:
        return False
    first = n.inputs[0]
    later = mk.epilogue[mk.epilogue.index(n) + 1:]
    return (first in ({mk.mm_out} | {e.output for e in mk.epilogue}) and first not in mk.outputs
            and not any(first in e.inputs for e in later)
            and mk.operands[first].shape == mk.operands[n.output].shape)


def matmul_lx_buffers(mk: MatmulKernel, tm: int, tn: int, tk: int, cfg: SpyreConfig, double_buffer: bool,
                      k_split: bool) -> list[LXBuffer]:
    """Everything one core holds in a steady-state output tile (all live together)."""
    copies = 2 if double_buffer else 1
    ext = {"B": 1, "M": tm, "N": tn}
    bufs = [LXBuffer(f"{mk.a}[{c}]", tm * tk * mk.a_item, 0, 1) for c in range(copies)]
    bufs += [LXBuffer(f"{mk.b}[{c}]", tk * tn * mk.b_item, 0, 1) for c in range(copies)]
    bufs += [LXBuffer(f"acc[{c}]", tm * tn * ACC_BYTES, 0, 1) for c in range(2)]
    if k_split:
        bufs.append(LXBuffer("psum_in", tm * tn * ACC_BYTES, 0, 1))
    for b in _epilogue_inputs(mk):
        bufs += [LXBuffer(f"{b}[{c}]", mk.operands[b].tile_bytes(ext, cfg.stick_bytes), 0, 1) for c in range(copies)]
    for n in mk.epilogue:
        if not _epilogue_in_place(mk, n):
            bufs += [LXBuffer(f"{n.output}[{c}]", mk.operands[n.output].tile_bytes(ext, cfg.stick_bytes), 0, 1)
                     for c in range(2)]
    return bufs


def _halvings(n: int, quantum: int, floor: int) -> list[int]:
    """``n`` (a multiple of ``quantum``), halved repeatedly in multiples of ``quantum`` down to ``floor``."""
    out, v = [], n
    while True:
        out.append(v)
        nxt = max(quantum, math.ceil(v / 2 / quantum) * quantum)
        if nxt >= v or nxt < floor:
            return out
        v = nxt


def choose_matmul_tiles(mk: MatmulKernel, mc: int, nc: int, kc: int, cfg: SpyreConfig, double_buffer: bool,
                        k_split: bool, fits: Fits) -> tuple[int, int, int]:
    """Tile sizes (tm rows, tn, tk in whole sticks) for one core's ``mc x nc x kc`` slice.

    Candidates halve each dim (keeping >= 8 rows per PT pass when the slice has them) and are ranked by
    the DRAM bytes the core then loads (A is reloaded for every N tile unless a tile spans all of K, B for
    every M tile), then by how far they fall short of ``PIPELINE_TILES`` steps (loads overlap the PT only
    across steps), then by op count; the first whose LX plan ``fits`` wins.
    """
    eps_a, eps_b = cfg.stick_bytes // mk.a_item, cfg.stick_bytes // mk.b_item
    n_pad, k_pad = pad_to_sticks(nc, eps_b), pad_to_sticks(kc, eps_a)
    ranked = []
    for tm in _halvings(mc, 1, min(8, mc)):
        for tn in _halvings(n_pad, eps_b, eps_b):
            for tk in _halvings(k_pad, eps_a, eps_a):
                mt, nt, kt = math.ceil(mc / tm), math.ceil(n_pad / tn), math.ceil(k_pad / tk)
                a_loads = mc * k_pad * mk.a_item * (1 if kt == 1 else nt)
                b_loads = k_pad * n_pad * mk.b_item * mt
                steps = mt * nt * kt
                ranked.append((a_loads + b_loads, max(0, PIPELINE_TILES - steps), steps, tm, tn, tk))
    ranked.sort()
    for *_, tm, tn, tk in ranked:
        if fits(matmul_lx_buffers(mk, tm, tn, tk, cfg, double_buffer, k_split)):
            return tm, tn, tk
    smallest = (min(8, mc), eps_b, eps_a)
    need = sum(b.size for b in matmul_lx_buffers(mk, *smallest, cfg, double_buffer, k_split))
    raise LXOverflowError(mk.name, 0, need, 0, cfg.lx_budget_bytes)


def emit_matmul(mk: MatmulKernel, bc: int, mc: int, nc: int, kc: int, tiles: tuple[int, int, int],
                cfg: SpyreConfig, double_buffer: bool, partner_info: tuple[int, list[int], int] | None) -> CoreProgram:
    """One core's matmul: per output tile, stream A and B tiles through the PT, accumulating in LX (fp32);
    reduce K partials over the ring; run the epilogue on the finished tile; store."""
    p = CoreProgram()
    sb = cfg.stick_bytes
    tm, tn, tk = tiles
    eps_a, eps_b = sb // mk.a_item, sb // mk.b_item
    k_pad = pad_to_sticks(kc, eps_a)
    m_tiles = [min(tm, mc - i) for i in range(0, mc, tm)]
    n_tiles = [min(tn, pad_to_sticks(nc, eps_b) - j) for j in range(0, pad_to_sticks(nc, eps_b), tn)]
    k_tiles = [min(tk, k_pad - j) for j in range(0, k_pad, tk)]
    a_stationary = len(k_tiles) == 1
    gap = 2 if double_buffer else 1
    steps: list[int] = []          # the matmul op of every K step, in order (for the load slots)
    tile_done: list[int] = []      # last op of every output tile (for the accumulator slots)
    a_users: list[int] = []        # the last matmul that read each stationary A tile
    rank = partner_info[0] if partner_info else 0
    ext_in = _epilogue_inputs(mk)
    for bi in range(bc):
        for mi, rm in enumerate(m_tiles):
            a_op = None
            if a_stationary:
                wait = [a_users[-gap]] if len(a_users) >= gap else []
                a_op = p.load(f"{mk.a}[{len(a_users) % 2 if double_buffer else 0}]", rm * k_pad * mk.a_item,
                              deps=wait, name=f"load {mk.a} b{bi} m{mi}")
            for ni, rn in enumerate(n_tiles):
                t = len(tile_done)
                acc_slot = f"acc[{t % 2}]"
                acc_wait = [tile_done[t - 2]] if t >= 2 else []
                owner = prev = None
                for ki, rk in enumerate(k_tiles):
                    s = len(steps)
                    slot = s % 2 if double_buffer else 0
                    wait = [steps[s - gap]] if s >= gap else []
                    loads = [] if a_stationary else [p.load(f"{mk.a}[{slot}]", rm * rk * mk.a_item, deps=wait,
                                                           name=f"load {mk.a} b{bi} m{mi} k{ki}")]
                    loads.append(p.load(f"{mk.b}[{slot}]", rk * rn * mk.b_item, deps=wait,
                                        name=f"load {mk.b} b{bi} n{ni} k{ki}"))
                    deps = loads + ([a_op] if a_op is not None else [])
                    if owner is None:
                        owner = prev = p.matmul(acc_slot, rm, rn, rk, deps=deps + acc_wait,
                                                out_bytes=rm * rn * ACC_BYTES, name=f"matmul b{bi} m{mi} n{ni} k{ki}")
                    else:
                        prev = p.matmul(None, rm, rn, rk, deps=[*deps, owner, prev], out_bytes=0,
                                        name=f"matmul b{bi} m{mi} n{ni} k{ki} (accumulate)")
                    steps.append(prev)
                if a_stationary and ni == len(n_tiles) - 1:
                    a_users.append(prev)
                last = prev
                if partner_info is not None:
                    _, partners, core = partner_info
                    last = chain_reduce(p, rank, partners, core, rm * rn * ACC_BYTES, rm * rn, owner, prev,
                                        f"{mk.name}:psum:b{bi}m{mi}n{ni}", cfg.cores, "add")
                if rank != 0:
                    tile_done.append(last)
                    continue
                produced, owners = {mk.mm_out: last}, {mk.mm_out: owner}
                ext = {"B": 1, "M": rm, "N": rn}
                for b in ext_in:
                    op = p.load(f"{b}[{t % 2}]", mk.operands[b].tile_bytes(ext, sb), deps=[owner],
                                name=f"load {b} b{bi} m{mi} n{ni}")
                    produced[b] = owners[b] = op
                for n in mk.epilogue:
                    deps = sorted({produced[b] for b in n.inputs} | {owners[b] for b in n.inputs})
                    emit = p.special if isinstance(n, Pointwise) and n.transcendental else p.vector
                    if _epilogue_in_place(mk, n):
                        op = emit(None, rm * rn, deps=deps, out_bytes=0, name=f"{n.op} m{mi} n{ni} (in place)")
                        owners[n.output] = owners[n.inputs[0]]
                    else:
                        op = emit(f"{n.output}[{t % 2}]", rm * rn, deps=deps,
                                  out_bytes=mk.operands[n.output].tile_bytes(ext, sb), name=f"{n.op} m{mi} n{ni}")
                        owners[n.output] = op
                    produced[n.output] = op
                    last = op
                for b in mk.outputs:
                    nbytes = mk.operands[b].tile_bytes(ext, sb)
                    last = p.store(nbytes, deps=sorted({produced[b], owners[b]}), name=f"store {b} b{bi} m{mi} n{ni}")
                tile_done.append(last)
    return p


# --- fused MLP ----------------------------------------------------------------------------------------

@dataclass
class MlpKernel:
    """``gate = x @ Wg``, ``up = x @ Wu``, pointwise nodes (SiLU, mul) -> ``h``, optionally ``out = h @ Wd``.

    Each core owns a slice of the intermediate dim I (and of the rows): only x, the weights and the final
    output touch DRAM; gate, up and h live in LX. With a down projection, the I-slices are partial sums
    of the output, reduced over the ring between I-partners.
    """

    name: str
    x: str
    w_gate: str
    w_up: str
    w_down: str | None
    gate_out: str
    up_out: str
    pointwise: list[IRNode]
    h: str
    out: str
    x_item: int
    w_item: int
    operands: dict[str, Operand]       # pointwise outputs and the final output, axes "M"/"N"
    hidden: int                        # H (gate/up K)
    out_cols: int                      # down N (0 without down)


def mlp_lx_buffers(mk: MlpKernel, tm: int, ti: int, th: int, to: int, cfg: SpyreConfig, double_buffer: bool,
                   reduce: bool, whole_slice: bool) -> list[LXBuffer]:
    """Steady-state buffers of one row tile (all live together).

    ``whole_slice``: one I tile covers the core's whole I-slice, so x streams in K chunks beside the weights
    and the down projection finishes one output-column chunk at a time (reduce, store, next chunk).
    Otherwise x stays resident for the row tile and the output accumulates over I chunks in a full-width
    fp32 tile.
    """
    copies = 2 if double_buffer else 1
    sb = cfg.stick_bytes
    h_pad = pad_to_sticks(mk.hidden, sb // mk.x_item)
    ext = {"B": 1, "M": tm, "N": ti}
    x_cols = th if whole_slice else h_pad
    bufs = [LXBuffer(f"{mk.x}[{c}]", tm * x_cols * mk.x_item, 0, 1) for c in range(copies)]
    for w in (mk.w_gate, mk.w_up):
        bufs += [LXBuffer(f"{w}[{c}]", th * ti * mk.w_item, 0, 1) for c in range(copies)]
    bufs += [LXBuffer(mk.gate_out, tm * ti * ACC_BYTES, 0, 1), LXBuffer(mk.up_out, tm * ti * ACC_BYTES, 0, 1)]
    bufs += [LXBuffer(n.output, mk.operands[n.output].tile_bytes(ext, sb), 0, 1) for n in mk.pointwise]
    if mk.w_down is None:
        bufs.append(LXBuffer(f"{mk.h}[1]", mk.operands[mk.h].tile_bytes(ext, sb), 0, 1))
        return bufs
    out_cols = to if whole_slice else pad_to_sticks(mk.out_cols, sb // mk.w_item)
    bufs += [LXBuffer(f"{mk.w_down}[{c}]", ti * to * mk.w_item, 0, 1) for c in range(copies)]
    bufs += [LXBuffer(f"out_acc[{c}]", tm * out_cols * ACC_BYTES, 0, 1) for c in range(2)]
    if reduce:
        bufs.append(LXBuffer("psum_in", tm * out_cols * ACC_BYTES, 0, 1))
    return bufs


def choose_mlp_tiles(mk: MlpKernel, mc: int, ic: int, cfg: SpyreConfig, double_buffer: bool, reduce: bool,
                     fits: Fits) -> tuple[int, int, int, int]:
    """(tm, ti, th, to): the weights are re-read once per row tile, so the fewest row tiles win, then fewer ops."""
    eps = cfg.stick_bytes // mk.w_item
    i_pad, h_pad = pad_to_sticks(ic, eps), pad_to_sticks(mk.hidden, eps)
    o_pad = pad_to_sticks(mk.out_cols, eps) if mk.w_down else eps
    ranked = []
    for tm in _halvings(mc, 1, 1):
        for ti in _halvings(i_pad, eps, eps):
            for th in _halvings(h_pad, eps, eps):
                for to in _halvings(o_pad, eps, eps):
                    it, ht, ot = math.ceil(i_pad / ti), math.ceil(h_pad / th), math.ceil(o_pad / to)
                    ops = math.ceil(mc / tm) * it * (ht * 4 + (ot * 2 if mk.w_down else 1))
                    ranked.append((math.ceil(mc / tm), ops, tm, ti, th, to))
    ranked.sort()
    for *_, tm, ti, th, to in ranked:
        if fits(mlp_lx_buffers(mk, tm, ti, th, to, cfg, double_buffer, reduce, ti >= i_pad)):
            return tm, ti, th, to
    need = sum(b.size for b in mlp_lx_buffers(mk, 1, eps, eps, eps, cfg, double_buffer, reduce, eps >= i_pad))
    raise LXOverflowError(mk.name, 0, need, 0, cfg.lx_budget_bytes)


def emit_mlp(mk: MlpKernel, mc: int, ic: int, tiles: tuple[int, int, int, int], cfg: SpyreConfig,
             double_buffer: bool, partner_info: tuple[int, list[int], int] | None) -> CoreProgram:
    """One core's fused MLP, row tile by row tile.

    The gate and up matmuls of a K chunk share one x tile; SiLU and mul run on the SFU in LX; the down
    matmul consumes the product straight from LX. When one I tile covers the core's I-slice, x streams
    with the weights and the output is finished (ring-reduced between I-partners, stored) one column
    chunk at a time; otherwise x stays resident and the output accumulates over I chunks.
    """
    p = CoreProgram()
    sb = cfg.stick_bytes
    tm, ti, th, to = tiles
    eps = sb // mk.w_item
    h_pad = pad_to_sticks(mk.hidden, sb // mk.x_item)
    o_pad = pad_to_sticks(mk.out_cols, eps)
    i_pad = pad_to_sticks(ic, eps)
    whole_slice = ti >= i_pad
    i_tiles = [min(ti, i_pad - j) for j in range(0, i_pad, ti)]
    h_tiles = [min(th, h_pad - j) for j in range(0, h_pad, th)]
    o_tiles = [min(to, o_pad - j) for j in range(0, o_pad, to)]
    gap = 2 if double_buffer else 1
    steps: list[int] = []          # last op of every weight step (for the double-buffer slots)
    row_done: list[int] = []
    out_done: list[int] = []       # last op of every finished output tile (for the out_acc slots)
    rank = partner_info[0] if partner_info else 0

    def slot_wait(history: list[int]) -> tuple[int, list[int]]:
        s = len(history)
        return (s % 2 if double_buffer else 0), ([history[s - gap]] if s >= gap else [])

    def finish_output(acc: int, last: int, rm: int, cols: int, label: str) -> int:
        if partner_info is not None:
            _, partners, core = partner_info
            last = chain_reduce(p, rank, partners, core, rm * cols * ACC_BYTES, rm * cols, acc, last,
                                f"{mk.name}:psum:{label}", cfg.cores, "add")
        if rank == 0:
            nbytes = rm * cols * mk.operands[mk.out].itemsize
            last = p.store(nbytes, deps=sorted({last, acc}), name=f"store {mk.out} {label}")
        out_done.append(last)
        return last

    for mi, row0 in enumerate(range(0, mc, tm)):
        rm = min(tm, mc - row0)
        x_op = None
        if not whole_slice:
            wait = [row_done[mi - gap]] if mi >= gap else []
            x_op = p.load(f"{mk.x}[{mi % 2 if double_buffer else 0}]", rm * h_pad * mk.x_item, deps=wait,
                          name=f"load {mk.x} m{mi}")
        acc = acc_prev = None
        last = -1
        for ii, ri in enumerate(i_tiles):
            g = u = g_prev = u_prev = None
            for hi, rh in enumerate(h_tiles):
                slot, w_wait = slot_wait(steps)
                nbytes = rh * ri * mk.w_item
                xk = x_op
                if whole_slice:
                    xk = p.load(f"{mk.x}[{slot}]", rm * rh * mk.x_item, deps=w_wait, name=f"load {mk.x} m{mi} h{hi}")
                lg = p.load(f"{mk.w_gate}[{slot}]", nbytes, deps=w_wait, name=f"load {mk.w_gate} i{ii} h{hi}")
                lu = p.load(f"{mk.w_up}[{slot}]", nbytes, deps=w_wait, name=f"load {mk.w_up} i{ii} h{hi}")
                if g is None:
                    g = g_prev = p.matmul(mk.gate_out, rm, ri, rh, deps=[xk, lg], out_bytes=rm * ri * ACC_BYTES,
                                          name=f"gate m{mi} i{ii} h{hi}")
                    u = u_prev = p.matmul(mk.up_out, rm, ri, rh, deps=[xk, lu], out_bytes=rm * ri * ACC_BYTES,
                                          name=f"up m{mi} i{ii} h{hi}")
                else:
                    g_prev = p.matmul(None, rm, ri, rh, deps=[xk, lg, g, g_prev], out_bytes=0,
                                      name=f"gate m{mi} i{ii} h{hi} (accumulate)")
                    u_prev = p.matmul(None, rm, ri, rh, deps=[xk, lu, u, u_prev], out_bytes=0,
                                      name=f"up m{mi} i{ii} h{hi} (accumulate)")
                steps.append(u_prev)
            produced = {mk.gate_out: g_prev, mk.up_out: u_prev}
            owners = {mk.gate_out: g, mk.up_out: u}
            ext = {"B": 1, "M": rm, "N": ri}
            for n in mk.pointwise:
                deps = sorted({produced[b] for b in n.inputs if b in produced} |
                              {owners[b] for b in n.inputs if b in owners})
                emit = p.special if isinstance(n, Pointwise) and n.transcendental else p.vector
                op = emit(n.output, rm * ri, deps=deps, out_bytes=mk.operands[n.output].tile_bytes(ext, sb),
                          name=f"{n.op} m{mi} i{ii}")
                produced[n.output] = owners[n.output] = op
            if mk.w_down is None:
                last = p.store(mk.operands[mk.h].tile_bytes(ext, sb), deps=[produced[mk.h]],
                               name=f"store {mk.h} m{mi} i{ii}")
                continue
            for oi, ro in enumerate(o_tiles):
                slot, w_wait = slot_wait(steps)
                ld = p.load(f"{mk.w_down}[{slot}]", ri * ro * mk.w_item, deps=w_wait,
                            name=f"load {mk.w_down} i{ii} o{oi}")
                if whole_slice:
                    t = len(out_done)
                    acc_wait = [out_done[t - 2]] if t >= 2 else []
                    acc = p.matmul(f"out_acc[{t % 2}]", rm, ro, ri, deps=[ld, produced[mk.h], *acc_wait],
                                   out_bytes=rm * ro * ACC_BYTES, name=f"down m{mi} o{oi}")
                    steps.append(acc)
                    last = finish_output(acc, acc, rm, ro, f"m{mi}o{oi}")
                    continue
                if acc is None:
                    acc = acc_prev = p.matmul(f"out_acc[{mi % 2}]", rm, ro, ri, deps=[ld, produced[mk.h]],
                                              out_bytes=rm * o_pad * ACC_BYTES, name=f"down m{mi} i{ii} o{oi}")
                else:
                    acc_prev = p.matmul(None, rm, ro, ri, deps=[ld, produced[mk.h], acc, acc_prev],
                                        out_bytes=0, name=f"down m{mi} i{ii} o{oi} (accumulate)")
                steps.append(acc_prev)
                last = acc_prev
        if mk.w_down is not None and not whole_slice and acc is not None and acc_prev is not None:
            last = finish_output(acc, acc_prev, rm, o_pad, f"m{mi}")
        row_done.append(last)
    return p
