"""Paged attention as one tiled kernel: this step's K/V written to the cache, attention read through block tables.

The engine keeps each layer's keys and values in fixed-size blocks (``[blocks, block_size, kv_heads, d]``);
a sequence's block table lists its blocks. The eager path gathers every sequence's blocks into one
padded ``[B, kv_heads, L, d]`` copy in DRAM and attends over that. This kernel reads each block where
it lies instead, once:

* **Work units** are (sequence, KV head). A unit's rows are the queries of the heads sharing that KV
  head (GQA: ``group x queries`` rows), so one load of a K/V block serves the whole group.
* **Tiles**: the unit's query rows stay in LX (cut into query tiles only when they do not fit); key
  tiles of a few blocks stream through two LX slots (double buffering). Cached context comes from the
  cache blocks the context covers, no block beyond it; this step's own keys come straight from the
  step's ``key``/``value`` inputs (the core that reads them for the unit's last query tile also stores
  them into their cache slots), so no read waits on a write.
* **Online softmax** as in :mod:`~spyre_lab.compiler.tiling_attention`: fp32 scores, running max and
  sum, the fp32 accumulator rescaled when the max grows; the score tile never leaves LX.
* **Split-KV** (flash-decoding): with fewer work units than cores (a batch-1 decode of an 8-KV-head
  model has 8), each unit's key tiles may be cut into contiguous chunks on neighbouring cores. Each chunk
  ends with a partial ``(max, sum, acc)``; the partials travel down a ring chain (chunk ``r`` receives
  from ``r + 1``, merges, forwards to ``r - 1``) and chunk 0 divides and stores. An estimate decides:
  splitting pays when one core's DMA engine or compute units limit a unit (one or two KV heads, many
  queries per sequence); when DRAM itself is the limit (on ``SPYRE`` a few cores' DMA engines already
  outrun it) the merges would only add time, and the plan says so.

:func:`paged_online_attention` (in :mod:`~spyre_lab.compiler.paged_attention_numerics`, re-exported here) is
the kernel's numerics on CPU tensors. :func:`plan_paged_attention` builds the per-core tile
programs for one launch shape (:class:`PagedShape`: cache blocks and queries per sequence), which the
simulator times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spyre_lab.compiler.paged_attention_numerics import (  # noqa: F401  (the family's numerics, re-exported)
    context_blocks,
    merge_partials,
    paged_online_attention,
)
from spyre_lab.compiler.scratchpad import LXBuffer, LXPlan, plan_scratchpad
from spyre_lab.compiler.tiling_common import ACC_BYTES, pad_to_sticks
from spyre_lab.compiler.work_division import ring_hops
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, TileProgram
from spyre_lab.device.sim_costs import matmul_cycles, ring_cycles, sfu_cycles

MAX_TILE_KEYS = 128
"""Most keys one score tile covers (a tile is whole blocks): wider tiles save ops but make split-KV chunks coarser."""

QUERY_TILE_ROWS = (1024, 512, 256, 128, 64, 32, 16, 8)
"""Query-tile heights tried, tallest first, when a unit's rows do not fit LX at once."""

MIN_TILES_PER_CHUNK = 2
"""A split-KV chunk keeps at least this many key tiles, so its own loads can double-buffer."""


# --- planning -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PagedShape:
    """What the tile program depends on: model sizes, and per sequence (cache blocks read, queries).

    ``seqs[b] = (blocks, queries)``: the cache blocks covering the sequence's context before this step
    (``ceil(context / block_size)``) and this step's tokens. A decode step's shape changes only when a
    sequence crosses into a new block, so launches share simulations.
    """

    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    seqs: tuple[tuple[int, int], ...]
    item: int = 2

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def units(self) -> list[tuple[int, int]]:
        """(sequence, KV head) of every unit with queries."""
        return [(b, h) for b, (_, q) in enumerate(self.seqs) if q > 0 for h in range(self.kv_heads)]

    def kv_bytes(self) -> int:
        """K and V bytes of every cache block the kernel must read plus this step's fresh rows."""
        rows = sum(nb * self.block_size + q for nb, q in self.seqs if q > 0)
        return 2 * rows * self.kv_heads * self.head_dim * self.item

    def context_kv_bytes(self, contexts: Sequence[int]) -> int:
        """K and V bytes of ``contexts`` tokens per sequence (this step's included): the DRAM floor's KV part."""
        return 2 * sum(contexts) * self.kv_heads * self.head_dim * self.item

    def qo_bytes(self) -> int:
        """Queries in, outputs out."""
        return 2 * sum(q for _, q in self.seqs) * self.heads * self.head_dim * self.item


@dataclass(frozen=True)
class KeyTile:
    """One step of a unit's key loop: cache blocks ``[lo, hi)`` of its table, or fresh rows ``[lo, hi)``."""

    fresh: bool
    lo: int
    hi: int


@dataclass
class WorkItem:
    """A unit's query tile and the key tiles it reads; split-KV cuts ``tiles`` into ``bounds`` chunks."""

    seq: int
    head: int
    rows: tuple[int, int]            # query rows of the unit (query-major: row = query * group + g)
    tiles: list[KeyTile]
    stores_fresh: bool               # the unit's last query tile: writes this step's K/V to the cache
    bounds: list[int] = field(default_factory=list)   # chunk boundaries over ``tiles``
    cores: list[int] = field(default_factory=list)    # the core running each chunk


@dataclass
class PagedPlan:
    """One launch's plan: tile sizes, work items and their cores, per-core programs, the LX plan, why."""

    shape: PagedShape
    query_rows: int
    tile_blocks: int
    fresh_rows: int
    items: list[WorkItem]
    kernel: TileProgram
    lx_plan: LXPlan
    reason: str

    @property
    def split_kv(self) -> bool:
        return any(len(i.bounds) > 2 for i in self.items)

    def block_chunks(self) -> list[list[int]]:
        """Per sequence, the cache blocks where its split-KV chunks start (KV head 0's first query tile; every
        head splits alike), for :func:`paged_online_attention` to merge partials in the kernel's order. A chunk
        of fresh rows only counts with the last cached block (the numerics read this step's keys from the cache)."""
        out: list[list[int]] = [[] for _ in self.shape.seqs]
        for item in self.items:
            if item.head == 0 and item.rows[0] == 0 and len(item.bounds) > 2:
                out[item.seq] = sorted({item.tiles[t].lo for t in item.bounds[1:-1] if not item.tiles[t].fresh} - {0})
        return out

    def describe(self) -> str:
        return self.reason


def lx_buffers(shape: PagedShape, tq: int, tk: int, fresh: int, cfg: SpyreConfig, split: bool) -> list[LXBuffer]:
    """Steady-state LX of one core: the resident query tile, two K/V slots, score and probability tiles,
    the fp32 accumulator and row statistics, and (split-KV) a partner's partial state."""
    eps = cfg.stick_bytes // shape.item
    dp = pad_to_sticks(shape.head_dim, eps)
    keys = max(tk, fresh)
    kp = pad_to_sticks(keys, eps)
    bufs = [LXBuffer("q", tq * dp * shape.item, 0, 1)]
    for c in range(2):
        bufs += [LXBuffer(f"k[{c}]", keys * dp * shape.item, 0, 1), LXBuffer(f"v[{c}]", keys * dp * shape.item, 0, 1)]
    bufs += [LXBuffer("s", tq * kp * ACC_BYTES, 0, 1), LXBuffer("p", tq * kp * shape.item, 0, 1),
             LXBuffer("acc", tq * dp * ACC_BYTES, 0, 1), LXBuffer("row_max_sum", tq * 3 * ACC_BYTES, 0, 1)]
    if split:
        bufs.append(LXBuffer("partial", tq * (dp + 2) * ACC_BYTES, 0, 1))
    return bufs


def _tile_cycles(shape: PagedShape, rows: int, keys: int, cfg: SpyreConfig, active: int) -> float:
    """Estimated cycles of one key tile for ``rows`` query rows: the slowest of the core's DRAM share (at most
    its DMA engine's rate), its PE array and its SFU."""
    d = shape.head_dim
    nbytes = 2 * keys * pad_to_sticks(d, cfg.stick_bytes // shape.item) * shape.item
    rate = min(float(cfg.core_dma_bytes_per_cycle), cfg.dram_bytes_per_cycle / max(1, active))
    pe = matmul_cycles(rows, keys, d, cfg) + matmul_cycles(rows, d, keys, cfg)
    sfu = (4 * sfu_cycles(rows * keys, cfg) + sfu_cycles(rows * keys, cfg, transcendental=True)   # scale, mask, max,
           + sfu_cycles(rows * d, cfg))                                                          # sum, exp; rescale
    return max(nbytes / rate, pe, sfu)


def estimate_layout(shape: PagedShape, tq: int, kb: int, fresh: int, cfg: SpyreConfig) -> float:
    """Estimated cycles of a tile layout (no split-KV): every (unit, query tile) item's tiles at the slowest of
    its DRAM share, PE array and SFU, the items spread longest-first over the cores, floored by DRAM moving
    every byte (query tiles re-read the K/V they see)."""
    group, bs, item = shape.group, shape.block_size, shape.item
    dp = pad_to_sticks(shape.head_dim, cfg.stick_bytes // item)
    work: list[tuple[float, int]] = []                  # (cycles, bytes) per item
    active = min(cfg.cores, sum(-(-q * group // tq) for b, _ in shape.units for q in (shape.seqs[b][1],)))

    def tiles(rows: int, count: int, keys: int) -> float:
        return count * _tile_cycles(shape, rows, keys, cfg, active) if count else 0.0

    for b, _h in shape.units:
        nb, q = shape.seqs[b]
        rows_all = q * group
        for r0 in range(0, rows_all, tq):
            rows = min(rows_all, r0 + tq) - r0
            seen = -(-(r0 + rows) // group)
            cycles = (tiles(rows, nb // kb, kb * bs) + tiles(rows, 1 if nb % kb else 0, (nb % kb) * bs)
                      + tiles(rows, seen // fresh, fresh) + tiles(rows, 1 if seen % fresh else 0, seen % fresh))
            nbytes = (2 * rows * dp + 2 * (nb * bs + seen) * dp) * item
            work.append((cycles, nbytes))
    loads = [0.0] * cfg.cores
    for cycles, _ in sorted(work, reverse=True):
        i = loads.index(min(loads))
        loads[i] += cycles
    return max(max(loads), sum(n for _, n in work) / cfg.dram_bytes_per_cycle)


def plan_paged_attention(shape: PagedShape, cfg: SpyreConfig, double_buffer: bool = True,
                         name: str = "paged attention", lx_allocator: str = "greedy",
                         split_kv: bool = True) -> PagedPlan:
    """Tile sizes, work division (split-KV when units < cores and the estimate says it pays; ``split_kv=False``
    never splits) and per-core programs for one launch shape.

    Raises :class:`~spyre_lab.device.isa.LXOverflowError` when not even one query group and one block fit LX.
    """
    group, bs = shape.group, shape.block_size
    units = shape.units
    max_rows = max((q * group for _, q in shape.seqs if q > 0), default=group)
    kb_max = max(1, MAX_TILE_KEYS // bs)
    most_queries = max((q for _, q in shape.seqs), default=1)
    options = sorted({max(group, min(max_rows, t) // group * group) for t in (max_rows, *QUERY_TILE_ROWS)},
                     reverse=True)
    ranked = []
    for kb_try in sorted({kb_max, max(1, kb_max // 2), max(1, kb_max // 4), 1}, reverse=True):
        fresh_try = max(1, min(kb_try * bs, most_queries))      # this step's keys in tiles as wide as a cache tile
        for tq_try in options:
            bufs = lx_buffers(shape, tq_try, kb_try * bs, fresh_try, cfg, False)
            if sum(b.size for b in bufs) <= cfg.lx_budget_bytes:
                ranked.append((estimate_layout(shape, tq_try, kb_try, fresh_try, cfg), -tq_try, -kb_try, bufs))
    if ranked:
        cycles, ntq, nkb, bufs = min(ranked, key=lambda r: r[:3])
        tq, kb = -ntq, -nkb
        fresh = max(1, min(kb * bs, most_queries))
        tile_why = (f"lowest estimate of {len(ranked)} fitting tile shapes ({cfg.cycles_to_us(cycles):,.1f} us: "
                    f"K/V re-read once per query tile, work balanced over the cores)")
    else:
        tq, kb, fresh, tile_why = group, 1, 1, "smallest tiles"
        bufs = lx_buffers(shape, group, bs, fresh, cfg, False)
    plan_scratchpad(bufs, cfg.lx_budget_bytes, lx_allocator, kernel=name)               # raises when nothing fits

    items: list[WorkItem] = []
    for b, h in units:
        nb, q = shape.seqs[b]
        rows = q * group
        for r0 in range(0, rows, tq):
            r1 = min(rows, r0 + tq)
            last_query = -(-r1 // group)                          # fresh keys this tile's queries may see
            tiles = [KeyTile(False, j, min(nb, j + kb)) for j in range(0, nb, kb)]
            tiles += [KeyTile(True, f, min(last_query, f + fresh)) for f in range(0, last_query, fresh)]
            items.append(WorkItem(b, h, (r0, r1), tiles, stores_fresh=r1 == rows))
    with_partial = lx_buffers(shape, tq, kb * bs, fresh, cfg, True)
    fits_partial = sum(b.size for b in with_partial) <= cfg.lx_budget_bytes
    division = _divide(items, shape, cfg, split_kv and fits_partial)
    if not fits_partial and len(units) < cfg.cores:
        division += " (no LX left for a partner's partial state)"
    if any(len(i.bounds) > 2 for i in items):
        bufs = with_partial
    lx_plan = plan_scratchpad(bufs, cfg.lx_budget_bytes, lx_allocator, kernel=name)
    programs = [CoreOps() for _ in range(cfg.cores)]
    for core, work in enumerate(_per_core(items, cfg.cores)):
        for item, chunk in work:
            _emit(programs[core], shape, item, chunk, cfg, double_buffer)
    kernel = TileProgram(name, programs)
    busy = len(kernel.active_cores)
    split = [i for i in items if len(i.bounds) > 2]
    how = (f"{len(units)} (sequence, KV head) unit(s) of up to {max_rows} query rows ({group} heads share each KV "
           f"block); query tile {tq} rows, key tile {kb} block(s) of {bs} (+ up to {fresh} fresh rows), the "
           f"{tile_why}; K/V double-buffered in LX ({lx_plan.peak:,} of {lx_plan.budget:,} B); ")
    if split:
        ways = sorted({len(i.bounds) - 1 for i in split})
        how += (f"{division}: each unit's key tiles over {'/'.join(map(str, ways))} neighbouring cores, partial "
                f"(max, sum, acc) merged down a ring chain; {busy} cores busy")
    else:
        how += f"{division}; {len(items)} work item(s) over {busy} core(s), longest first"
    return PagedPlan(shape, tq, kb, fresh, items, kernel, lx_plan, how)


def _divide(items: list[WorkItem], shape: PagedShape, cfg: SpyreConfig, split_kv: bool) -> str:
    """Give each item its chunks, and say why: one chunk each when the items fill the cores; else split-KV
    ways are added one at a time (to the item with the most tiles per chunk) and the layout with the lowest
    :func:`estimate_cycles` is kept -- splitting pays only where one core's DMA engine or compute units, not
    DRAM itself, limit a unit."""
    for item in items:
        item.bounds = [0, len(item.tiles)]
    if not items:
        return "no queries: nothing to do"
    if len(items) >= cfg.cores:
        return f"{len(items)} work items fill the {cfg.cores} cores: no split-KV"
    if not split_kv:
        return "split-KV switched off"
    ways = [1] * len(items)
    best = (estimate_cycles(items, ways, shape, cfg), list(ways))
    first = best[0]
    while sum(ways) < cfg.cores:
        i = max(range(len(items)), key=lambda i: (len(items[i].tiles) / ways[i], -i))
        if len(items[i].tiles) // (ways[i] + 1) < MIN_TILES_PER_CHUNK:
            break
        ways[i] += 1
        cycles = estimate_cycles(items, ways, shape, cfg)
        if cycles < best[0]:
            best = (cycles, list(ways))
    for item, w in zip(items, best[1]):
        n = len(item.tiles)
        item.bounds = [round(n * c / w) for c in range(w + 1)]
    if max(best[1]) == 1:
        return (f"{len(items)} work items on {cfg.cores} cores, yet split-KV would not pay: DRAM, not the cores' "
                f"DMA engines or compute, bounds each unit (estimate {cfg.cycles_to_us(first):,.1f} us)")
    return (f"split-KV estimated {cfg.cycles_to_us(first):,.1f} -> {cfg.cycles_to_us(best[0]):,.1f} us: more cores "
            f"stream each unit's blocks")


def estimate_cycles(items: list[WorkItem], ways: Sequence[int], shape: PagedShape, cfg: SpyreConfig) -> float:
    """Estimated cycles of the busiest chunk when item ``i`` runs on ``ways[i]`` cores: its tiles at the
    slowest of its DRAM share (capped by one core's DMA engine) and its compute units, plus the ring merges."""
    active = min(cfg.cores, sum(ways))
    dp = pad_to_sticks(shape.head_dim, cfg.stick_bytes // shape.item)
    worst = 0.0
    for item, w in zip(items, ways):
        rows = item.rows[1] - item.rows[0]
        per_tile = [_tile_cycles(shape, rows, (t.hi - t.lo) * (1 if t.fresh else shape.block_size), cfg, active)
                    for t in item.tiles]
        chunk = sum(per_tile) / w
        merge = (w - 1) * (ring_cycles(rows * (dp + 2) * ACC_BYTES, 1, cfg)
                           + sfu_cycles(2 * rows * shape.head_dim, cfg))
        worst = max(worst, chunk + merge)
    return worst


def _per_core(items: list[WorkItem], cores: int) -> list[list[tuple[WorkItem, int]]]:
    """Chunks to cores: a split item's chunks on consecutive cores; whole items longest first to the least loaded."""
    work: list[list[tuple[WorkItem, int]]] = [[] for _ in range(cores)]
    load = [0.0] * cores
    nxt = 0
    for item in items:
        if len(item.bounds) > 2:
            item.cores = list(range(nxt, nxt + len(item.bounds) - 1))
            for c, core in enumerate(item.cores):
                work[core].append((item, c))
                load[core] += item.bounds[c + 1] - item.bounds[c]
            nxt += len(item.cores)
    rest = sorted((i for i in items if len(i.bounds) <= 2), key=lambda i: -len(i.tiles))
    for item in rest:
        core = min(range(nxt, cores) if nxt < cores else range(cores), key=lambda c: (load[c], c))
        item.cores = [core]
        work[core].append((item, 0))
        load[core] += len(item.tiles)
    return work


def _emit(p: CoreOps, shape: PagedShape, item: WorkItem, chunk: int, cfg: SpyreConfig,
          double_buffer: bool) -> None:
    """One chunk of one work item on its core: Q resident, K/V tiles through two slots, merge or store."""
    eps = cfg.stick_bytes // shape.item
    d, bs, item_b = shape.head_dim, shape.block_size, shape.item
    dp = pad_to_sticks(d, eps)
    r0, r1 = item.rows
    rows = r1 - r0
    tag = f"s{item.seq}h{item.head}r{r0}"
    first_query = r0 // shape.group
    wait = [len(p.ops) - 1] if len(p.ops) else []                 # the previous item's last op: LX reuse
    lq = p.load("q", rows * dp * item_b, deps=wait, name=f"load Q {tag}")
    acc = stat = None
    steps: list[int] = []
    gap = 2 if double_buffer else 1
    for t in range(item.bounds[chunk], item.bounds[chunk + 1]):
        tile = item.tiles[t]
        slot = len(steps) % 2 if double_buffer else 0
        w = [steps[-gap]] if len(steps) >= gap else wait
        if tile.fresh:
            keys = tile.hi - tile.lo
            lk = [p.load(f"k[{slot}]", keys * dp * item_b, deps=w, name=f"load fresh K {tag} +{tile.lo}")]
            lv = [p.load(f"v[{slot}]", keys * dp * item_b, deps=w, name=f"load fresh V {tag} +{tile.lo}")]
            if item.stores_fresh:                                   # this step's K/V into their cache slots
                p.store(keys * dp * item_b, deps=lk, name=f"write K cache {tag} +{tile.lo}")
                p.store(keys * dp * item_b, deps=lv, name=f"write V cache {tag} +{tile.lo}")
            masked = tile.hi - 1 > first_query                     # a key after some query of the tile: causal
        else:
            keys = (tile.hi - tile.lo) * bs
            lk = [p.load(f"k[{slot}]", bs * dp * item_b, deps=w,
                         name=f"load K block {tag} #{j}") for j in range(tile.lo, tile.hi)]
            lv = [p.load(f"v[{slot}]", bs * dp * item_b, deps=w, name=f"load V block {tag} #{j}")
                  for j in range(tile.lo, tile.hi)]
            masked = t + 1 == len(item.tiles) or item.tiles[t + 1].fresh   # the context's last block: unwritten rows
        s = p.matmul("s", rows, keys, d, deps=[lq, *lk], out_bytes=rows * pad_to_sticks(keys, eps) * ACC_BYTES,
                     name=f"S=QK^T {tag} t{t}")
        s = p.vector(None, rows * keys, deps=[s], name=f"scale {tag} t{t}")
        if masked:                       # causal diagonal or the cache's unwritten rows: a mask from indices
            s = p.vector(None, rows * keys, deps=[s], name=f"mask {tag} t{t}")
        mx = p.vector(None, rows * keys, deps=[s, *([stat] if stat is not None else [])], name=f"row max {tag} t{t}")
        ex = p.special("p", rows * keys, deps=[mx], out_bytes=rows * pad_to_sticks(keys, eps) * item_b,
                       name=f"exp {tag} t{t}")
        sm = p.vector("row_max_sum" if stat is None else None, rows * keys + 2 * rows, deps=[ex],
                      out_bytes=rows * 3 * ACC_BYTES if stat is None else 0, name=f"row sum {tag} t{t}")
        stat = sm
        deps = [ex, *lv]
        if acc is not None:
            deps += [acc, p.vector(None, rows * d, deps=[acc, mx], name=f"rescale acc {tag} t{t}")]
        pv = p.matmul("acc" if acc is None else None, rows, d, keys, deps=deps,
                      out_bytes=rows * dp * ACC_BYTES if acc is None else 0, name=f"O+=PV {tag} t{t}")
        acc = pv if acc is None else acc
        steps.append(pv)
    last = steps[-1] if steps else lq
    state = [x for x in (acc, stat, last) if x is not None]
    ways = len(item.bounds) - 1
    partial = rows * (dp + 2) * ACC_BYTES
    if chunk < ways - 1:                                           # merge the partner's partial state into ours
        recv = p.ring_recv("partial", partial, item.cores[chunk + 1], f"{tag}c{chunk + 1}", deps=[last],
                           name=f"recv partial {tag} c{chunk + 1}")
        last = p.vector(None, 2 * rows * d + 4 * rows, deps=[recv, *state], name=f"merge partials {tag} c{chunk}")
        state.append(last)
    if chunk > 0:
        p.ring_send(partial, item.cores[chunk - 1], max(1, ring_hops(item.cores[chunk], item.cores[chunk - 1],
                                                                     cfg.cores)),
                    f"{tag}c{chunk}", deps=state, name=f"send partial {tag} c{chunk}")
        return
    fin = p.vector(None, rows * d, deps=state, name=f"O/=l {tag}")
    p.store(rows * dp * item_b, deps=[fin], name=f"store O {tag}")


def cache_block_loads(kernel: TileProgram) -> dict[tuple[int, int, int], int]:
    """(sequence, KV head, block index in its table) -> how many times the kernel loads that cache block's K."""
    counts: dict[tuple[int, int, int], int] = {}
    for prog in kernel.programs:
        for op in prog.ops:
            if op.name.startswith("load K block "):
                tag, j = op.name.removeprefix("load K block ").split(" #")
                seq, rest = tag[1:].split("h", 1)
                head = rest.split("r", 1)[0]
                key = (int(seq), int(head), int(j))
                counts[key] = counts.get(key, 0) + 1
    return counts
