"""Core-by-core emulation of one kernel: each core computes its slice, split reductions meet over the ring.

A kernel whose work division splits a reduction (a matmul's K, or the reduced dim of a lone sum / mean /
amax / amin) is computed the way the cores compute it: every core its fp32 partial over its share of the
reduced dim, partners' partials combined in slice order (the ring reduction), rounded once to the buffer
dtype by the partner that stores the block, which then runs the kernel's epilogue on it. Splitting changes
the rounding, which is why the emulation exists: its numbers are the device's order of operations.

What it shares between cores never changes a number: each core's matmul or reduction is its own ATen call
on an operand identical to the one a per-core conversion would give (``core_operands``), or one ``bmm`` item
where a probe showed that to be the same call's result bit for bit (``batched_cores``); combining and
rounding are elementwise, so doing them on whole rows of blocks at once gives every element the same
operations in the same order; outputs are assembled by copies. ``tests/compiler/test_executor_split.py``
holds the plain per-core emulation and checks all of this bit for bit on random shapes and splits.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spyre_lab.compiler.access import Access
from spyre_lab.compiler.batched_cores import KeptStacks, Tiles, batch_is_exact
from spyre_lab.compiler.core_operands import OnDemand, Ranges, SharedOperands, core_ranges, narrowed, plan_operands
from spyre_lab.compiler.ir import IRNode, MatMul, NodeGroup, Reduction
from spyre_lab.compiler.program import Program
from spyre_lab.compiler.same_tensor import SameTensorCache
from spyre_lab.device.layout import contiguous_strides


@dataclass
class CoreTile:
    """What one core computed in one kernel: its slice and the values it produced (LX and DRAM)."""

    core: int
    slice: dict[str, tuple[int, int]]
    values: dict[str, torch.Tensor]


def run_node(node: IRNode, env: dict[str, torch.Tensor]) -> torch.Tensor:
    """One node on whole tensors: its output from its inputs in ``env``."""
    return node.compute(*[env[b] for b in node.inputs])


def _split_dims(kernel: NodeGroup, slices: list[dict[str, tuple[int, int]]]) -> set[str]:
    """The anchor dims some core does not cover whole."""
    anchor = kernel.anchor
    return {d for s in slices for d, (a, b) in s.items() if (a, b) != (0, anchor.dims.get(d, -1))}


def _sliceable(kernel: NodeGroup, access: dict[str, Access], slices: list[dict[str, tuple[int, int]]]) -> bool:
    """Can every node of the kernel be computed per core from the anchor's slices?"""
    anchor = kernel.anchor
    split = _split_dims(kernel, slices)
    if not split:
        return False
    produced = {n.output for n in kernel.nodes}
    for _i, node in enumerate(kernel.nodes):
        for d in split:
            if node.dims.get(d) != anchor.dims.get(d) and not (d == "K" and node is not anchor and d not in node.dims):
                return False
            if d in node.reduction_dims and not (node is anchor and ((isinstance(node, MatMul) and d == "K")
                                                                     or _lone_split_reduction(kernel))):
                return False
        if isinstance(node, MatMul) and node is not anchor:
            return False
        if any(r.buffer in produced and not r.is_identity for r in access[node.name].reads):
            return False
    return not ("K" in split and kernel.nodes[0] is not anchor)


PARTIAL_COMBINE = {"matmul": torch.add, "sum": torch.add, "mean": torch.add, "amax": torch.maximum,
                   "amin": torch.minimum}
"""How partners' partial results meet when a reduced dim is split across cores (the ring reduction)."""


def _lone_split_reduction(kernel: NodeGroup) -> bool:
    node = kernel.nodes[0]
    return len(kernel.nodes) == 1 and isinstance(node, Reduction) and node.op in PARTIAL_COMBINE


def _partial(node: IRNode, ins: list[torch.Tensor], access: Access) -> torch.Tensor:
    """A core's fp32 partial result over its share of the reduced dims (kept as size-1 dims)."""
    if isinstance(node, MatMul):
        return torch.matmul(ins[0].float(), ins[1].float())
    axes = [i for i, a in enumerate(access.reads[0].axes) if a in node.reduction_dims]
    x = ins[0]
    if node.op in ("amax", "amin"):
        return getattr(x, node.op)(dim=axes, keepdim=True)
    return x.float().sum(dim=axes, keepdim=True)


def _finish(node: IRNode, total: torch.Tensor, access: Access, dtype: torch.dtype) -> torch.Tensor:
    """Partial sums combined: scale a mean, round once to the buffer dtype, drop reduced dims if not kept."""
    if node.op == "mean":
        total = total / math.prod(node.dims[d] for d in node.reduction_dims)
    total = total.to(dtype)
    if isinstance(node, Reduction) and len(access.out_axes) < total.dim():
        total = total.squeeze([i for i, a in enumerate(access.reads[0].axes) if a in node.reduction_dims])
    return total


def _narrow(t: torch.Tensor, axes: Sequence[str | None], s: dict[str, tuple[int, int]],
            full: dict[str, int]) -> torch.Tensor:
    for i, name in enumerate(axes):
        if name in s and t.shape[i] == full[name] and s[name] != (0, full[name]):
            a, b = s[name]
            t = t.narrow(i, a, b - a)
    return t


def _core_values(nodes: Sequence[IRNode], anchor: IRNode, access: dict[str, Access], env: dict[str, torch.Tensor],
                 s: dict[str, tuple[int, int]], local: dict[str, torch.Tensor] | None = None,
                 ) -> dict[str, torch.Tensor]:
    """One core's computation of its slice; a K-split matmul leaves its fp32 partial sum."""
    local = {} if local is None else local
    for node in nodes:
        acc = access[node.name]
        ins = []
        for r in acc.reads:
            if r.buffer in local:
                ins.append(local[r.buffer])
            else:
                ins.append(_narrow(r.apply(env[r.buffer]), r.axes, s, node.dims))
        if node is anchor and any(d in node.reduction_dims for d in s):
            local[node.output] = _partial(node, ins, acc)
        else:
            local[node.output] = _narrow(acc.op_fn(*ins), acc.out_axes, s, node.dims)
    return local


# --- the plan: what a kernel and its slices decide once ------------------------------------------

@dataclass
class _Rows:
    """Blocks that tile one axis of a lone split reduction's output, each with the same number of partners:
    the partials of every block's k-th partner concatenated along that axis form one row, and the rows are
    combined and rounded as whole tensors."""

    blocks: list[list[int]]          # the blocks in order along the axis
    partial_axis: int                # the axis in the partials' layout
    axis: int                        # the axis in the output's layout
    order: list[int] = field(init=False)  # the cores partner-major: every block's first partner, then second...

    def __post_init__(self) -> None:
        self.order = [b[k] for k in range(len(self.blocks[0])) for b in self.blocks]


@dataclass
class _SlicedPlan:
    """What :func:`_run_sliced` derives from a kernel and its slices alone, kept while both are the same objects
    (a runtime launches the kernel again and again)."""

    split: set[str]
    cores: list[tuple[int, dict, dict]]          # per busy core: index, its slice, its slice of the split dims
    blocks: list[list[int]] | None               # split reduction: positions in ``cores`` of each output block's
    #                                              partners in reduction order (the leader first); else None
    out_ranges: dict[str, list[Ranges]]          # per kernel output: each core's part of it
    rows: _Rows | None = None                    # the blocks as rows, where they form them
    operands: list[dict[tuple, SharedOperands | OnDemand]] = field(default_factory=list)  # per anchor read
    kept: list[SameTensorCache] = field(default_factory=list)   # per anchor read: its last source's operands
    tilings: list[dict[tuple, Tiles | None]] = field(default_factory=list)  # per matmul read: its stack, by layout
    kept_stacks: list[KeptStacks] = field(default_factory=list)           # per matmul read: its last stacks

    def stacked_products(self, kernel: NodeGroup, access: Access, env: dict[str, torch.Tensor]
                         ) -> torch.Tensor | None:
        """Every core's product in one ``bmm`` over the stacked operands, cores in :attr:`_Rows.order`, where
        that is each core's own product bit for bit (``batched_cores``); else None."""
        if not self.tilings:
            self.tilings = [{} for _ in access.reads]
            self.kept_stacks = [KeptStacks() for _ in access.reads]
        found = []                             # per read: its source, its stack if kept (else its view), tiling
        for r, tilings, kept in zip(access.reads, self.tilings, self.kept_stacks):
            source = env[r.buffer]
            made = kept.get(source)            # the very source unchanged: its layout, tiling and stack as before
            if made is not None:
                found.append((source, made[0], None, made[1]))
                continue
            x = r.apply(source)
            key = (x.shape, x.stride(), x.dtype)
            if key not in tilings:
                ranges = [core_ranges(r.axes, x.shape, kernel.anchor.dims, self.cores[j][2]) for j in self.rows.order]
                tilings[key] = Tiles.of(x, ranges)
            if tilings[key] is None:
                return None
            found.append((source, None, x, tilings[key]))
        if not batch_is_exact(found[0][3].own, found[1][3].own, len(self.cores)):
            return None
        stacks = []
        for (source, stacked, x, tiles), kept in zip(found, self.kept_stacks):
            if stacked is None:
                stacked = tiles(x)
                kept.keep(source, (stacked, tiles))
            stacks.append(stacked)
        return torch.bmm(stacks[0], stacks[1])

    def anchor_operands(self, kernel: NodeGroup, access: Access, env: dict[str, torch.Tensor]
                        ) -> list[Sequence[torch.Tensor]]:
        """Per anchor read, every core's operand: what ``_core_values`` would narrow (and ``_partial`` convert),
        made with one fp32 conversion per group of cores that can share it (see ``core_operands``).

        The operands made from a source are kept with it (:attr:`kept`, see ``same_tensor``): when the next launch
        reads the very same tensor unchanged (a weight), they are the same values in the same layout, so its
        conversion is not made again."""
        convert = isinstance(kernel.anchor, MatMul) or kernel.anchor.op in ("sum", "mean")
        if not self.operands:
            self.operands = [{} for _ in access.reads]
            self.kept = [SameTensorCache() for _ in access.reads]
        out = []
        for r, plans, kept in zip(access.reads, self.operands, self.kept):
            source = env[r.buffer]
            made = kept.get(source)
            if made is not None:
                out.append(made)
                continue
            x = r.apply(source)
            key = (x.shape, x.stride(), x.dtype)
            plan = plans.get(key)
            if plan is None:
                ranges = [core_ranges(r.axes, x.shape, kernel.anchor.dims, own) for _, _, own in self.cores]
                plan = plans[key] = plan_operands(x, ranges, convert)
            made = plan(x)
            if isinstance(plan, SharedOperands):      # (an OnDemand plan converts lazily: nothing made to keep)
                kept.keep(source, made)
            else:
                kept.forget()
            out.append(made)
        return out


_SLICED: dict[int, tuple[weakref.ref, list, _SlicedPlan]] = {}


def _sliced_plan(kernel: NodeGroup, program: Program, slices: list[dict[str, tuple[int, int]]]) -> _SlicedPlan:
    cached = _SLICED.get(id(kernel))
    if cached is None or cached[0]() is not kernel or cached[1] is not slices:
        if cached is None:
            weakref.finalize(kernel, _SLICED.pop, id(kernel), None)   # dropped with the kernel
        cached = _SLICED[id(kernel)] = (weakref.ref(kernel), slices, _make_plan(kernel, program, slices))
    return cached[2]


def _make_plan(kernel: NodeGroup, program: Program, slices: list[dict[str, tuple[int, int]]]) -> _SlicedPlan:
    anchor = kernel.anchor
    split = _split_dims(kernel, slices)
    partial_dims = [d for d in anchor.dims if d in split and d in anchor.reduction_dims]
    cores = [(c, s, {d: r for d, r in s.items() if d in split}) for c, s in enumerate(slices) if s]
    blocks = None
    if partial_dims:                             # partners: the cores that share a block of the kept dims
        kept = [d for d in anchor.dims if d not in partial_dims]
        by_block: dict[tuple, list[int]] = {}
        for j, (_, s, _) in enumerate(cores):
            by_block.setdefault(tuple(s.get(d, (0, anchor.dims[d])) for d in kept), []).append(j)
        blocks = [sorted(js, key=lambda j: tuple(cores[j][1][d][0] for d in partial_dims))
                  for js in by_block.values()]
    out_ranges = {}
    for name in kernel.outputs:
        shape = program.buffers[name].shape
        node = next(n for n in kernel.nodes if n.output == name)
        axes = program.access[node.name].out_axes
        out_ranges[name] = [tuple(s[a] if a in split and shape[i] == node.dims[a] and s[a] != (0, shape[i]) else None
                                  for i, a in enumerate(axes)) for _, s, _ in cores]
    plan = _SlicedPlan(split, cores, blocks, out_ranges)
    plan.rows = _rows(kernel, program, plan)
    return plan


def _rows(kernel: NodeGroup, program: Program, plan: _SlicedPlan) -> _Rows | None:
    """The blocks as rows (see :class:`_Rows`), if the kernel is a lone split reduction whose blocks tile one
    output axis (or there is one block), every block with the same number (>1) of partners."""
    anchor = kernel.anchor
    if plan.blocks is None or len(kernel.nodes) > 1 or len({len(b) for b in plan.blocks}) != 1 \
            or len(plan.blocks[0]) < 2:
        return None
    ranges = plan.out_ranges[anchor.output]
    axes = {i for b in plan.blocks for i, r in enumerate(ranges[b[0]]) if r is not None}
    if not axes:
        return _Rows(plan.blocks, 0, 0) if len(plan.blocks) == 1 else None
    if len(axes) > 1:
        return None
    axis = axes.pop()
    ordered = sorted(plan.blocks, key=lambda b: ranges[b[0]][axis][0])
    bounds = [ranges[b[0]][axis] for b in ordered]
    shape = program.buffers[anchor.output].shape
    if bounds[0][0] != 0 or bounds[-1][1] != shape[axis] or any(a[1] != b[0] for a, b in itertools.pairwise(bounds)):
        return None
    access = program.access[anchor.name]
    name = access.out_axes[axis]
    layout = list(access.out_axes if isinstance(anchor, MatMul) else access.reads[0].axes)
    if name is None or layout.count(name) != 1:
        return None
    return _Rows(ordered, layout.index(name), axis)


# --- running it ----------------------------------------------------------------------------------

def _run_sliced(kernel: NodeGroup, program: Program, env: dict[str, torch.Tensor],
                slices: list[dict[str, tuple[int, int]]], keep: bool) -> list[CoreTile]:
    access = program.access
    anchor = kernel.anchor
    plan = _sliced_plan(kernel, program, slices)
    if plan.blocks is None:
        tiles = [CoreTile(c, dict(s), _core_values(kernel.nodes, anchor, access, env, own)) for c, s, own in plan.cores]
        done = set()
    else:
        tiles, done = _reduce_across_cores(kernel, program, env, plan, keep)
    for name, ranges in plan.out_ranges.items():
        if name not in done:
            info = program.buffers[name]
            env[name] = _gather(info.shape, info.dtype, [(r, t.values[name]) for t, r in zip(tiles, ranges)
                                                         if name in t.values])
    return tiles if keep else []


def _reduce_across_cores(kernel: NodeGroup, program: Program, env: dict[str, torch.Tensor],
                         plan: _SlicedPlan, keep: bool) -> tuple[list[CoreTile], set[str]]:
    """Every core's fp32 partial, then the ring reduction: partners' partials combined in slice order, rounded
    once by the block's leader, which runs the epilogue on its block. Returns the tiles (none if not ``keep``
    and the rows hold the whole result) and the outputs already in ``env``."""
    access, anchor = program.access, kernel.anchor
    acc = access[anchor.name]
    out, partial = anchor.output, anchor.output + ".partial"
    combine = PARTIAL_COMBINE[anchor.op]
    dtype = program.buffers[out].dtype
    rows = plan.rows
    stacked = plan.stacked_products(kernel, acc, env) if isinstance(anchor, MatMul) and rows is not None else None
    if stacked is not None:                    # every core's product from one call (see batched_cores)
        partials = _unstacked(stacked, rows.order) if keep else []
        whole = _combine_stacked(rows, stacked, combine, anchor, acc, dtype)
    else:
        operands = plan.anchor_operands(kernel, acc, env)
        if isinstance(anchor, MatMul):         # its operands are fp32 already: _partial's .float() would be a no-op
            partials = [torch.matmul(a, b) for a, b in zip(operands[0], operands[1])]
        else:
            partials = [_partial(anchor, [ins[j] for ins in operands], acc) for j in range(len(plan.cores))]
        if rows is not None:
            whole = _combine_rows(rows, partials, combine, anchor, acc, dtype)
    if rows is not None and whole.shape == program.buffers[out].shape:
        env[out] = whole
        if not keep:
            return [], {out}
        tiles = [CoreTile(c, dict(s), {}) for c, s, _ in plan.cores]
        for block in rows.blocks:
            leader = tiles[block[0]]
            r = plan.out_ranges[out][block[0]]
            leader.values[out] = narrowed(whole, r)
            for j in block:
                tiles[j].values[partial] = partials[j]
        return tiles, {out}
    if stacked is not None and not partials:
        partials = _unstacked(stacked, rows.order)
    tiles = [CoreTile(c, dict(s), {}) for c, s, _ in plan.cores]
    for block in plan.blocks or ():
        total = partials[block[0]]
        for j in block[1:]:
            total = combine(total, partials[j])
        leader = tiles[block[0]]               # the partner that stores finishes the block and runs the epilogue
        leader.values[out] = _finish(anchor, total, acc, dtype)
        for j in block:
            tiles[j].values[partial] = partials[j]
        if len(kernel.nodes) > 1:
            s = {d: r for d, r in plan.cores[block[0]][2].items() if d not in anchor.reduction_dims}
            _core_values(kernel.nodes[1:], anchor, access, env, s, local=leader.values)
    return tiles, set()


def _combine_rows(rows: _Rows, partials: list[torch.Tensor], combine, anchor: IRNode, acc: Access,
                  dtype: torch.dtype) -> torch.Tensor:
    """The ring reduction on rows: every element meets its partners' partials in the same order as block by
    block (``combine`` is elementwise), then is rounded once."""
    total = None
    for k in range(len(rows.blocks[0])):
        parts = [partials[b[k]] for b in rows.blocks]
        row = parts[0] if len(parts) == 1 else torch.cat(parts, dim=rows.partial_axis)
        total = row if total is None else combine(total, row)
    return _finish(anchor, total, acc, dtype)


def _combine_stacked(rows: _Rows, stacked: torch.Tensor, combine, anchor: IRNode, acc: Access,
                     dtype: torch.dtype) -> torch.Tensor:
    """:func:`_combine_rows` on the cores' products stacked partner-major (``[partners * blocks, m, n]``): the
    k-th partners of all blocks are one slab, combined slab by slab in partner order (elementwise, so every
    element meets the same values in the same order), then laid out as the row is and rounded once."""
    slabs = stacked.view(len(rows.blocks[0]), len(rows.blocks), *stacked.shape[1:]).unbind(0)
    total = slabs[0]
    for slab in slabs[1:]:
        total = combine(total, slab)
    axis = rows.partial_axis
    whole = _finish(anchor, total.movedim(0, axis).flatten(axis, axis + 1), acc, dtype)
    if whole.stride() != contiguous_strides(tuple(whole.shape)):   # laid out as the concatenated row is: dense
        whole = torch.empty(whole.shape, dtype=whole.dtype).copy_(whole)
    return whole


def _unstacked(stacked: torch.Tensor, order: list[int]) -> list[torch.Tensor]:
    """Per core (in plan order), its product: a view of the stack, which holds the cores in ``order``."""
    position = {j: i for i, j in enumerate(order)}
    return [stacked[position[j]] for j in range(len(order))]


def _gather(shape: tuple[int, ...], dtype: torch.dtype, parts: list[tuple[Ranges, torch.Tensor]]) -> torch.Tensor:
    """A whole buffer from the cores' parts of it (written in core order). Parts that tile one axis exactly,
    in the buffer's dtype, are concatenated in one call; anything else is copied part by part."""
    axes = {i for r, _ in parts for i, x in enumerate(r) if x is not None}
    if len(axes) == 1 and all(v.dtype == dtype for _, v in parts):
        i = axes.pop()
        ordered = sorted(parts, key=lambda p: p[0][i][0] if p[0][i] else -1)
        end = 0
        for r, v in ordered:
            if r[i] is None or r[i][0] != end or v.shape != (*shape[:i], r[i][1] - end, *shape[i + 1:]):
                break
            end = r[i][1]
        else:
            if end == shape[i]:
                return torch.cat([v for _, v in ordered], dim=i)
    full = torch.empty(shape, dtype=dtype)
    for r, v in parts:
        narrowed(full, r).copy_(v)
    return full


def per_core_slices(kernel: NodeGroup, program: Program,
                    slices: Sequence[dict[str, tuple[int, int]]] | None) -> list[dict[str, tuple[int, int]]] | None:
    """The slices :func:`run_kernel` computes core by core (None: the kernel is computed whole). A runtime that
    launches the kernel many times decides once and passes ``checked=True``."""
    if slices and _sliceable(kernel, program.access, list(slices)):
        return list(slices)
    return None


def run_kernel(kernel: NodeGroup, program: Program, env: dict[str, torch.Tensor],
               slices: Sequence[dict[str, tuple[int, int]]] | None = None, *, checked: bool = False,
               tiles: bool = True) -> list[CoreTile]:
    """Compute one kernel's outputs into ``env`` (buffer name -> tensor). With the kernel's per-core
    ``slices`` (``KernelSpec.slices``) it computes core by core and returns what each core produced.
    ``checked``: ``slices`` came from :func:`per_core_slices` (no need to ask again whether they apply).
    ``tiles=False``: the caller wants only ``env`` (the same numbers; no per-core views are made)."""
    if slices and checked:
        return _run_sliced(kernel, program, env, slices if isinstance(slices, list) else list(slices), tiles)
    if slices and _sliceable(kernel, program.access, list(slices)):     # (the same list again: the plan is kept)
        return _run_sliced(kernel, program, env, slices if isinstance(slices, list) else list(slices), tiles)
    for node in kernel.nodes:                # run_node, inlined: every launch of every kernel comes here
        env[node.output] = node.compute(*[env[b] for b in node.inputs])
    return []
