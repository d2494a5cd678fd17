"""Plan a repeated kernel once: the same node group at the same shapes, options and card gets the same plan.

A decoder stack repeats one layer: its forty ``o_proj + residual`` kernels differ only in the names of
their buffers. Codegen's answer (division, tiles, LX plan, per-core tile programs) depends on a kernel's
structure, never on those names, so :func:`planned_once` keys each plan by a structural signature -- the
nodes' kinds, ops, dims and views, every buffer named by its position of first use with its shape, dtype,
role and layout, the constant masks by content -- plus the options and the config, and answers a repeat by
renaming the first plan's buffers (in its slots, operands, LX plan and tile-op labels) to the new kernel's.
The modeled times of the copy are the original's: the simulator never reads a name.

Only the options a planner reads are in the key (:func:`planning_options`): the fusion rules decide which
kernels exist, not how one is planned, so the same matmul under two rule sets (a waterfall stage with the
``attention`` rule off) is planned once. The planner is handed those same normalised options, so a plan is a
function of its key by construction.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping

import torch

from spyre_lab.compiler.constant_facts import causal_offset
from spyre_lab.compiler.ir import BufferInfo, MatMul, NodeGroup
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.scratchpad import LXPlan
from spyre_lab.compiler.tiling_attention import Attention
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import CoreOps, TileProgram

MAX_PLANS = 1024
"""Plans kept (least recently used dropped past it): ``spyre-lab reproduce`` plans some 400 distinct kernels and
candidates, and its later stages (the waterfall, tensor parallel) reuse the first stages' plans."""
_PLANS: OrderedDict[tuple, tuple[KernelSpec, tuple[str, ...]]] = OrderedDict()
Planner = Callable[[NodeGroup, Mapping[str, BufferInfo], SpyreConfig, CompileOptions], KernelSpec]


def clear() -> None:
    """Forget every remembered plan (``runtime.process_state.reset("caches")`` clears them with the other caches)."""
    _PLANS.clear()


def stats() -> dict[str, int]:
    return {"plans": len(_PLANS)}


def planned_once(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig, options: CompileOptions,
                 plan: Planner) -> KernelSpec:
    """``plan(kernel, ...)``, or a renamed copy of the plan of a structurally identical kernel planned before."""
    options = planning_options(options)
    key, names = signature(kernel, buffers, cfg, options)
    hit = _PLANS.get(key)
    if hit is None:
        spec = plan(kernel, buffers, cfg, options)
        _PLANS[key] = (spec, (spec.name, *names))
        while len(_PLANS) > MAX_PLANS:
            _PLANS.popitem(last=False)
        return _renamed(spec, {}, spec.name, buffers)
    _PLANS.move_to_end(key)
    spec, old_names = hit
    return _renamed(spec, dict(zip(old_names, (kernel.name, *names))), kernel.name, buffers)


# --- the structural signature -------------------------------------------------------------------------

NOT_READ_BY_PLANNERS = (("fusion", frozenset()), ("timing", "analytic"), ("max_bundle_tensors", 2))
"""Options that shape the schedule (which kernels there are), the timing mode of a whole Program, and the bundle
limit the scheduler enforces: no planner reads them, so they are set to one value before keying and planning."""


def planning_options(options: CompileOptions) -> CompileOptions:
    """``options`` as a planner sees them: every field a planner reads, the others at one fixed value."""
    return options.replace(**dict(NOT_READ_BY_PLANNERS))


def signature(kernel: NodeGroup, buffers: Mapping[str, BufferInfo], cfg: SpyreConfig,
              options: CompileOptions) -> tuple[tuple, tuple[str, ...]]:
    """(key, buffer names in order of first use): two kernels with equal keys get plans equal up to names."""
    order: dict[str, int] = {}

    def idx(name: str) -> int:
        return order.setdefault(name, len(order))

    nodes = []
    for position, n in enumerate(kernel.nodes):
        entry = (type(n).__name__, n.op, tuple(idx(b) for b in n.inputs), idx(n.output), tuple(n.dims.items()),
                 tuple(n.reduction_dims), n.stick_dim,
                 (n.b, n.m, n.n, n.k) if isinstance(n, MatMul) else None,
                 _views_key(kernel.views_of(n)), position)
        if isinstance(n, Attention):
            entry += (_attention_part(n, idx),)
        nodes.append(entry)
    groups = tuple(tuple(idx(b) for b in names) for names in (kernel.inputs, kernel.outputs, kernel.lx_resident))
    bufs = tuple((tuple(buffers[b].shape), buffers[b].dtype, buffers[b].role, _layout_key(buffers[b].layout))
                 for b in order)
    return (kernel.rule, tuple(nodes), groups, bufs, options, cfg), tuple(order)


def _views_key(views: tuple) -> tuple | None:
    """How a node reads its inputs, None when every read is plain: codegen reads a missing view entry and a
    tuple of Nones alike (``NodeGroup.views_of``), so a kernel priced without views and the same kernel named
    with its plain reads share a plan."""
    return views if any(v is not None for v in views) else None


def _attention_part(n: Attention, idx: Callable[[str], int]) -> tuple:
    reads = tuple((idx(r.buffer), tuple(r.meta.shape), tuple(r.meta.stride()), r.meta.storage_offset(),
                   tuple(r.axes), r.is_identity) for r in n.reads)
    consts = tuple((idx(b), _content_key(t)) for b, t in n.const_extras.items())
    members = tuple((type(m).__name__, m.op) for m in n.members)
    return (n.score_ops, tuple(idx(b) for b in n.extras), consts, n.additive_only, n.zero_masked_rows, reads,
            members)


def _content_key(t: torch.Tensor) -> tuple:
    """A constant mask by what it holds: a causal mask by its offset, anything else by a digest of its bytes."""
    offset = causal_offset(t) if t.dim() >= 2 else None
    if offset is not None:
        return ("causal", offset, tuple(t.shape), t.dtype)
    raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
    return ("bytes", tuple(t.shape), t.dtype, hashlib.blake2b(raw, digest_size=16).hexdigest())


def _layout_key(layout: object) -> object:
    if layout is None:
        return None
    try:
        hash(layout)
        return layout
    except TypeError:
        return repr(layout)


# --- renaming a plan ----------------------------------------------------------------------------------

def _renamed(spec: KernelSpec, names: dict[str, str], name: str, buffers: Mapping[str, BufferInfo]) -> KernelSpec:
    """A fresh KernelSpec equal to ``spec`` with every name in ``names`` replaced (its own op lists, so that
    renaming one program's kernel never touches another's)."""
    moved = {old: new for old, new in names.items() if old != new}
    sub = _substitution(moved)
    lx = spec.lx_plan
    plan = LXPlan({sub(k): v for k, v in lx.offsets.items()}, {sub(k): v for k, v in lx.sizes.items()}, lx.peak,
                  lx.budget, lx.strategy, {sub(k): v for k, v in lx.lifetimes.items()})
    slots = [names.get(b, b) for b in spec.address_slots]
    copy = KernelSpec(
        name=name, rule=spec.rule, ops=list(spec.ops), division=spec.division,
        lx_plan=plan, tile_kernel=RenamedTileProgram(name, spec.tile_kernel, sub if moved else None),
        address_slots=slots,
        slices=[dict(s) for s in spec.slices], cfg=spec.cfg, dims=dict(spec.dims), tiles=dict(spec.tiles),
        operands={names.get(b, b): dataclasses.replace(op, buffer=names.get(op.buffer, op.buffer))
                  for b, op in spec.operands.items()},
        buffers={b: buffers[b] for b in slots if b in buffers}, units=dict(spec.units),
        roles={names.get(b, b): r for b, r in spec.roles.items()}, analytic=spec.analytic)
    return copy


class RenamedTileProgram(TileProgram):
    """A planned kernel's tile program under new buffer names, renamed when first read: the simulator's times
    are shared (no name reaches the model), so a repeated layer that is only compiled and timed never pays
    for relabelling its ops; a view, a trace or a launch that reads them gets them renamed."""

    def __init__(self, name: str, source: TileProgram, sub: Callable[[str], str] | None) -> None:
        self.name = name
        self._source, self._sub, self._programs = source, sub, None

    @property
    def programs(self) -> list[CoreOps]:  # type: ignore[override]
        if self._programs is None:
            copies: dict[int, CoreOps] = {}
            for p in self._source.programs:      # cores that shared one program still share its copy
                if id(p) not in copies:
                    ops = p.ops if self._sub is None else [_renamed_op(op, self._sub) for op in p.ops]
                    copies[id(p)] = CoreOps(list(ops))
            self._programs = [copies[id(p)] for p in self._source.programs]
        return self._programs

    @programs.setter
    def programs(self, value: list[CoreOps]) -> None:
        self._programs = value


def _substitution(moved: Mapping[str, str]) -> Callable[[str], str]:
    if not moved:
        return lambda s: s
    pattern = re.compile(r"(?<![\w])(" + "|".join(re.escape(k) for k in sorted(moved, key=len, reverse=True))
                         + r")(?![\w])")
    memo: dict[str, str] = {}

    def sub(s: str) -> str:
        if s not in memo:
            memo[s] = pattern.sub(lambda m: moved[m.group(1)], s)
        return memo[s]
    return sub


def _renamed_op(op, sub: Callable[[str], str]):
    name, out, tag = sub(op.name), op.out and sub(op.out), op.tag and sub(op.tag)
    if name == op.name and out == op.out and tag == op.tag:
        return op
    return op.evolved(name=name, out=out, tag=tag)
