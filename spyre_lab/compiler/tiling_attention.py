"""Fused attention: one tiled kernel for ``softmax(Q K^T * scale + mask) V`` with an online softmax.

Each core owns some heads and some query rows. A query tile stays in LX while key and value tiles
stream through it: ``S = Q K^T`` for one key tile is computed on the PE array, the score ops (scale,
additive or causal mask) run on the SFU in LX, and the softmax is computed *online* -- a running row
max ``m`` and row sum ``l`` are kept, and the output accumulator is rescaled by ``exp(m_old - m_new)``
whenever the max grows. So the score matrix never leaves LX, and DRAM sees Q, K, V (and the mask)
once per query tile plus the output once. A constant mask (the causal one SDPA builds) is read at
compile time: key tiles that are wholly masked for a query tile are skipped, tiles that are wholly
zero need no mask, and a causal mask is made on the SFU from row and column indices instead of loaded.

:func:`online_attention` is the kernel's numerics: the same tile loop, computed with torch on CPU
tiles (fp32 scores, fp16 probabilities into the PV matmul, fp32 accumulation). It is not a call to
``scaled_dot_product_attention``: tests compare the two.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from spyre_lab.compiler.constant_facts import causal_offset
from spyre_lab.compiler.ir import IRNode
from spyre_lab.compiler.scratchpad import LXBuffer
from spyre_lab.compiler.tiling_common import ACC_BYTES, pad_to_sticks
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, LXOverflowError

ScoreFn = Callable[[torch.Tensor, Sequence[torch.Tensor]], torch.Tensor]
"""Score ops on one tile: (fp32 score tile, the extra inputs' tiles) -> the softmax input tile."""

REFERENCE_TILE = 64
"""Query and key tile of :func:`online_attention` when the caller gives none (any size gives the same math)."""


@dataclass
class Attention(IRNode):
    """The attention pattern as one node: ``out[B,M,E] = softmax(score(Q[B,M,K] @ Kt[B,K,N])) @ V[B,N,E]``.

    ``members`` are the LoopIR nodes it replaces (for explain and views); ``score_ops`` names the ops
    between ``Q K^T`` and the softmax; ``extras`` are the additional inputs those ops read (a mask),
    each as a ``[B, M, N]`` view; ``const_extras`` holds the ones known at compile time, for block skipping.
    """

    members: list[IRNode] = field(default_factory=list, repr=False)
    score_ops: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()
    const_extras: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    additive_only: bool = True
    zero_masked_rows: bool = False
    reads: tuple = field(default=(), repr=False)


def node_reads(node: Attention) -> list:
    """The Read of each input of an Attention node (Q, K^T, V, extras), kept on the node by the scheduler."""
    return list(node.reads)


def online_attention(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, extras: Sequence[torch.Tensor],
                     score_fn: ScoreFn, zero_masked_rows: bool, out_dtype: torch.dtype,
                     tq: int = REFERENCE_TILE, tk: int = REFERENCE_TILE) -> torch.Tensor:
    """The fused kernel's computation on CPU tiles: ``q [B,M,K]``, ``kt [B,K,N]``, ``v [B,N,E]``, extras ``[B,M,N]``.

    Per query tile: running max ``m`` and sum ``l`` (fp32), output accumulator ``acc`` (fp32). Per key tile:
    ``s = score(q @ kt)``, ``m' = max(m, rowmax s)``, ``p = exp(s - m')``, ``acc = acc * exp(m - m') + p @ v``,
    ``l = l * exp(m - m') + rowsum p``. At the end ``out = acc / l``; a row with every score ``-inf`` has
    ``l = 0`` and gives 0 where the pattern asked for that (SDPA does), else 0/0 like the softmax it replaces.
    """
    b, m, _ = q.shape
    n, e = v.shape[1], v.shape[2]
    out = torch.empty(b, m, e, dtype=out_dtype)
    for m0 in range(0, m, tq):
        m1 = min(m, m0 + tq)
        qt = q[:, m0:m1].float()
        run_max = torch.full((b, m1 - m0, 1), -math.inf)
        run_sum = torch.zeros(b, m1 - m0, 1)
        acc = torch.zeros(b, m1 - m0, e)
        for n0 in range(0, n, tk):
            n1 = min(n, n0 + tk)
            s = score_fn(torch.matmul(qt, kt[:, :, n0:n1].float()), [x[:, m0:m1, n0:n1] for x in extras]).float()
            new_max = torch.maximum(run_max, s.amax(dim=-1, keepdim=True))
            safe = torch.where(new_max == -math.inf, 0.0, new_max)        # a row masked so far: nothing to shift
            p = torch.exp(s - safe)
            rescale = torch.exp(run_max - safe)
            run_sum = run_sum * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + torch.matmul(p.to(v.dtype).float(), v[:, n0:n1].float())
            run_max = new_max
        o = acc / run_sum
        if zero_masked_rows:
            o = torch.where(run_sum == 0, 0.0, o)
        out[:, m0:m1] = o.to(out_dtype)
    return out


# --- planning -------------------------------------------------------------------------------------------

@dataclass
class AttentionShape:
    """What the tile program needs to know: sizes, itemsizes, the extras and which blocks a constant mask kills."""

    name: str
    b: int
    m: int
    n: int
    k: int
    e: int
    item: int
    extras: int                      # extra [B,M,N] inputs streamed tile by tile (masks)
    score_passes: int                # SFU passes of the score ops per score element
    block_state: Callable[[int, int, int, int, int, int], str] | None = None
    """(b0, b1, m0, m1, n0, n1) -> "skip" (every score -inf), "plain" (mask all zero, no load) or "load"."""
    row_keys: list[int] | None = None
    """Per query row, the keys a constant mask leaves unmasked (None: all of them): what balances the rows."""


def attention_lx_buffers(a: AttentionShape, tq: int, tk: int, cfg: SpyreConfig,
                         double_buffer: bool) -> list[LXBuffer]:
    """Steady-state LX of one core: the resident query tile, streamed K/V/mask tiles, score tile, accumulators."""
    copies = 2 if double_buffer else 1
    eps = cfg.stick_bytes // a.item
    kp, ep, tkp = pad_to_sticks(a.k, eps), pad_to_sticks(a.e, eps), pad_to_sticks(tk, eps)
    bufs = [LXBuffer("q", tq * kp * a.item, 0, 1)]
    for c in range(copies):
        bufs += [LXBuffer(f"k[{c}]", tk * kp * a.item, 0, 1), LXBuffer(f"v[{c}]", tk * ep * a.item, 0, 1)]
        bufs += [LXBuffer(f"mask{i}[{c}]", tq * tkp * a.item, 0, 1) for i in range(a.extras)]
    bufs += [LXBuffer("s", tq * tkp * ACC_BYTES, 0, 1), LXBuffer("p", tq * tkp * a.item, 0, 1),
             LXBuffer("acc", tq * ep * ACC_BYTES, 0, 1), LXBuffer("row_max_sum", tq * 3 * ACC_BYTES, 0, 1)]
    return bufs


def estimate_cycles(a: AttentionShape, m_range: tuple[int, int], tq: int, tk: int, cfg: SpyreConfig,
                    active_cores: int) -> float:
    """Modeled cycles of one core's rows ``m_range`` (one head) at tiles ``tq`` x ``tk``: the slowest of its PE
    array, its SFU and its share of DRAM bandwidth, each summed over the blocks it does not skip (an estimate
    for choosing tiles; the simulator times the chosen program)."""
    pe = sfu = nbytes = 0.0
    passes = a.score_passes + 2 + cfg.transcendental_factor + 2      # score ops, max, exp, sum, rescale
    macs, lanes = cfg.macs_per_cycle_per_core, cfg.sfu_elems_per_cycle_per_core  # read once: 55 shapes x blocks
    ke, item, extras, n, block_state = a.k + a.e, a.item, a.extras, a.n, a.block_state
    for m0 in range(m_range[0], m_range[1], tq):
        m1 = min(m_range[1], m0 + tq)
        rq = m1 - m0
        nbytes += rq * ke * item                                        # Q in, O out
        for n0 in range(0, n, tk):
            n1 = min(n, n0 + tk)
            state = block_state(0, 1, m0, m1, n0, n1) if block_state else "load"
            if state == "skip":
                continue
            cells = rq * (n1 - n0)
            pe += cells * ke / macs
            sfu += cells * passes / lanes
            nbytes += (n1 - n0) * ke * item + (cells * item * extras if state == "load" else 0)
            sfu += cells * (1 if state == "causal" else 0) / lanes
    return max(pe, sfu, nbytes / (cfg.dram_bytes_per_cycle / max(1, active_cores)))


def choose_attention_tiles(a: AttentionShape, m_range: tuple[int, int], cfg: SpyreConfig, double_buffer: bool,
                           fits: Callable[[list[LXBuffer]], bool], max_rows: int | None = None,
                           active_cores: int = 1) -> tuple[int, int, str]:
    """(tq, tk, why): the fitting tile shape with the lowest :func:`estimate_cycles` on the busiest core (rows
    ``m_range``). Tall query tiles re-read K and V less often; under a constant (causal) mask, shorter tiles
    let more blocks be skipped. Ties go to the bigger tiles (fewer ops). ``max_rows``: the most rows a core holds."""
    eps = cfg.stick_bytes // a.item
    mc = max_rows or m_range[1] - m_range[0]
    tq_options = sorted({min(mc, t) for t in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)}, reverse=True)
    tk_options = sorted({min(pad_to_sticks(a.n, eps), t) for t in (1024, 512, 256, 128, 64)}, reverse=True)
    ranked = sorted((estimate_cycles(a, m_range, tq, tk, cfg, active_cores), -tq, -tk)
                    for tq in tq_options for tk in tk_options)
    for rejected, (cycles, ntq, ntk) in enumerate(ranked):
        tq, tk = -ntq, -ntk
        bufs = attention_lx_buffers(a, tq, tk, cfg, double_buffer)
        if fits(bufs):
            return tq, tk, (f"query tile {tq} rows x key tile {tk}: lowest estimate of {len(ranked)} shapes "
                            f"({cfg.cycles_to_us(cycles):,.1f} us on the busiest core; K/V re-read once per query "
                            f"tile, masked blocks skipped) whose buffers fit LX ({sum(b.size for b in bufs):,} B of "
                            f"{cfg.lx_budget_bytes:,}); {rejected} cheaper shape(s) did not fit")
    need = sum(b.size for b in attention_lx_buffers(a, 1, eps, cfg, double_buffer))
    raise LXOverflowError(a.name, 0, need, 0, cfg.lx_budget_bytes)


def row_ranges(a: AttentionShape, parts: int) -> list[tuple[int, int]]:
    """The query rows cut into ``parts`` contiguous ranges of equal work: equal row counts without a constant
    mask, equal unmasked keys with one (under a causal mask the early rows are cheap, so their ranges are longer)."""
    if a.row_keys is None:
        size = math.ceil(a.m / parts)
        return [(min(a.m, i * size), min(a.m, (i + 1) * size)) for i in range(parts)]
    total = sum(a.row_keys) or 1
    cuts, acc, r = [0], 0, 0
    for i in range(1, parts):
        goal = total * i / parts
        while r < a.m and acc + a.row_keys[r] / 2 < goal:
            acc += a.row_keys[r]
            r += 1
        cuts.append(max(r, cuts[-1]))
    cuts.append(a.m)
    return list(itertools.pairwise(cuts))


def divide_attention(a: AttentionShape, cores: int) -> tuple[dict[str, int], str]:
    """Split heads (B) and query rows (M) over the cores: the fewest rows per busiest core, then fewer splits of M
    (each M slice re-reads K and V)."""
    best: tuple[tuple[int, int], dict[str, int]] | None = None
    for sb in range(1, min(a.b, cores) + 1):
        for sm in range(1, min(a.m, cores // sb) + 1):
            rows = row_ranges(a, sm)
            per_row = a.row_keys or [a.n] * a.m
            work = math.ceil(a.b / sb) * max(sum(per_row[lo:hi]) + (hi > lo) * a.n // 8 for lo, hi in rows)
            key = (work, sm)
            if best is None or key < best[0]:
                best = (key, {"B": sb, "M": sm})
    assert best is not None
    splits = best[1]
    return splits, (f"heads over {splits['B']} and query rows over {splits['M']} core group(s): "
                    f"{math.ceil(a.b / splits['B'])} head(s) x up to "
                    f"{max(hi - lo for lo, hi in row_ranges(a, splits['M']))} rows per core"
                    + (" (row ranges balanced by the unmasked keys of the constant mask)" if a.row_keys else ""))


def emit_attention(a: AttentionShape, b_range: tuple[int, int], m_range: tuple[int, int], tq: int, tk: int,
                   cfg: SpyreConfig, double_buffer: bool) -> CoreOps:
    """One core's program: for each of its heads and query tiles, stream the key/value tiles through LX."""
    p = CoreOps()
    kv_steps: list[int] = []
    gap = 2 if double_buffer else 1
    eps = cfg.stick_bytes // a.item
    kp, ep = pad_to_sticks(a.k, eps), pad_to_sticks(a.e, eps)
    q_done: list[int] = []
    for h in range(*b_range):
        for m0 in range(m_range[0], m_range[1], tq):
            m1 = min(m_range[1], m0 + tq)
            rq = m1 - m0
            wait = [q_done[-1]] if q_done else []
            lq = p.load("q", rq * kp * a.item, deps=wait, name=f"load Q h{h} m{m0}")
            acc = stat = None
            last = lq
            for n0 in range(0, a.n, tk):
                n1 = min(a.n, n0 + tk)
                rk = n1 - n0
                state = a.block_state(h, h + 1, m0, m1, n0, n1) if a.block_state else "load"
                if state == "skip":
                    continue
                slot = len(kv_steps) % 2 if double_buffer else 0
                w = [kv_steps[-gap]] if len(kv_steps) >= gap else []
                lk = p.load(f"k[{slot}]", rk * kp * a.item, deps=w, name=f"load K h{h} n{n0}")
                lv = p.load(f"v[{slot}]", rk * ep * a.item, deps=w, name=f"load V h{h} n{n0}")
                masks = [p.load(f"mask{i}[{slot}]", rq * pad_to_sticks(rk, eps) * a.item, deps=w,
                                name=f"load mask{i} h{h} m{m0} n{n0}")
                         for i in range(a.extras if state == "load" else 0)]
                s = p.matmul("s", rq, rk, a.k, deps=[lq, lk], out_bytes=rq * rk * ACC_BYTES,
                             name=f"S=QK^T h{h} m{m0} n{n0}")
                if state == "causal":                    # the mask from row and column indices, on the SFU
                    masks = [p.vector(f"mask0[{slot}]", rq * rk, deps=w, out_bytes=rq * pad_to_sticks(rk, eps) * a.item,
                                      name=f"causal mask m{m0} n{n0}")]
                for i in range(a.score_passes if state in ("load", "causal") else max(0, a.score_passes - a.extras)):
                    s = p.vector(None, rq * rk, deps=[s, *masks], name=f"score op {i} m{m0} n{n0}")
                mx = p.vector(None, rq * rk, deps=[s, *([stat] if stat else [])], name=f"row max m{m0} n{n0}")
                ex = p.special("p", rq * rk, deps=[mx], out_bytes=rq * rk * a.item, name=f"exp m{m0} n{n0}")
                sm = p.vector("row_max_sum" if stat is None else None, rq * rk + 2 * rq, deps=[ex],
                              out_bytes=rq * 3 * ACC_BYTES if stat is None else 0, name=f"row sum m{m0} n{n0}")
                stat = sm
                deps = [ex, lv] + ([acc] if acc is not None else [])
                if acc is not None:
                    deps.append(p.vector(None, rq * a.e, deps=[acc, mx], name=f"rescale acc m{m0} n{n0}"))
                pv = p.matmul("acc" if acc is None else None, rq, a.e, rk, deps=deps,
                              out_bytes=rq * ep * ACC_BYTES if acc is None else 0, name=f"O+=PV h{h} m{m0} n{n0}")
                acc = pv if acc is None else acc
                kv_steps.append(pv)
                last = pv
            fin = p.vector(None, rq * a.e, deps=[last, *([stat] if stat else [])], name=f"O/=l h{h} m{m0}")
            q_done.append(p.store(rq * ep * a.item, deps=[fin], name=f"store O h{h} m{m0}"))
    return p


def unmasked_keys(consts: Mapping[str, torch.Tensor], additive_only: bool) -> list[int] | None:
    """Per query row, the keys no constant mask sets to -inf (over all heads); None without constants."""
    if not consts or not additive_only:
        return None
    tensors = list(consts.values())
    offset = causal_offset(tensors[0]) if len(tensors) == 1 else None
    if offset is not None:                       # row i keeps keys 0..i+d: arithmetic, no pass over the mask
        n = tensors[0].shape[-1]
        return [min(n, max(0, i + offset + 1)) for i in range(tensors[0].shape[-2])]
    dead = None
    for t in tensors:
        d = (t == -math.inf).all(dim=0)
        dead = d if dead is None else dead | d
    return (~dead).sum(dim=-1).tolist()


def _causal_state(t: torch.Tensor, d: int, streamed: int, generated: bool):
    """:func:`block_state_fn` for one causal mask of offset ``d``: a block's state from its corners, by index
    arithmetic (key ``c`` is visible to query ``r`` iff ``c <= r + d``), never by reading the mask."""
    heads, m, n = t.shape[0], t.shape[-2], t.shape[-1]

    def state(b0: int, b1: int, m0: int, m1: int, n0: int, n1: int) -> str:
        if heads > 1 and (b0 < 0 or b1 < 0 or min(b0, heads - 1) >= min(max(b1, 1), heads)) \
                and not range(heads)[min(b0, heads - 1):max(b1, 1)]:
            return "skip"                        # no head in the block
        if m0 < 0 or n0 < 0 or m1 < 0 or n1 < 0:  # slice bounds counted from the end: let range() clip them
            rows, cols = range(m)[m0:m1], range(n)[n0:n1]
            if not rows or not cols:
                return "skip"
            r0, r1, c0, c1 = rows[0], rows[-1], cols[0], cols[-1]
        else:                                    # the planners' blocks: [m0, m1) x [n0, n1) clipped to the mask
            r1, c1 = min(m1, m) - 1, min(n1, n) - 1
            if r1 < m0 or c1 < n0:
                return "skip"
            r0, c0 = m0, n0
        if c0 > r1 + d:
            return "skip"                        # an empty block, or every key after every query's last visible one
        if streamed == 0 and c1 <= r0 + d:
            return "plain"                       # every key visible to every query: nothing to mask
        return "causal" if generated else "load"
    return state


def block_state_fn(consts: Mapping[str, torch.Tensor], streamed: int, additive_only: bool):
    """From the constant extras ([B or 1, M, N] tensors), what a (heads, rows, keys) block needs.

    "skip" (every score masked), "plain" (mask all zero: nothing to load or add), "causal" (a causal mask,
    made from indices on the SFU), "load". None without constants (or with score ops other than scale and
    add): every block loads its mask. A causal mask is recognised once and answered by index arithmetic;
    any other mask is read block by block."""
    if not consts or not additive_only:
        return None
    tensors = list(consts.values())
    offset = causal_offset(tensors[0]) if len(tensors) == 1 else None
    generated = streamed == 0 and offset is not None
    if offset is not None:
        return _causal_state(tensors[0], offset, streamed, generated)
    cache: dict[tuple, str] = {}

    def state(b0: int, b1: int, m0: int, m1: int, n0: int, n1: int) -> str:
        key = (b0 if any(t.shape[0] > 1 for t in tensors) else 0, m0, m1, n0, n1)
        if key not in cache:
            blocks = [t[min(b0, t.shape[0] - 1):max(b1, 1) if t.shape[0] > 1 else 1, m0:m1, n0:n1] for t in tensors]
            if any(bool((blk == -math.inf).all()) for blk in blocks):
                cache[key] = "skip"
            elif streamed == 0 and all(bool((blk == 0).all()) for blk in blocks):
                cache[key] = "plain"
            else:
                cache[key] = "load"
        return cache[key]
    return state
