"""What every tiling family's planner shares: the LX fit test, per-core programs, and the KernelSpec bundle.

The planners (:mod:`~spyre_lab.compiler.codegen_rows`, :mod:`~spyre_lab.compiler.codegen_matmul`,
:mod:`~spyre_lab.compiler.codegen_mlp`, :mod:`~spyre_lab.compiler.codegen_attention`) each divide their kernel
and pick tiles their own way; they all test a tile's buffers against LX with :func:`fits_lx`, emit one
program per core with :func:`per_core_programs` (cores with the same slice share one), and bundle the result
with :func:`bundle_spec`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from spyre_lab.compiler.ir import BufferInfo, MatMul, NodeGroup
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.scratchpad import LXBuffer, plan_scratchpad
from spyre_lab.compiler.tiling_common import (
    Operand,
    PartnerInfo,
    align_axes,
)
from spyre_lab.compiler.work_division import (
    WorkDivision,
    ring_hops,
)
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, LXOverflowError, OpKind, TileProgram


def live_bytes_bound(bufs: Sequence[LXBuffer]) -> int:
    """A lower bound on any LX plan's peak: at each step, the buffers alive then that have no in-place parent
    all need addresses of their own. (Tile choosers try many sizes; most fail this cheap test.)"""
    owners = [b for b in bufs if b.in_place_parent is None]
    steps = {b.start for b in owners}
    return max((sum(b.size for b in owners if b.start <= s <= b.end) for s in steps), default=0)


def fits_lx(cfg: SpyreConfig, options: CompileOptions, name: str) -> Callable[[list[LXBuffer]], bool]:
    """Does a tile's buffer list fit LX under the chosen allocator?"""
    budget = cfg.lx_budget_bytes

    def fits(bufs: list[LXBuffer]) -> bool:
        if live_bytes_bound(bufs) > budget:
            return False
        try:
            plan_scratchpad(bufs, cfg.lx_budget_bytes, options.lx_allocator, name)
        except LXOverflowError:
            return False
        return True
    return fits


def _partners(division: WorkDivision, core: int) -> PartnerInfo | None:
    red = division.split_reduction_dim
    if red is None:
        return None
    s = division.slice_of_core()[core]
    return division.slice_coords(s)[red], [division.core_of_slice[q] for q in division.partners(s)], core


def per_core_programs(slices: Sequence[Mapping[str, tuple[int, int]]], division: WorkDivision | None, cfg: SpyreConfig,
              emit: Callable[[dict[str, int], PartnerInfo | None], CoreOps],
              reuse_partners: bool = True) -> list[CoreOps]:
    """Every core's program. Cores with the same slice extents and no partners run the very same ops
    (one shared program), which keeps codegen and the analytic simulator linear in distinct work. Partners
    of a split reduction with the same extents and rank differ only in whom their ring ops talk to: they
    get the first such core's ops with those peers swapped."""
    programs = [CoreOps() for _ in range(cfg.cores)]
    shared: dict[tuple, CoreOps] = {}
    templates: dict[tuple, tuple[CoreOps, PartnerInfo]] = {}
    for c, ranges in enumerate(slices):
        if not ranges:
            continue
        extent = {d: hi - lo for d, (lo, hi) in ranges.items()}
        key = tuple(sorted(extent.items()))
        partners = _partners(division, c) if division is not None else None
        if partners is not None:
            rank_key = (key, partners[0], len(partners[1]))
            if reuse_partners and rank_key in templates:
                programs[c] = _repartnered(*templates[rank_key], partners, cfg.cores)
            else:
                programs[c] = emit(extent, partners)
                templates[rank_key] = (programs[c], partners)
            continue
        if key not in shared:
            shared[key] = emit(extent, None)
        programs[c] = shared[key]
    return programs


def _repartnered(template: CoreOps, source: PartnerInfo, target: PartnerInfo, cores: int) -> CoreOps:
    """``template`` (emitted for partner ``source``) as the program of ``target``, a partner of the same rank
    in another group: the same op objects, except ring transfers go to ``target``'s partners."""
    peer = dict(zip(source[1], target[1]))
    ops = []
    for op in template.ops:
        if op.kind is OpKind.RING_SEND:
            op = op.evolved(peer=peer[op.peer], hops=ring_hops(target[2], peer[op.peer], cores))
        elif op.kind is OpKind.RING_RECV:
            op = op.evolved(peer=peer[op.peer])
        ops.append(op)
    return CoreOps(ops)


class SharedTileProgram(TileProgram):
    """A TileProgram whose cores may share one :class:`CoreOps` (:func:`per_core_programs`): its ring check reads
    each distinct program once. The check pairs every ``ring_recv`` with its ``ring_send``; a kernel with no ring
    op anywhere has nothing to pair, so the 32 cores of one shared 60,000-op program are not walked 32 times."""

    def __post_init__(self) -> None:
        ring = (OpKind.RING_SEND, OpKind.RING_RECV)
        distinct = {id(p): p for p in self.programs}.values()
        if any(op.kind in ring for p in distinct for op in p.ops):
            super().__post_init__()


def address_slots_of(kernel: NodeGroup) -> list[str]:
    seen: list[str] = []
    for b in [*kernel.inputs, *kernel.outputs]:
        if b not in seen:
            seen.append(b)
    return seen


def bundle_spec(kernel: NodeGroup, division: WorkDivision, bufs: list[LXBuffer], programs: list[CoreOps],
          slices: list[dict[str, tuple[int, int]]], cfg: SpyreConfig, options: CompileOptions,
          buffers: Mapping[str, BufferInfo], dims: Mapping[str, int], tiles: Mapping[str, int],
          operands: dict[str, Operand], weights: Sequence[str] = ()) -> KernelSpec:
    """Place the steady-state buffers in LX and bundle everything into a KernelSpec."""
    plan = plan_scratchpad(bufs, cfg.lx_budget_bytes, options.lx_allocator, kernel.name)
    slots = address_slots_of(kernel)
    return KernelSpec(
        name=kernel.name, rule=kernel.rule, ops=[n.op for n in kernel.nodes], division=division, lx_plan=plan,
        tile_kernel=SharedTileProgram.from_programs(kernel.name, programs, cfg.cores), address_slots=slots,
        slices=slices,
        cfg=cfg, dims=dict(dims), tiles=dict(tiles), operands=operands,
        buffers={b: buffers[b] for b in slots}, units={n.op: "pt" if isinstance(n, MatMul) else "sfp"
                                                       for n in kernel.nodes},
        roles=_roles(kernel, buffers, weights))


def _roles(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], weights: Sequence[str]) -> dict[str, str]:
    """SuperDSC role of every address slot: OUTPUT, KERNEL (weights and constants) or INPUT."""
    roles = {}
    for b in address_slots_of(kernel):
        if b in kernel.outputs:
            roles[b] = "OUTPUT"
        elif b in weights or buffers[b].role == "constant":
            roles[b] = "KERNEL"
        else:
            roles[b] = "INPUT"
    return roles


def itemsize(buf: BufferInfo) -> int:
    return torch.empty((), dtype=buf.dtype).element_size() if buf.dtype != torch.bool else 2


def out_operand(b: str, buffers: Mapping[str, BufferInfo], sizes: Mapping[str, int],
                 dims: Sequence[str] = ("B", "M", "N")) -> Operand:
    return Operand(b, tuple(buffers[b].shape), align_axes(buffers[b].shape, list(dims), sizes), itemsize(buffers[b]))
