"""Matmul tile programs: output tiles accumulated in LX over K steps, then an epilogue and a store.

Per output tile ``tm x tn`` a core streams A (``tm x tk``) and B (``tk x tn``) tiles through its PT,
accumulating in fp32 in LX; K partners of a split K reduce over the ring; partner 0 runs the pointwise
epilogue on the finished tile and stores it. A tiles are DRAM broadcasts to the cores that split N,
B tiles to the cores that split M (and B, when the weight has no batch dim): every core walks its
tiles in the same (m, n, k) order, so a group asks for each shared tile at the same step.

Tile sizes come from a small model of the core's pipeline (:func:`matmul_tile_cycles`): the PT work,
the core's DMA time and its share of the card's DRAM (broadcasts counted once per group), plus the
fill before the first matmul can start. Bigger tiles reuse each loaded byte more; the fill and LX
bound how big they can get.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from spyre_lab.compiler.ir import IRNode, Pointwise
from spyre_lab.compiler.scratchpad import LXBuffer
from spyre_lab.compiler.tiling_common import (
    ACC_BYTES,
    IN_PLACE_OPS,
    Fits,
    Operand,
    PartnerInfo,
    chain_reduce,
    chunks,
    halvings,
    pad_to_sticks,
)
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, LXOverflowError
from spyre_lab.device.sim_costs import matmul_cycles

TILE_TIME_SLACK = 0.02
"""Tile candidates within 2% of the fastest modeled time count as equally fast; fewer steps win among them."""


@dataclass
class MatmulTiling:
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
    shares: dict[str, int] = field(default_factory=dict)  # buffer -> cores loading its tiles at once
    cores: int = 1                      # cores running the kernel (for the DRAM they share)
    k_partners: int = 1                 # cores per output tile (a split K); partner 0 stores


def _epilogue_inputs(mk: MatmulTiling) -> list[str]:
    produced = {mk.mm_out} | {n.output for n in mk.epilogue}
    seen: list[str] = []
    for n in mk.epilogue:
        seen.extend(b for b in n.inputs if b not in produced and b not in seen)
    return seen


def _epilogue_slot(mk: MatmulTiling, buffer: str) -> str:
    """The LX name of an epilogue input's output-shaped tile. An input the matmul also reads as A or B
    (``(h @ x.t()) @ x + x``) has its A/B tile under its own name already: the epilogue's tile is another one."""
    return f"{buffer}@out" if buffer in (mk.a, mk.b) else buffer


def _epilogue_in_place(mk: MatmulTiling, n: IRNode) -> bool:
    """May epilogue node ``n`` write into its first input's tile? (the accumulator or an earlier epilogue
    result of the same shape, which nothing after ``n`` reads and which is not stored)"""
    if n.op not in IN_PLACE_OPS or not n.inputs:
        return False
    first = n.inputs[0]
    later = mk.epilogue[mk.epilogue.index(n) + 1:]
    return (first in ({mk.mm_out} | {e.output for e in mk.epilogue}) and first not in mk.outputs
            and not any(first in e.inputs for e in later)
            and mk.operands[first].shape == mk.operands[n.output].shape)


def matmul_lx_buffers(mk: MatmulTiling, tm: int, tn: int, tk: int, cfg: SpyreConfig, double_buffer: bool,
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
        bufs += [LXBuffer(f"{_epilogue_slot(mk, b)}[{c}]", mk.operands[b].tile_bytes(ext, cfg.stick_bytes), 0, 1)
                 for c in range(copies)]
    for n in mk.epilogue:
        if not _epilogue_in_place(mk, n):
            bufs += [LXBuffer(f"{n.output}[{c}]", mk.operands[n.output].tile_bytes(ext, cfg.stick_bytes), 0, 1)
                     for c in range(2)]
    return bufs


def matmul_tile_cycles(mk: MatmulTiling, bc: int, mc: int, nc: int, kc: int, tiles: tuple[int, int, int],
                       cfg: SpyreConfig) -> float:
    """Modeled cycles for one core's ``bc x mc x nc x kc`` slice with ``tiles``, every core running alike.

    The steady state is the longest of the core's PT work (tiles padded to the PE array), its DMA time,
    and its part of the card's DRAM time (every core's bytes, a broadcast tile once per group of at most
    ``cfg.dram_broadcast_cores``). Before it comes the fill: no matmul starts until the card has served
    every core's first A and B tiles. After it, the drain: the last matmul and store.
    """
    tm, tn, tk = tiles
    n_pad = pad_to_sticks(nc, cfg.stick_bytes // mk.b_item)
    k_pad = pad_to_sticks(kc, cfg.stick_bytes // mk.a_item)
    m_t, n_t, k_t = Counter(chunks(mc, tm)), Counter(chunks(n_pad, tn)), Counter(chunks(k_pad, tk))
    pt = bc * sum(cm * cn * ck * matmul_cycles(rm, rn, rk, cfg)
                  for rm, cm in m_t.items() for rn, cn in n_t.items() for rk, ck in k_t.items())
    a_reads = 1 if sum(k_t.values()) == 1 else sum(n_t.values())  # a stationary A is read once
    a_bytes = bc * mc * k_pad * mk.a_item * a_reads
    b_bytes = bc * k_pad * n_pad * mk.b_item * sum(m_t.values())
    c_bytes = bc * mc * n_pad * mk.a_item
    cap = cfg.dram_broadcast_cores
    wa, wb = 1 / min(mk.shares.get(mk.a, 1), cap), 1 / min(mk.shares.get(mk.b, 1), cap)
    dma, dram = cfg.core_dma_bytes_per_cycle, cfg.dram_bytes_per_cycle
    card = (mk.cores * (a_bytes * wa + b_bytes * wb) + mk.cores // mk.k_partners * c_bytes) / dram
    first_a, first_b = tm * tk * mk.a_item, tk * tn * mk.b_item
    fill = max((first_a + first_b) / dma, mk.cores * (first_a * wa + first_b * wb) / dram)
    drain = matmul_cycles(tm, tn, tk, cfg) + tm * tn * mk.a_item / dma
    return fill + max(pt, (a_bytes + b_bytes) / dma, card) + drain


def choose_matmul_tiles(mk: MatmulTiling, mc: int, nc: int, kc: int, cfg: SpyreConfig, double_buffer: bool,
                        k_split: bool, fits: Fits, bc: int = 1) -> tuple[int, int, int]:
    """Tile sizes (tm rows, tn, tk in whole sticks) for one core's ``mc x nc x kc`` slice.

    Candidates halve each dim (keeping >= 8 rows per PT pass when the slice has them). The fastest that
    ``fits`` LX under :func:`matmul_tile_cycles` sets the bar; of the candidates within
    ``TILE_TIME_SLACK`` of it, the one with the fewest steps that fits wins, so tiny tiles never buy a
    sliver of modeled fill time with many times the ops.
    """
    eps_a, eps_b = cfg.stick_bytes // mk.a_item, cfg.stick_bytes // mk.b_item
    n_pad, k_pad = pad_to_sticks(nc, eps_b), pad_to_sticks(kc, eps_a)
    ranked = []
    for tm in halvings(mc, 1, min(8, mc)):
        for tn in halvings(n_pad, eps_b, eps_b):
            for tk in halvings(k_pad, eps_a, eps_a):
                steps = math.ceil(mc / tm) * math.ceil(n_pad / tn) * math.ceil(k_pad / tk)
                ranked.append((matmul_tile_cycles(mk, bc, mc, nc, kc, (tm, tn, tk), cfg), steps, tm, tn, tk))
    ranked.sort()
    best = next((c for c in ranked if fits(matmul_lx_buffers(mk, *c[2:], cfg, double_buffer, k_split))), None)
    if best is not None:
        near = sorted((c for c in ranked if c[0] <= best[0] * (1 + TILE_TIME_SLACK)), key=lambda c: (c[1], c[0]))
        return next(c[2:] for c in near if fits(matmul_lx_buffers(mk, *c[2:], cfg, double_buffer, k_split)))
    smallest = (min(8, mc), eps_b, eps_a)
    need = sum(b.size for b in matmul_lx_buffers(mk, *smallest, cfg, double_buffer, k_split))
    raise LXOverflowError(mk.name, 0, need, 0, cfg.lx_budget_bytes)


def emit_matmul(mk: MatmulTiling, bc: int, mc: int, nc: int, kc: int, tiles: tuple[int, int, int],
                cfg: SpyreConfig, double_buffer: bool, partner_info: PartnerInfo | None) -> CoreOps:
    """One core's matmul: per output tile, stream A and B tiles through the PT, accumulating in LX (fp32);
    reduce K partials over the ring; run the epilogue on the finished tile; store.

    Loops run batch, M tile, N tile, K step on every core, so the cores sharing an A tile (same M and K
    range) or a B tile (same N and K range) load it at the same step, as one broadcast.
    """
    p = CoreOps()
    sb = cfg.stick_bytes
    tm, tn, tk = tiles
    eps_a, eps_b = sb // mk.a_item, sb // mk.b_item
    k_tiles = chunks(pad_to_sticks(kc, eps_a), tk)
    n_tiles = chunks(pad_to_sticks(nc, eps_b), tn)
    a_stationary = len(k_tiles) == 1
    share_a, share_b = mk.shares.get(mk.a, 1), mk.shares.get(mk.b, 1)
    gap = 2 if double_buffer else 1
    steps: list[int] = []          # the matmul op of every K step, in order (for the load slots)
    tile_done: list[int] = []      # last op of every output tile (for the accumulator slots)
    a_users: list[int] = []        # the last matmul that read each stationary A tile
    rank = partner_info[0] if partner_info else 0
    ext_in = _epilogue_inputs(mk)
    for bi in range(bc):
        for mi, rm in enumerate(chunks(mc, tm)):
            a_op = None
            if a_stationary:
                wait = [a_users[-gap]] if len(a_users) >= gap else []
                a_op = p.load(f"{mk.a}[{len(a_users) % 2 if double_buffer else 0}]", rm * k_tiles[0] * mk.a_item,
                              deps=wait, name=f"load {mk.a} b{bi} m{mi}", share=share_a)
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
                                                           name=f"load {mk.a} b{bi} m{mi} k{ki}", share=share_a)]
                    loads.append(p.load(f"{mk.b}[{slot}]", rk * rn * mk.b_item, deps=wait,
                                        name=f"load {mk.b} b{bi} n{ni} k{ki}", share=share_b))
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
                    last = chain_reduce(p, partner_info, rm * rn * ACC_BYTES, rm * rn, owner, prev,
                                        f"{mk.name}:psum:b{bi}m{mi}n{ni}", cfg.cores, "add")
                if rank != 0:
                    tile_done.append(last)
                    continue
                tile_done.append(_epilogue_and_store(mk, p, owner, last, ext_in, bi, mi, ni, rm, rn, t, cfg))
    return p


def _epilogue_and_store(mk: MatmulTiling, p: CoreOps, owner: int, last: int, ext_in: list[str], bi: int,
                        mi: int, ni: int, rm: int, rn: int, t: int, cfg: SpyreConfig) -> int:
    """Partner 0's finish of an output tile: load the epilogue's other inputs, run it in LX, store."""
    sb = cfg.stick_bytes
    produced, owners = {mk.mm_out: last}, {mk.mm_out: owner}
    ext = {"B": 1, "M": rm, "N": rn}
    for b in ext_in:
        op = p.load(f"{_epilogue_slot(mk, b)}[{t % 2}]", mk.operands[b].tile_bytes(ext, sb), deps=[owner],
                    name=f"load {b} b{bi} m{mi} n{ni}", share=mk.shares.get(b, 1))
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
    return last
