"""Hand-built reference kernels for the device layer: what a compiled tile program looks like.

These builders write :class:`~spyre_lab.device.isa.TileProgram` objects directly, the way the
compiler's code generator will later. They exist so the simulator can be tested, benchmarked and
demonstrated on kernels whose structure a learner can read in a few lines:

* :func:`elementwise_kernel` streams two inputs through the SFU: memory-bound on the real numbers.
* :func:`matmul_kernel` tiles ``C = A @ B`` over an M x N x K core grid with double-buffered
  operand loads, an in-place accumulator, and K-split partial sums reduced over the ring.
* :func:`sum_kernel` reduces a vector: per-core partial sums, then a reduction along the ring.
* :func:`softmax_kernel` runs max -> sub -> exp -> sum -> div per row tile, either fused (every
  intermediate stays in LX) or staged (every intermediate round-trips DRAM).

Work is split in whole sticks so a core never shares a stick with another core, as on the device.
Cores that do the same work get programs holding the same (frozen) ``TileOp`` objects, which makes
building a 32-core kernel cheap and lets the analytic simulator time such cores once.
"""

from __future__ import annotations

import math

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.isa import CoreOps, TileProgram

FP16 = 2
FP32 = 4


def _split(total: int, parts: int, quantum: int = 1) -> list[int]:
    """Split ``total`` into ``parts`` near-equal shares that are multiples of ``quantum`` (the last may be short)."""
    units = math.ceil(total / quantum)
    base, extra = divmod(units, parts)
    shares = [(base + (i < extra)) * quantum for i in range(parts)]
    overshoot = sum(shares) - total
    for i in reversed(range(parts)):
        cut = min(overshoot, shares[i])
        shares[i] -= cut
        overshoot -= cut
    return shares


def _chunks(total: int, size: int) -> list[int]:
    """``total`` cut into pieces of ``size`` (the last one shorter)."""
    return [min(size, total - start) for start in range(0, total, size)]


def _same_work(program: CoreOps) -> CoreOps:
    """A core program holding the same (immutable) ops, which the analytic simulator times only once."""
    return CoreOps(list(program.ops))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def elementwise_kernel(elements: int, cores: int, cfg: SpyreConfig = SPYRE, tile_bytes: int = 64 * 1024,
                       transcendental: bool = False, inputs: int = 2, buffers: int | None = 2) -> TileProgram:
    """``out = f(a, b, ...)`` over ``elements`` fp16 values on ``cores`` cores, tile by tile.

    Each tile loads ``inputs`` operand tiles, runs one SFU pass (a ``special`` pass when
    ``transcendental``), and stores the result. ``buffers`` is how many tiles a core keeps in
    flight: the loads of tile ``i`` wait for the compute of tile ``i - buffers`` (the buffer slot
    they reuse), which is how a compiler writes double buffering. ``buffers=None`` leaves loads
    free to run ahead until LX is full.
    """
    _check_positive(elements=elements, cores=cores, tile_bytes=tile_bytes, inputs=inputs)
    if cores > cfg.cores:
        raise ValueError(f"elementwise_kernel asks for {cores} cores but {cfg.name} has {cfg.cores}; "
                         "pass cores <= cfg.cores")
    if buffers is not None and buffers < 1:
        raise ValueError(f"buffers must be at least 1 (or None for unbounded), got {buffers}")
    stick_elems = cfg.stick_bytes // FP16
    tile_elems = max(stick_elems, tile_bytes // FP16 // stick_elems * stick_elems)
    programs = []
    built: dict[int, CoreOps] = {}
    for share in _split(elements, cores, stick_elems):
        if share in built:
            programs.append(_same_work(built[share]))
            continue
        p = built[share] = CoreOps()
        computes: list[int] = []
        for t, n in enumerate(_chunks(share, tile_elems)):
            nbytes = cfg.sticks(n * FP16) * cfg.stick_bytes
            slot = [computes[t - buffers]] if buffers is not None and t >= buffers else []
            loads = [p.load(f"in{i}[{t}]", nbytes, deps=slot) for i in range(inputs)]
            emit = p.special if transcendental else p.vector
            op = emit(f"out[{t}]", n, deps=loads, out_bytes=nbytes, name=f"{'exp' if transcendental else 'add'} {t}")
            computes.append(op)
            p.store(nbytes, deps=[op], name=f"store out[{t}]")
        programs.append(p)
    kind = "exp" if transcendental else "add"
    return TileProgram.from_programs(f"{kind}_{elements}x{inputs}_on{cores}", programs, cfg.cores)


def matmul_kernel(m: int, n: int, k: int, cores_m: int = 1, cores_n: int = 1, cores_k: int = 1,
                  cfg: SpyreConfig = SPYRE, tile: tuple[int, int, int] = (128, 128, 64),
                  acc_bytes: int = FP32, broadcast: bool = True) -> TileProgram:
    """``C[m,n] = A[m,k] @ B[k,n]`` in fp16 on a ``cores_m x cores_n x cores_k`` core grid.

    Per core, output tiles of ``tile[0] x tile[1]`` are accumulated in place over K steps of
    ``tile[2]``: the first matmul of a tile claims the accumulator, later ones add into it (they
    depend on it, so it stays claimed until the tile is stored or sent). Operand loads are
    double-buffered: the loads of step ``s`` wait for the matmul of step ``s - 2``.

    With ``cores_k > 1`` every core computes a partial sum over its K slice; partials are reduced
    along a chain of ring neighbours (K-fast placement puts K partners next to each other, so each
    transfer is one hop) and the core holding K slice 0 stores the tile.

    With ``broadcast`` an A tile is loaded as one DRAM broadcast to the ``cores_n`` cores that need
    it and a B tile to the ``cores_m`` cores that need it (``CoreOps.load(share=...)``).
    """
    _check_positive(m=m, n=n, k=k, cores_m=cores_m, cores_n=cores_n, cores_k=cores_k)
    if cores_m * cores_n * cores_k > cfg.cores:
        raise ValueError(f"matmul_kernel grid {cores_m}x{cores_n}x{cores_k} needs "
                         f"{cores_m * cores_n * cores_k} cores but {cfg.name} has {cfg.cores}")
    tm, tn, tk = tile
    _check_positive(tile_m=tm, tile_n=tn, tile_k=tk)
    if cores_m > m or cores_n > n or cores_k > k:
        raise ValueError(f"cannot split {m}x{n}x{k} over a {cores_m}x{cores_n}x{cores_k} grid: a dim has fewer "
                         "rows than cores")
    m_shares, n_shares, k_shares = _split(m, cores_m), _split(n, cores_n), _split(k, cores_k)
    programs: list[CoreOps] = [CoreOps() for _ in range(cores_m * cores_n * cores_k)]

    def core_id(mi: int, ni: int, ki: int) -> int:
        return (mi * cores_n + ni) * cores_k + ki

    built: dict[tuple[int, int], CoreOps] = {}
    for mi, ni, ki in ((a, b, c) for a in range(cores_m) for b in range(cores_n) for c in range(cores_k)):
        if cores_k == 1:  # no ring traffic: cores with the same block shape run the same program
            shape = (m_shares[mi], n_shares[ni])
            if shape in built:
                programs[core_id(mi, ni, ki)] = _same_work(built[shape])
                continue
            built[shape] = programs[core_id(mi, ni, ki)]
        p = programs[core_id(mi, ni, ki)]
        matmuls: list[int] = []
        for t, (rows, cols) in enumerate((r, c) for r in _chunks(m_shares[mi], tm) for c in _chunks(n_shares[ni], tn)):
            acc = first = -1
            for s, depth in enumerate(_chunks(k_shares[ki], tk)):
                slot = [matmuls[-2]] if len(matmuls) >= 2 else []
                a = p.load(f"A[{t}.{s}]", rows * depth * FP16, deps=slot, share=cores_n if broadcast else 1)
                b = p.load(f"B[{t}.{s}]", depth * cols * FP16, deps=slot, share=cores_m if broadcast else 1)
                if first < 0:
                    acc = first = p.matmul(f"C[{t}]", rows, cols, depth, deps=[a, b], out_bytes=rows * cols * acc_bytes,
                                           name=f"mm {t}.{s}")
                else:
                    acc = p.matmul(None, rows, cols, depth, deps=(a, b, acc, first), name=f"mm {t}.{s}")  # += into C[t]
                matmuls.append(acc)
            partial_bytes = rows * cols * acc_bytes
            if ki < cores_k - 1:  # add the partial arriving from the next K slice
                src = core_id(mi, ni, ki + 1)
                recv = p.ring_recv(f"P[{t}]", partial_bytes, peer=src, tag=f"psum {t} k{ki + 1}", deps=[acc])
                acc = p.vector(f"S[{t}]", rows * cols, deps=[recv, acc, first], out_bytes=partial_bytes,
                               name=f"psum add {t}")
            if ki > 0:
                p.ring_send(partial_bytes, peer=core_id(mi, ni, ki - 1), hops=1, tag=f"psum {t} k{ki}",
                            deps=[acc, first])
            else:
                p.store(rows * cols * FP16, deps=[acc, first], name=f"store C[{t}]")
    name = f"matmul_{m}x{n}x{k}_grid{cores_m}x{cores_n}x{cores_k}" + ("" if broadcast else "_nobcast")
    return TileProgram.from_programs(name, programs, cfg.cores)


def sum_kernel(elements: int, cores: int, cfg: SpyreConfig = SPYRE, tile_bytes: int = 64 * 1024) -> TileProgram:
    """``total = x.sum()`` over ``elements`` fp16 values: per-core partial sums, then a ring reduction.

    Each core folds its tiles into a one-stick accumulator (one SFU pass per tile, chained through
    the accumulator). The partials then travel down a chain of ring neighbours, each core adding
    what it receives before passing it on, and core 0 stores the total.
    """
    _check_positive(elements=elements, cores=cores, tile_bytes=tile_bytes)
    if cores > cfg.cores:
        raise ValueError(f"sum_kernel asks for {cores} cores but {cfg.name} has {cfg.cores}; pass cores <= cfg.cores")
    stick_elems = cfg.stick_bytes // FP16
    tile_elems = max(stick_elems, tile_bytes // FP16 // stick_elems * stick_elems)
    acc_bytes = cfg.stick_bytes
    programs = []
    for c, share in enumerate(_split(elements, cores, stick_elems)):
        p = CoreOps()
        acc = -1
        folds: list[int] = []
        for t, n in enumerate(_chunks(share, tile_elems)):
            slot = [folds[t - 2]] if t >= 2 else []
            x = p.load(f"x[{t}]", cfg.sticks(n * FP16) * cfg.stick_bytes, deps=slot)
            acc = p.vector(f"acc[{t}]", n, deps=[x] + ([acc] if acc >= 0 else []), out_bytes=acc_bytes,
                           name=f"sum {t}")
            folds.append(acc)
        if c < cores - 1:
            recv = p.ring_recv("partial", acc_bytes, peer=c + 1, tag=f"sum {c + 1}", deps=[acc] if acc >= 0 else [])
            acc = p.vector("total", stick_elems, deps=[recv] + ([acc] if acc >= 0 else []), out_bytes=acc_bytes,
                           name="add partial")
        if c > 0:
            p.ring_send(acc_bytes, peer=c - 1, hops=1, tag=f"sum {c}", deps=[acc] if acc >= 0 else [])
        else:
            p.store(acc_bytes, deps=[acc] if acc >= 0 else [], name="store total")
        programs.append(p)
    return TileProgram.from_programs(f"sum_{elements}_on{cores}", programs, cfg.cores)


def softmax_kernel(rows: int, cols: int, cores: int = 1, cfg: SpyreConfig = SPYRE, fused: bool = True,
                   row_tile: int | None = None) -> TileProgram:
    """Row softmax of an fp16 ``rows x cols`` tensor: max -> sub -> exp -> sum -> div per row tile.

    ``fused=True`` keeps every intermediate in LX (one DRAM read, one DRAM write). ``fused=False``
    models the staged version inside one launch: the row max, the exponentials and the row sums
    each round-trip DRAM before the next stage reads them back. (Separate kernel launches would
    add a launch overhead per stage on top.)
    """
    _check_positive(rows=rows, cols=cols, cores=cores)
    if cores > cfg.cores:
        raise ValueError(f"softmax_kernel asks for {cores} cores but {cfg.name} has {cfg.cores}")
    row_bytes = cfg.sticks(cols * FP16) * cfg.stick_bytes
    red_bytes = cfg.stick_bytes  # a per-row reduction result still occupies whole sticks
    shares = _split(rows, cores)
    if row_tile is None:  # small enough for two tiles in flight, and at least ~4 tiles per core to pipeline
        row_tile = max(1, min(64, (cfg.lx_bytes // 8) // (3 * row_bytes), math.ceil(max(shares) / 4)))
    elif row_tile <= 0:
        raise ValueError(f"row_tile must be a positive number of rows (or None to choose), got {row_tile}")
    programs = []
    built: dict[int, CoreOps] = {}
    for share in shares:
        if share in built:
            programs.append(_same_work(built[share]))
            continue
        p = built[share] = CoreOps()
        last_div: list[int] = []
        for t, r in enumerate(_chunks(share, row_tile)):
            tile, reds, elems = r * row_bytes, r * red_bytes, r * cols
            slot = [last_div[t - 2]] if t >= 2 else []
            x = p.load(f"x[{t}]", tile, deps=slot)
            mx = p.vector(f"max[{t}]", elems, deps=[x], out_bytes=reds, name=f"max {t}")
            if not fused:
                mx = p.load(f"max'[{t}]", reds, deps=[p.store(reds, deps=[mx], name=f"store max {t}")])
                x = p.load(f"x'[{t}]", tile, deps=[mx])
            sub = p.vector(f"sub[{t}]", elems, deps=[x, mx], out_bytes=tile, name=f"sub {t}")
            ex = p.special(f"exp[{t}]", elems, deps=[sub], out_bytes=tile, name=f"exp {t}")
            if not fused:
                ex = p.load(f"exp'[{t}]", tile, deps=[p.store(tile, deps=[ex], name=f"store exp {t}")])
            sm = p.vector(f"sum[{t}]", elems, deps=[ex], out_bytes=reds, name=f"sum {t}")
            if not fused:
                sm = p.load(f"sum'[{t}]", reds, deps=[p.store(reds, deps=[sm], name=f"store sum {t}")])
            div = p.vector(f"y[{t}]", elems, deps=[ex, sm], out_bytes=tile, name=f"div {t}")
            last_div.append(div)
            p.store(tile, deps=[div], name=f"store y[{t}]")
        programs.append(p)
    kind = "fused" if fused else "staged"
    return TileProgram.from_programs(f"softmax_{rows}x{cols}_{kind}_on{cores}", programs, cfg.cores)
