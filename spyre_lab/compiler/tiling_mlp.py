"""Fused MLP tile programs: gate, up, SiLU, mul (and the down projection) without leaving LX.

Each core owns a slice of the intermediate dim I (and of the rows). Per row tile, the gate and up
matmuls of a K chunk share one x tile; SiLU and mul run on the SFU in LX; the down matmul consumes the
product straight from LX. Only x, the weights and the final output touch DRAM. Weight tiles are DRAM
broadcasts to the cores that split rows, x tiles to the cores that split I.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from spyre_lab.compiler.ir import IRNode, Pointwise
from spyre_lab.compiler.scratchpad import LXBuffer
from spyre_lab.compiler.tiling_common import (
    ACC_BYTES,
    Fits,
    Operand,
    PartnerInfo,
    chain_reduce,
    chunks,
    halvings,
    pad_to_sticks,
    slot_wait,
)
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, LXOverflowError, OpKind, TileOp

_LOAD, _MATMUL, _VECTOR, _SPECIAL = OpKind.LOAD, OpKind.MATMUL, OpKind.VECTOR, OpKind.SPECIAL


@dataclass
class MlpTiling:
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
    shares: dict[str, int] = field(default_factory=dict)  # buffer -> cores loading its tiles at once


def mlp_lx_buffers(mk: MlpTiling, tm: int, ti: int, th: int, to: int, cfg: SpyreConfig, double_buffer: bool,
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


def choose_mlp_tiles(mk: MlpTiling, mc: int, ic: int, cfg: SpyreConfig, double_buffer: bool, reduce: bool,
                     fits: Fits, memo: dict[tuple, bool] | None = None) -> tuple[int, int, int, int]:
    """(tm, ti, th, to): the weights are re-read once per row tile, so the fewest row tiles win, then fewer ops.

    A row count is tried only if its smallest tiles fit LX (streaming the whole I-slice, or one stick of it).
    ``memo`` remembers which tile shapes fit, across calls for the same kernel (work division asks for
    many slice sizes whose candidate tiles mostly coincide).
    """
    eps = cfg.stick_bytes // mk.w_item
    i_pad, h_pad = pad_to_sticks(ic, eps), pad_to_sticks(mk.hidden, eps)
    o_pad = pad_to_sticks(mk.out_cols, eps) if mk.w_down else eps
    known = memo if memo is not None else {}

    def buffers(tm: int, ti: int, th: int, to: int) -> list[LXBuffer]:
        return mlp_lx_buffers(mk, tm, ti, th, to, cfg, double_buffer, reduce, ti >= i_pad)

    def fit(tm: int, ti: int, th: int, to: int) -> bool:
        key = (tm, ti, th, to, reduce, ti >= i_pad)
        if key not in known:
            known[key] = fits(buffers(tm, ti, th, to))
        return known[key]

    for tm in halvings(mc, 1, 1):
        if not any(fit(tm, ti, eps, eps) for ti in {eps, i_pad}):
            continue
        ranked = []
        for ti in halvings(i_pad, eps, eps):
            for th in halvings(h_pad, eps, eps):
                for to in halvings(o_pad, eps, eps):
                    it, ht, ot = math.ceil(i_pad / ti), math.ceil(h_pad / th), math.ceil(o_pad / to)
                    ranked.append((it * (ht * 4 + (ot * 2 if mk.w_down else 1)), ti, th, to))
        ranked.sort()
        return next((tm, ti, th, to) for _, ti, th, to in ranked if fit(tm, ti, th, to))
    need = sum(b.size for b in buffers(1, eps, eps, eps))
    raise LXOverflowError(mk.name, 0, need, 0, cfg.lx_budget_bytes)


def emit_mlp(mk: MlpTiling, mc: int, ic: int, tiles: tuple[int, int, int, int], cfg: SpyreConfig,
             double_buffer: bool, partner_info: PartnerInfo | None) -> CoreOps:
    """One core's fused MLP, row tile by row tile.

    The gate and up matmuls of a K chunk share one x tile; SiLU and mul run on the SFU in LX; the down
    matmul consumes the product straight from LX. When one I tile covers the core's I-slice, x streams
    with the weights and the output is finished (ring-reduced between I-partners, stored) one column
    chunk at a time; otherwise x stays resident and the output accumulates over I chunks.
    """
    emitter = _MlpEmitter(mk, ic, tiles, cfg, double_buffer, partner_info)
    for mi, row0 in enumerate(range(0, mc, tiles[0])):
        emitter.row_tile(mi, min(tiles[0], mc - row0))
    return emitter.p


class _MlpEmitter:
    """What one core's MLP program threads from row tile to row tile: the ops that free each LX slot."""

    def __init__(self, mk: MlpTiling, ic: int, tiles: tuple[int, int, int, int], cfg: SpyreConfig,
                 double_buffer: bool, partner_info: PartnerInfo | None) -> None:
        self.p = CoreOps()
        self.mk, self.cfg, self.double_buffer, self.partner_info = mk, cfg, double_buffer, partner_info
        sb = self.sb = cfg.stick_bytes
        _, ti, th, to = tiles
        eps = sb // mk.w_item
        self.h_pad = pad_to_sticks(mk.hidden, sb // mk.x_item)
        self.o_pad = pad_to_sticks(mk.out_cols, eps)
        i_pad = pad_to_sticks(ic, eps)
        self.whole_slice = ti >= i_pad
        self.i_tiles, self.h_tiles, self.o_tiles = chunks(i_pad, ti), chunks(self.h_pad, th), chunks(self.o_pad, to)
        self.share_x, self.share_w = mk.shares.get(mk.x, 1), mk.shares.get(mk.w_gate, 1)
        self.gap = 2 if double_buffer else 1
        self.steps: list[int] = []      # last op of every weight step (for the double-buffer slots)
        self.row_done: list[int] = []
        self.out_done: list[int] = []   # last op of every finished output tile (for the out_acc slots)
        self.rank = partner_info[0] if partner_info else 0

    def row_tile(self, mi: int, rm: int) -> None:
        """Rows ``mi``: for each I chunk, gate and up, the pointwise ops, then the down projection."""
        mk, p = self.mk, self.p
        x_op = None
        if not self.whole_slice:
            wait = [self.row_done[mi - self.gap]] if mi >= self.gap else []
            x_op = p.load(f"{mk.x}[{mi % 2 if self.double_buffer else 0}]", rm * self.h_pad * mk.x_item, deps=wait,
                          name=f"load {mk.x} m{mi}", share=self.share_x)
        acc = acc_prev = None
        last = -1
        for ii, ri in enumerate(self.i_tiles):
            h_op = self.gate_up_pointwise(mi, ii, rm, ri, x_op)
            if mk.w_down is None:
                last = p.store(mk.operands[mk.h].tile_bytes({"B": 1, "M": rm, "N": ri}, self.sb), deps=[h_op],
                               name=f"store {mk.h} m{mi} i{ii}")
                continue
            acc, acc_prev, last = self.down(mi, ii, rm, ri, h_op, acc, acc_prev, last)
        if mk.w_down is not None and not self.whole_slice and acc is not None and acc_prev is not None:
            last = self.finish_output(acc, acc_prev, rm, self.o_pad, f"m{mi}")
        self.row_done.append(last)

    def add(self, op: TileOp) -> int:
        """Append an op this emitter built, returning its index. Its deps are earlier ops of this program and its
        buffers have sizes by construction, so the checks of ``CoreOps``' builders (``p.load``, ``p.matmul``),
        which cost a third of emitting a fused MLP's 60,000 ops, are not repeated for every op here."""
        ops = self.p.ops
        ops.append(op)
        return len(ops) - 1

    def gate_up_pointwise(self, mi: int, ii: int, rm: int, ri: int, x_op: int | None) -> int:
        """Gate and up over the K chunks (sharing each x tile), then SiLU and mul in LX; returns h's op."""
        mk, add = self.mk, self.add
        g = u = g_prev = u_prev = None
        acc_bytes = rm * ri * ACC_BYTES
        share_x, share_w = self.share_x, self.share_w
        for hi, rh in enumerate(self.h_tiles):
            slot, w_wait = slot_wait(self.steps, self.double_buffer)
            wait = tuple(w_wait)
            nbytes = rh * ri * mk.w_item
            xk = x_op
            if self.whole_slice:
                x_bytes = rm * rh * mk.x_item
                xk = add(TileOp(_LOAD, f"load {mk.x} m{mi} h{hi}", wait, f"{mk.x}[{slot}]", x_bytes, nbytes=x_bytes,
                                share=share_x))
            lg = add(TileOp(_LOAD, f"load {mk.w_gate} i{ii} h{hi}", wait, f"{mk.w_gate}[{slot}]", nbytes,
                            nbytes=nbytes, share=share_w))
            lu = add(TileOp(_LOAD, f"load {mk.w_up} i{ii} h{hi}", wait, f"{mk.w_up}[{slot}]", nbytes,
                            nbytes=nbytes, share=share_w))
            if g is None:
                g = g_prev = add(TileOp(_MATMUL, f"gate m{mi} i{ii} h{hi}", (xk, lg), mk.gate_out, acc_bytes,
                                        m=rm, n=ri, k=rh))
                u = u_prev = add(TileOp(_MATMUL, f"up m{mi} i{ii} h{hi}", (xk, lu), mk.up_out, acc_bytes,
                                        m=rm, n=ri, k=rh))
            else:
                g_prev = add(TileOp(_MATMUL, f"gate m{mi} i{ii} h{hi} (accumulate)", (xk, lg, g, g_prev), None, 0,
                                    m=rm, n=ri, k=rh))
                u_prev = add(TileOp(_MATMUL, f"up m{mi} i{ii} h{hi} (accumulate)", (xk, lu, u, u_prev), None, 0,
                                    m=rm, n=ri, k=rh))
            self.steps.append(u_prev)
        produced = {mk.gate_out: g_prev, mk.up_out: u_prev}  # the last op writing each buffer
        owners = {mk.gate_out: g, mk.up_out: u}              # the op that allocated it (frees it when done)
        ext = {"B": 1, "M": rm, "N": ri}
        for n in mk.pointwise:
            deps = sorted({produced[b] for b in n.inputs if b in produced} |
                          {owners[b] for b in n.inputs if b in owners})
            kind = _SPECIAL if isinstance(n, Pointwise) and n.transcendental else _VECTOR
            op = add(TileOp(kind, f"{n.op} m{mi} i{ii}", tuple(deps), n.output,
                            mk.operands[n.output].tile_bytes(ext, self.sb), elements=rm * ri))
            produced[n.output] = owners[n.output] = op
        return produced[mk.h]

    def down(self, mi: int, ii: int, rm: int, ri: int, h_op: int, acc: int | None, acc_prev: int | None,
             last: int) -> tuple[int | None, int | None, int]:
        """The down projection of I chunk ``ii``, output-column chunk by chunk: finished per chunk when one I
        tile is the whole slice, else accumulated into the row tile's full-width tile. Returns the
        accumulator's first and latest op and the last op emitted."""
        mk, add = self.mk, self.add
        for oi, ro in enumerate(self.o_tiles):
            slot, w_wait = slot_wait(self.steps, self.double_buffer)
            w_bytes = ri * ro * mk.w_item
            ld = add(TileOp(_LOAD, f"load {mk.w_down} i{ii} o{oi}", tuple(w_wait), f"{mk.w_down}[{slot}]", w_bytes,
                            nbytes=w_bytes, share=self.share_w))
            if self.whole_slice:
                t = len(self.out_done)
                acc_wait = [self.out_done[t - 2]] if t >= 2 else []
                acc = add(TileOp(_MATMUL, f"down m{mi} o{oi}", (ld, h_op, *acc_wait), f"out_acc[{t % 2}]",
                                 rm * ro * ACC_BYTES, m=rm, n=ro, k=ri))
                self.steps.append(acc)
                last = self.finish_output(acc, acc, rm, ro, f"m{mi}o{oi}")
                continue
            if acc is None:
                acc = acc_prev = add(TileOp(_MATMUL, f"down m{mi} i{ii} o{oi}", (ld, h_op), f"out_acc[{mi % 2}]",
                                            rm * self.o_pad * ACC_BYTES, m=rm, n=ro, k=ri))
            else:
                acc_prev = add(TileOp(_MATMUL, f"down m{mi} i{ii} o{oi} (accumulate)", (ld, h_op, acc, acc_prev),
                                      None, 0, m=rm, n=ro, k=ri))
            self.steps.append(acc_prev)
            last = acc_prev
        return acc, acc_prev, last

    def finish_output(self, acc: int, last: int, rm: int, cols: int, label: str) -> int:
        """Reduce a finished output tile over the ring between I-partners; the first partner stores it."""
        mk, p = self.mk, self.p
        if self.partner_info is not None:
            last = chain_reduce(p, self.partner_info, rm * cols * ACC_BYTES, rm * cols, acc, last,
                                f"{mk.name}:psum:{label}", self.cfg.cores, "add")
        if self.rank == 0:
            nbytes = rm * cols * mk.operands[mk.out].itemsize
            last = p.store(nbytes, deps=sorted({last, acc}), name=f"store {mk.out} {label}")
        self.out_done.append(last)
        return last
