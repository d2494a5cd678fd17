"""Work division: which core computes which slice of a kernel's iteration space.

The passes follow torch-spyre's planner (docs: compiler/work_division_planning.md):

1. **span reduction** - a core may address at most ``cfg.core_span_bytes`` (256 MB) of one tensor,
   measured on the tensor's outermost device dim. A bigger span *forces* splits, committed as minimums.
2. **matmul cost model** (``strategy="planned"``) - every (b, m, n, k) split over divisors of B, M,
   N-sticks and K-sticks with ``b*m*n*k <= cores`` is scored by :class:`MatmulCost`; the cheapest wins.
3. **core split** - output dims by decreasing size take the largest divisor of what is left of the
   cores, then at most one reduction dim.

A fused MLP has no torch-spyre counterpart: :func:`divide_mlp` scores (I-slices x row slices) by a
modeled critical path in which row-split cores share weight reads as DRAM broadcasts.

Stick dims are split in whole sticks (64 fp16 elements), so every core's slice starts on a stick.
With ``uneven=False`` splits divide evenly, as in torch-spyre. With ``uneven=True`` (what
``CompileOptions(uneven_splits=True)`` asks codegen for) a dim of ``u`` units may take any count ``s``
whose chunks of ``ceil(u/s)`` units leave no slice empty: every slice but the last is a full chunk and
the last one carries the remainder (``torch.chunk``'s rule, so slice starts stay an affine
``alpha * i + beta``). A vocabulary of 769 sticks - a prime, which no even split of 32 cores fits -
then takes 31 slices, 30 of 25 sticks and the last of 19. The price is imbalance: the busiest core carries
``ceil(u/s) * s / u`` times the mean, which the matmul cost model charges on its compute term and the
simulator sees directly (the short slice's core finishes early).

A slice index is row-major over ``WorkDivision.splits`` whose order puts
the split reduction dim (K) *first*: cores that share an output tile but hold different K ranges are
``m*n`` slices apart. K-fast placement renumbers the physical cores so these partners sit next to each
other on the ring, which turns the partial-sum exchange from ``m*n`` hops into one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from spyre_lab.compiler.work_slices import (
    MatmulCost,
    WorkDivision,
    chunk_counts,
    divisors,
    imbalance,
    largest_divisor_at_most,
    largest_split,
    placement,
    ring_hops,
    slice_ranges,
    split_counts,
)
from spyre_lab.device.config import SpyreConfig, dtype_bytes

__all__ = ["MatmulCost", "WorkDivision", "chunk_counts", "divide_iteration_space", "divide_matmul", "divide_mlp",
           "imbalance", "matmul_candidates", "matmul_cost", "placement", "ring_hops", "slice_ranges", "split_counts"]

# --- constants of the torch-spyre matmul cost model (work_division.py there) -----------------------
PSUM_US_PER_ELEMENT = 1.4e-4
"""Cost-model charge per output element per extra K partner (partial-sum exchange)."""
TIEBREAK_US_PER_OCTAVE = 50.0
"""Cost-model penalty per halving of PT passes below 8 (rows per core / 8)."""
B_SPLIT_EXPONENT = 1.4
"""The cost model multiplies a candidate's total by ``b ** 1.4``: batch splits are discouraged."""
BROADCAST_FREE_SHARERS = 8
"""Up to this many cores can share one DRAM read of an operand (a broadcast) at no extra cost."""
PT_PASS_ROWS = 8
"""Rows one PT pass consumes (the PE array has 8 rows); fewer rows per core leave it idle."""
MLP_PATH_SLACK = 0.01
"""MLP splits whose modeled critical paths are within 1% of the shortest count as ties."""


# --- span reduction --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _TensorView:
    """A tensor over named iteration dims, laid out in the default stick layout."""

    name: str
    dims: tuple[str, ...]     # host dims outermost first; the last one is the stick dim
    sizes: tuple[int, ...]


def _span_bytes(t: _TensorView, splits: Mapping[str, int], eps: int, itemsize: int) -> int:
    """Bytes one core spans of ``t``: positions it covers on the outermost device dim x that dim's stride.

    Default layout: device dims = [host dims 1..n-2, sticks(last), host dim 0, eps] after dropping size-1 dims.
    """
    kept = [(d, s) for d, s in zip(t.dims, t.sizes) if s > 1] or [(t.dims[-1], 1)]
    stick_dim, stick_size = kept[-1]
    device: list[tuple[str, int]]
    if len(kept) == 1:
        device = [(stick_dim, math.ceil(stick_size / eps))]
    else:
        device = [*kept[1:-1], (stick_dim, math.ceil(stick_size / eps)), kept[0]]
    device.append(("", eps))
    outer_dim, outer_size = device[0]
    stride = math.prod(s for _, s in device[1:])
    per_core = math.ceil(outer_size / splits.get(outer_dim, 1))
    return per_core * stride * itemsize


def _units(dims: Mapping[str, int], stick_dims: Sequence[str], eps: int) -> dict[str, int]:
    """Splittable units per dim: sticks for stick dims, elements otherwise."""
    return {d: (math.ceil(n / eps) if d in stick_dims else n) for d, n in dims.items()}


def _span_reduction(tensors: Sequence[_TensorView], units: Mapping[str, int], reduction_dims: Sequence[str],
                    eps: int, itemsize: int, cfg: SpyreConfig, uneven: bool = False) -> dict[str, int]:
    """Minimum splits that keep every tensor's per-core span within ``cfg.core_span_bytes`` ({} if none needed)."""
    limit = cfg.core_span_bytes
    if all(_span_bytes(t, {}, eps, itemsize) <= limit for t in tensors):
        return {}
    best: tuple[int, int, dict[str, int]] | None = None
    names = list(units)
    for combo in itertools.product(*(split_counts(units[d], cfg.cores, uneven) for d in names)):
        if math.prod(combo) > cfg.cores:
            continue
        splits = dict(zip(names, combo))
        if sum(1 for d in reduction_dims if splits[d] > 1) > 1:
            continue
        span = max(_span_bytes(t, splits, eps, itemsize) for t in tensors)
        if span > limit:
            continue
        key = (span, -math.prod(combo))  # closest under the limit, then fewest cores
        if best is None or key > best[:2]:
            best = (span, -math.prod(combo), {d: s for d, s in splits.items() if s > 1})
    if best is None:
        worst = max(tensors, key=lambda t: _span_bytes(t, {}, eps, itemsize))
        raise ValueError(
            f"tensor {worst.name!r} spans {_span_bytes(worst, {}, eps, itemsize):,} B per core and no split over "
            f"{cfg.cores} cores brings it under the {limit:,} B per-core span; chunk the tensor before this op"
            + ("" if uneven else " (or allow uneven splits: CompileOptions(uneven_splits=True))")
        )
    return best[2]


def _core_split(units: Mapping[str, int], sizes: Mapping[str, int], output_dims: Sequence[str],
                reduction_dims: Sequence[str], commits: Mapping[str, int], cores: int,
                uneven: bool = False) -> dict[str, int]:
    """Pass 3: keep commits, output dims by decreasing size take the largest divisor of the remaining cores,
    then at most one reduction dim does the same."""
    splits = {d: commits.get(d, 1) for d in units}
    remaining = cores // math.prod(splits.values())
    for d in sorted((d for d in output_dims if d not in commits), key=lambda d: -sizes[d]):
        splits[d] = largest_split(units[d], remaining, uneven)
        remaining //= splits[d]
    if not any(splits[d] > 1 for d in reduction_dims):
        for d in sorted(reduction_dims, key=lambda d: -sizes[d]):
            take = largest_split(units[d], remaining, uneven)
            if take > 1:
                splits[d] = take
                break
    return splits


def _apply_hint(hint: Mapping[str, int], units: Mapping[str, int], reduction_dims: Sequence[str],
                cfg: SpyreConfig, uneven: bool = False) -> dict[str, int]:
    unknown = set(hint) - set(units)
    if unknown:
        raise ValueError(f"work_div hint names dim(s) {sorted(unknown)}; this op's dims are {list(units)}")
    for d, s in hint.items():
        if not isinstance(s, int) or s < 1 or s not in split_counts(units[d], max(s, 1), uneven):
            what = "leave no slice empty when it cuts" if uneven else "divide"
            raise ValueError(f"work_div hint {d}={s} must {what} dim {d} ({units[d]} splittable units: "
                             f"sticks for stick dims); try one of {split_counts(units[d], cfg.cores, uneven)}")
    if math.prod(hint.values()) > cfg.cores:
        raise ValueError(f"work_div hint {dict(hint)} uses {math.prod(hint.values())} cores; the device has "
                         f"{cfg.cores}")
    if sum(1 for d in reduction_dims if hint.get(d, 1) > 1) > 1:
        raise ValueError(f"work_div hint {dict(hint)} splits more than one reduction dim; split at most one")
    return {d: hint.get(d, 1) for d in units}


def _ordered(splits: Mapping[str, int], dim_order: Sequence[str], reduction_dims: Sequence[str]) -> dict[str, int]:
    """Reduction dims first (slowest in the slice numbering), then the rest in iteration order."""
    first = [d for d in dim_order if d in reduction_dims]
    rest = [d for d in dim_order if d not in reduction_dims]
    return {d: splits.get(d, 1) for d in first + rest}


def _describe(splits: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{d}:{s}" for d, s in splits.items()) + "}"


# --- matmul --------------------------------------------------------------------------------------

def matmul_cost(b: int, m: int, n: int, k: int, B: int, M: int, N: int, K: int,
                cfg: SpyreConfig, dtype: torch.dtype = torch.float16) -> MatmulCost:
    """torch-spyre's analytic score for splitting ``C[B,M,N] = A[B,M,K] @ W[B,K,N]`` into b*m*n*k slices.

    ``compute`` = per-core MACs at the card's per-core MAC rate scaled by PT efficiency
    ``min(1, sqrt(max(1, rows/8) / 8))`` (rows = M/m per core); ``hbm`` = all operand bytes at the
    aggregate DRAM bandwidth, times ``max(1, max(m, n)/8)`` since more than 8 cores sharing one read no
    longer get it broadcast for free; ``psum`` = ``(k-1) * B*M*N * 1.4e-4`` µs; ``tiebreak`` = 50 µs per
    halving of PT passes below 8. An uneven split (a count that does not divide its dim) is charged on
    compute by its imbalance: the critical core carries ``ceil(units/s) * s / units`` of the mean, and
    its rows are ``ceil(M/m)``. Even splits score exactly as in torch-spyre.
    """
    cores = b * m * n * k
    mac_per_us = cfg.macs_per_cycle_per_core * cfg.clock_hz / 1e6
    eps = cfg.elems_per_stick(dtype)
    units = {"B": B, "M": M, "N": math.ceil(N / eps), "K": math.ceil(K / eps)}
    skew = imbalance({"B": b, "M": m, "N": n, "K": k}, units)
    rows = M / m if M % m == 0 else math.ceil(M / m)
    passes = rows / PT_PASS_ROWS
    pt_eff = min(1.0, math.sqrt(max(1.0, passes) / 8))
    compute = B * M * N * K / cores / (mac_per_us * pt_eff) * skew
    nbytes = (B * M * K + B * K * N + B * M * N) * dtype_bytes(dtype)
    hbm = nbytes / cfg.dram_bandwidth * 1e6 * max(1.0, max(m, n) / BROADCAST_FREE_SHARERS)
    psum = (k - 1) * B * M * N * PSUM_US_PER_ELEMENT
    tiebreak = math.log2(8 / passes) * TIEBREAK_US_PER_OCTAVE if passes < 8 else 0.0
    return MatmulCost(compute, hbm, psum, tiebreak, b ** B_SPLIT_EXPONENT)


def matmul_candidates(b: int, m: int, n: int, k: int, dtype: torch.dtype, cfg: SpyreConfig,
                      allow_k_split: bool = True, uneven: bool = False) -> list[tuple[dict[str, int], MatmulCost]]:
    """Every (B, M, N-sticks, K-sticks) split using at most ``cfg.cores`` cores, cheapest first
    (divisors only, or every count that leaves no slice empty with ``uneven``)."""
    eps = cfg.elems_per_stick(dtype)
    n_sticks, k_sticks = math.ceil(n / eps), math.ceil(k / eps)
    out = []
    c = cfg.cores
    for sb, sm, sn, sk in itertools.product(split_counts(b, c, uneven), split_counts(m, c, uneven),
                                            split_counts(n_sticks, c, uneven),
                                            split_counts(k_sticks, c, uneven) if allow_k_split else [1]):
        if sb * sm * sn * sk <= cfg.cores:
            out.append(({"B": sb, "M": sm, "N": sn, "K": sk}, matmul_cost(sb, sm, sn, sk, b, m, n, k, cfg, dtype)))
    out.sort(key=lambda c: (c[1].total_us, -math.prod(c[0].values())))
    return out


def _matmul_tensors(b: int, m: int, n: int, k: int) -> list[_TensorView]:
    return [_TensorView("A", ("B", "M", "K"), (b, m, k)),
            _TensorView("W", ("B", "K", "N"), (b, k, n)),
            _TensorView("C", ("B", "M", "N"), (b, m, n))]


def divide_matmul(b: int, m: int, n: int, k: int, dtype: torch.dtype, cfg: SpyreConfig,
                  strategy: str = "planned", k_fast: bool = True, hint: Mapping[str, int] | None = None,
                  allow_k_split: bool = True, uneven: bool = False) -> WorkDivision:
    """Divide ``C[b,m,n] = A[b,m,k] @ W[b,k,n]`` over the cores.

    ``"naive"`` splits only the largest output dim that can be split; ``"planned"`` runs span reduction,
    then the cost model (unless span reduction already committed splits) restricted to candidates that use
    at least as many cores as the core split would, so planning never idles cores the core split keeps
    busy. ``hint`` (e.g. ``{"M": 2, "K": 4}``) overrides.
    ``allow_k_split=False`` is for fused kernels whose epilogue needs complete sums. ``uneven`` lets a
    split leave the last slice short (see the module docstring), its imbalance charged by the cost model.
    """
    for name, v in (("b", b), ("m", m), ("n", n), ("k", k)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"matmul dim {name} must be a positive integer, got {v!r}")
    _check_strategy(strategy)
    eps = cfg.elems_per_stick(dtype)
    sizes = {"B": b, "M": m, "N": n, "K": k}
    units = _units(sizes, ("N", "K"), eps)
    order = ("B", "M", "N", "K") if b > 1 else ("M", "N", "K")
    units = {d: units[d] for d in order}
    reds = ("K",) if allow_k_split else ()
    if hint is not None:
        splits = _apply_hint({d: s for d, s in hint.items() if not (d == "B" and b == 1 and s == 1)}, units,
                             ("K",), cfg, uneven)
        reason = f"hint {_describe(hint)} overrides the planner"
        strategy = "hint"
    elif strategy == "naive":
        splits, reason = _naive(units, sizes, ("B", "M", "N"), cfg, uneven)
    else:
        commits = _span_reduction(_matmul_tensors(b, m, n, k), units, ("K",), eps, dtype_bytes(dtype), cfg, uneven)
        core_split = _core_split(units, sizes, [d for d in order if d != "K"], reds, commits, cfg.cores, uneven)
        if commits:
            splits = core_split
            reason = (f"a per-core span over {cfg.core_span_bytes >> 20} MB forced {_describe(commits)}; "
                      f"the remaining cores split output dims by size")
        else:
            candidates = matmul_candidates(b, m, n, k, dtype, cfg, allow_k_split, uneven)
            floor = math.prod(core_split.values())
            full = [(s, c) for s, c in candidates if math.prod(s.values()) >= floor]
            if not full:
                splits = core_split
                reason = "every cost-model candidate uses fewer cores than the core split, so the core split wins"
            else:
                best, c = full[0]
                splits = {d: best[d] for d in order}
                reason = (f"cheapest of {len(full)} candidates using >= {floor} cores: compute {c.compute_us:.1f} + "
                          f"hbm {c.hbm_us:.1f} + psum {c.psum_us:.1f} + tiebreak {c.tiebreak_us:.1f} µs (modeled)")
    splits = _ordered(splits, order, ("K",))
    cost = matmul_cost(splits.get("B", 1), splits["M"], splits["N"], splits["K"], b, m, n, k, cfg, dtype)
    reason += _uneven_note(splits, units)
    return WorkDivision(splits, placement(splits, "K", k_fast), strategy, reason, cost, ("K",), dict(units))


def _uneven_note(splits: Mapping[str, int], units: Mapping[str, int]) -> str:
    """What an uneven split costs, for the reason line (empty for even splits)."""
    short = [(d, s) for d, s in splits.items() if s > 1 and units[d] % s]
    if not short:
        return ""
    parts = [f"{d} {units[d]} units in chunks of {math.ceil(units[d] / s)} (last "
             f"{units[d] - (s - 1) * math.ceil(units[d] / s)})" for d, s in short]
    return f"; uneven: {', '.join(parts)}, busiest core {imbalance(splits, units):.3f}x the mean"


def _naive(units: Mapping[str, int], sizes: Mapping[str, int], output_dims: Sequence[str],
           cfg: SpyreConfig, uneven: bool = False) -> tuple[dict[str, int], str]:
    """Split only the largest output dim that can be split (largest divisor <= cores; with ``uneven``, the
    smallest chunk the cores allow)."""
    splits = {d: 1 for d in units}
    for d in sorted((d for d in output_dims if d in units), key=lambda d: -sizes[d]):
        take = largest_split(units[d], cfg.cores, uneven)
        if take > 1:
            splits[d] = take
            how = "in chunks the cores allow" if uneven else "the largest output dim that divides"
            return splits, f"naive: split only {d} ({how}) {take} ways"
    return splits, "naive: no output dim can be split, so one core runs it"


def _check_strategy(strategy: str) -> None:
    if strategy not in ("planned", "naive"):
        raise ValueError(f"work division strategy must be 'planned' or 'naive', got {strategy!r}")


# --- pointwise / reduction -------------------------------------------------------------------------

def divide_iteration_space(dims: Mapping[str, int], stick_dim: str, reduction_dims: Sequence[str],
                           dtype: torch.dtype, cfg: SpyreConfig, strategy: str = "planned",
                           hint: Mapping[str, int] | None = None, k_fast: bool = True,
                           allow_reduction_split: bool = True, uneven: bool = False) -> WorkDivision:
    """Divide a pointwise or reduction iteration space (dims outermost first) over the cores.

    ``"planned"``: span reduction, then output dims by decreasing size, then at most one reduction dim.
    ``"naive"``: the largest output dim only. ``allow_reduction_split=False`` keeps reduced dims whole on
    one core, for fused kernels (softmax, norms) whose later ops need the complete reduction. ``uneven``
    lets each dim take the smallest chunk the free cores allow, the last slice short.
    """
    _check_strategy(strategy)
    if not dims:
        return WorkDivision({}, (0,), strategy, "a scalar runs on one core", None, ())
    if stick_dim not in dims:
        raise ValueError(f"stick dim {stick_dim!r} is not one of the iteration dims {list(dims)}")
    bad = [d for d in reduction_dims if d not in dims]
    if bad:
        raise ValueError(f"reduction dim(s) {bad} are not iteration dims {list(dims)}")
    eps = cfg.elems_per_stick(dtype)
    units = _units(dims, (stick_dim,), eps)
    outputs = [d for d in dims if d not in reduction_dims]
    if hint is not None:
        splits = _apply_hint(hint, units, reduction_dims, cfg, uneven)
        reason, strategy = f"hint {_describe(hint)} overrides the planner", "hint"
    elif strategy == "naive":
        splits, reason = _naive(units, dims, outputs, cfg, uneven)
    else:
        host = [d for d in dims if d != stick_dim] + [stick_dim]
        tensor = _TensorView("input", tuple(host), tuple(dims[d] for d in host))
        commits = _span_reduction([tensor], units, reduction_dims, eps, dtype_bytes(dtype), cfg, uneven)
        splittable = reduction_dims if allow_reduction_split else ()
        splits = _core_split(units, dims, outputs, splittable, commits, cfg.cores, uneven)
        used = math.prod(splits.values())
        reason = (f"output dims by decreasing size take the largest divisor of the free cores "
                  f"(stick dim {stick_dim} in whole sticks): {used} of {cfg.cores} cores busy")
        if commits:
            reason = f"a per-core span over {cfg.core_span_bytes >> 20} MB forced {_describe(commits)}; " + reason
    splits = _ordered(splits, list(dims), reduction_dims)
    red = next((d for d in reduction_dims if splits[d] > 1), None)
    reason += _uneven_note(splits, units)
    return WorkDivision(splits, placement(splits, red, k_fast), strategy, reason, None, tuple(reduction_dims),
                        dict(units))


# --- fused MLP -----------------------------------------------------------------------------------

def divide_mlp(m: int, i: int, h: int, has_down: bool, dtype: torch.dtype, cfg: SpyreConfig,
               strategy: str = "planned", k_fast: bool = True, out_cols: int | None = None,
               row_tiles: Callable[[int, int], int] | None = None) -> WorkDivision:
    """Divide a fused MLP (``x[m,h] @ Wg/Wu[h,i]``, SiLU, mul, optionally ``@ Wd[i,out_cols]``) over the cores.

    Each core owns an I-slice (``N``, in sticks) and a row slice (``M``). ``"planned"`` tries every
    (I, rows) split on at most ``cfg.cores`` cores and keeps the one with the shortest modeled critical
    path, the longest of:

    * compute: the core's MACs at the PT rate, derated when it has fewer than 8 rows per pass;
    * DRAM: the weights once per row tile and per broadcast group of row-split cores (a group of up to
      ``cfg.dram_broadcast_cores`` shares one read), plus x once per group of I-split cores;
    * DMA: what one core loads (its weight slice once per row tile, its rows of x) at its DMA rate;
    * ring: with a down projection the I-slices are partial sums of the output, and every partner but
      the last forwards its rows' fp32 partial once down the chain.

    ``row_tiles(i_split, row_split)`` says how many row tiles LX lets a core's slice take (codegen
    asks its tile chooser; 1 when not given). Of the splits within ``MLP_PATH_SLACK`` of the shortest path,
    the one on the most cores wins: more cores shorten the fill and leave room the model does not see.
    ``"naive"`` splits I alone. With a down projection I is the reduced dim (partners adjacent under K-fast
    placement).
    """
    _check_strategy(strategy)
    for name, v in (("m", m), ("i", i), ("h", h)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"MLP dim {name} must be a positive integer, got {v!r}")
    eps = cfg.elems_per_stick(dtype)
    i_sticks = math.ceil(i / eps)
    item = dtype_bytes(dtype)
    cols = (out_cols if out_cols is not None else h) if has_down else 0
    weights, x_bytes = (2 * h * i + i * cols) * item, m * h * item
    macs = m * i * (2 * h + cols)
    mac_per_us = cfg.macs_per_cycle_per_core * cfg.clock_hz / 1e6
    dma_per_us = cfg.core_dma_bytes_per_cycle * cfg.clock_hz / 1e6
    cap = cfg.dram_broadcast_cores
    tiles_of = row_tiles or (lambda _sn, _sm: 1)

    def critical_path_us(sn: int, sm: int) -> float:
        rt = tiles_of(sn, sm)
        compute = macs / (sn * sm) / (mac_per_us * min(1.0, m / sm / cfg.pe_rows))
        dram = (sm / min(sm, cap) * weights * rt + sn / min(sn, cap) * x_bytes) / cfg.dram_bandwidth * 1e6
        dma = (weights / sn * rt + x_bytes / sm) / dma_per_us
        ring = (m / sm) * cols * 4 / cfg.ring_bytes_per_cycle / cfg.clock_hz * 1e6 if sn > 1 else 0.0
        return max(compute, dram, dma, ring)

    if strategy == "naive":
        sn, sm = largest_divisor_at_most(i_sticks, cfg.cores), 1
        reason = f"naive: the intermediate dim I alone takes {sn} cores"
    else:
        pairs = [(a, b) for a in divisors(i_sticks) for b in divisors(m) if a * b <= cfg.cores]
        paths = {p: critical_path_us(*p) for p in pairs}
        best = min(paths.values())
        near = [p for p in pairs if paths[p] <= best * (1 + MLP_PATH_SLACK)]
        sn, sm = max(near, key=lambda p: (p[0] * p[1], p[0], -paths[p]))
        reason = (f"MLP: I-slices {sn} x row slices {sm}, the shortest modeled critical path "
                  f"({critical_path_us(sn, sm):.1f} us) of {len(pairs)} splits: weights are broadcast to the "
                  f"row-split cores and re-read once per row tile, x is broadcast to the I-split cores")
    splits = {"N": sn, "M": sm, "K": 1} if has_down else {"K": 1, "M": sm, "N": sn}
    red = "N" if has_down else None
    return WorkDivision(splits, placement(splits, red, k_fast), strategy, reason, None,
                        ("N",) if has_down else ("K",))
