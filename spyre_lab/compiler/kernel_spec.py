"""KernelSpec: one scheduled kernel (a SuperDSC bundle) - what every core does and where every buffer lives.

:func:`~spyre_lab.compiler.codegen.generate_kernel` builds it; the executor runs its per-core tile
programs on the simulator, and ``to_json()`` writes it down in the shape of a SuperDSC document with
symbolic DRAM addresses the runtime patches at launch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spyre_lab.compiler.ir import BufferInfo
from spyre_lab.compiler.layout_propagation import stored_dtype
from spyre_lab.compiler.scratchpad import LXPlan
from spyre_lab.compiler.tiling_common import Operand, tile_grid
from spyre_lab.compiler.work_division import WorkDivision
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.isa import OpKind, TileProgram
from spyre_lab.device.layout import StickLayout

if TYPE_CHECKING:
    from spyre_lab.device.sim import SimResult


@dataclass(eq=False)
class AnalyticTiming:
    """A plan's analytic timing, filled in by whichever kernel of the plan is timed first.

    Every copy of one plan (:mod:`~spyre_lab.compiler.plan_memo` renames a repeated kernel's plan) holds the
    very same object: the analytic model never reads a buffer name, so the copies' timings are one result,
    computed once. An event trace names its ops, so each kernel keeps its own (``KernelSpec.traces``).
    """

    result: SimResult | None = None


@dataclass
class KernelSpec:
    """One scheduled kernel (a SuperDSC bundle): what every core does and where every buffer lives."""

    name: str
    rule: str
    ops: list[str]
    division: WorkDivision
    lx_plan: LXPlan
    tile_kernel: TileProgram
    address_slots: list[str]
    slices: list[dict[str, tuple[int, int]]]
    cfg: SpyreConfig = field(repr=False)
    dims: dict[str, int] = field(default_factory=dict)
    tiles: dict[str, int] = field(default_factory=dict)
    operands: dict[str, Operand] = field(default_factory=dict, repr=False)
    buffers: dict[str, BufferInfo] = field(default_factory=dict, repr=False)
    units: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    analytic: AnalyticTiming = field(default_factory=AnalyticTiming, repr=False, compare=False)
    traces: dict[str, SimResult] = field(default_factory=dict, init=False, repr=False, compare=False)

    # --- totals read off the tile programs -----------------------------------------------------
    @property
    def flops(self) -> int:
        return self.tile_kernel.total("flops")

    @property
    def bytes_in(self) -> int:
        return self.tile_kernel.total("nbytes", OpKind.LOAD)

    @property
    def bytes_out(self) -> int:
        return self.tile_kernel.total("nbytes", OpKind.STORE)

    @property
    def ring_bytes(self) -> int:
        return self.tile_kernel.total("nbytes", OpKind.RING_SEND)

    def simulate(self, mode: str = "analytic") -> SimResult:
        """Modeled timing of this kernel on ``cfg`` (cached per mode): the analytic one shared with every copy of
        its plan (``analytic``), an event-mode trace this kernel's own (``traces``)."""
        from spyre_lab.device.sim import simulate

        if mode == "analytic":
            if self.analytic.result is None:
                self.analytic.result = simulate(self.tile_kernel, self.cfg, mode="analytic", trace=False)
            return self.analytic.result
        if mode not in self.traces:
            self.traces[mode] = simulate(self.tile_kernel, self.cfg, mode=mode, trace=mode == "event")
        return self.traces[mode]

    def explain(self) -> str:
        d = self.division
        busy = len(self.tile_kernel.active_cores)
        lines = [
            f"kernel {self.name} ({self.rule}): {' -> '.join(self.ops)}",
            f"  work division {d.strategy}: {dict(d.splits)} on {busy} of {self.cfg.cores} cores - {d.reason}",
            f"  tiles per core: {self.tiles}; LX {self.lx_plan.peak:,} of {self.lx_plan.budget:,} B "
            f"({self.lx_plan.strategy})",
            f"  cores load {self.bytes_in:,} B and store {self.bytes_out:,} B; ring {self.ring_bytes:,} B; "
            f"{self.flops:,} FLOP; {self.tile_kernel.num_ops} tile ops",
            f"  address slots patched at launch: {', '.join(self.address_slots)}",
        ]
        groups = sorted({(op.out.split("[")[0], op.share) for p in self.tile_kernel.programs for op in p
                         if op.kind is OpKind.LOAD and op.share > 1 and op.out})
        if groups:
            cap = self.cfg.dram_broadcast_cores
            served = sum(op.nbytes / min(op.share, cap) for p in self.tile_kernel.programs for op in p
                         if op.kind is OpKind.LOAD)
            lines.append(f"  DRAM broadcasts: {', '.join(f'{b} to {g} cores' for b, g in groups)} "
                         f"(DRAM serves {served:,.0f} of the {self.bytes_in:,} B loaded; <= {cap} cores per read)")
        kept = sorted({n.split("[")[0] for n in self.lx_plan.offsets} - set(self.address_slots) - {"acc", "psum_in",
                                                                                                "out_acc"})
        if kept:
            lines.append(f"  stays in LX (never touches DRAM): {', '.join(kept)}")
        hops = sorted({op.hops for p in self.tile_kernel.programs for op in p if op.kind is OpKind.RING_SEND})
        if hops:
            lines.append(f"  partial results of split {d.split_reduction_dim} meet over the ring, {hops} hop(s) apart")
        return "\n".join(lines)

    def to_ktir(self, nodes: Sequence[Any] = ()) -> str:
        """This kernel as KTIR text (one ``func.func``); ``nodes`` are its LoopIR nodes (``program.kernels[i].nodes``),
        which hold the compute a KernelSpec alone does not. Raises ``KTIRUnsupported`` for a form not written out."""
        from spyre_lab.compiler.ktir_export import kernel_to_ktir

        return kernel_to_ktir(self, nodes)

    # --- SuperDSC-like document ----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """A SuperDSC-shaped description: core folding, work slices, data stages, buffers, addresses, ops."""
        d = self.division
        busy = [c for c, s in enumerate(self.slices) if s]
        slice_of = d.slice_of_core()
        last_tile = {}
        for core in busy[:1]:
            extent = {k: hi - lo for k, (lo, hi) in self.slices[core].items()}
            grid = tile_grid(extent, {k: self.tiles.get(k, v) for k, v in extent.items()})
            last_tile = grid[-1] if grid else {}
        stage = {
            "ss_": dict(self.tiles),
            "el_": last_tile,
            "perCore_": {str(c): {k: hi - lo for k, (lo, hi) in self.slices[c].items()} for c in busy},
        }
        labeled, schedule, info = [], [], {}
        for i, name in enumerate(self.address_slots):
            role = self.roles.get(name, "INPUT")
            buf = self.buffers.get(name)
            fmt = str(buf.dtype).replace("torch.", "") if buf else "float16"
            labeled.append({"ldsIdx_": i, "dsName_": name, "dsType_": role, "format_": fmt,
                            "memOrg_": {"hbm": {"isPresent": 1, "slot": name}}})
            schedule.append(self._hbm_allocate(name, busy))
            op = self.operands.get(name)
            if op is not None and role not in info:
                eps = self.cfg.stick_bytes // op.itemsize
                info[role] = {"name_": name, "layoutDimOrder_": [a or "_" for a in op.axes],
                              "stickDimOrder_": [op.axes[-1] or "_"] if op.axes else [], "stickSize_": [eps]}
        for name, offset in self.lx_plan.offsets.items():
            labeled.append({"ldsIdx_": len(labeled), "dsName_": name, "dsType_": "INTERMEDIATE",
                            "memOrg_": {"lx": {"isPresent": 1, "offset": offset, "size": self.lx_plan.sizes[name]}}})
            schedule.append({"nodeType_": "allocate", "name_": name, "component_": "lx",
                             "startAddressCoreCorelet_": {"dim_prop_func": [],
                                                          "data_": {str(c): offset for c in busy}}})
        compute = [{"exUnit": self.units.get(op, "sfp"), "opFuncName": op, "fidelity": "regular"} for op in self.ops]
        return {
            "kernel": self.name,
            "rule": self.rule,
            "coreFoldProp_": {"factor_": d.cores_used, "label_": "core"},
            "coreletFoldProp_": {"factor_": 1, "label_": "corelet"},
            "numWkSlicesPerDim_": dict(d.splits),
            "coreIdToWkSlice_": {str(c): d.slice_coords(slice_of[c]) for c in busy},
            "dscs_": [{self.name: {
                "N_": dict(self.dims),
                "dataStageParam_": {"0": stage},
                "primaryDsInfo_": info,
                "labeledDs_": labeled,
                "scheduleTree_": schedule,
                "computeOp_": compute,
            }}],
        }

    def _hbm_allocate(self, name: str, busy: Sequence[int]) -> dict[str, Any]:
        """Per-core start address of the core's slice: symbolic slot + byte offset, and the affine fold."""
        data = {str(c): {"slot": name, "offset": self.slice_offset(name, self.slices[c])} for c in busy}
        folds = []
        base = self.slice_offset(name, {k: (0, 0) for k in self.dims})
        for dim, count in self.division.splits.items():
            if count > 1 and busy:
                step = {k: (0, 0) for k in self.dims}
                lo, hi = self.slices[busy[0]].get(dim, (0, 0))
                span = hi - lo
                if dim in self.slices[busy[0]]:
                    step[dim] = (span, span)
                folds.append({"dim": dim, "affine": {"alpha": self.slice_offset(name, step) - base, "beta": base}})
        return {"nodeType_": "allocate", "name_": name, "component_": "hbm",
                "startAddressCoreCorelet_": {"dim_prop_func": folds, "data_": data}}

    def slice_offset(self, name: str, ranges: Mapping[str, tuple[int, int]]) -> int:
        """Byte offset in ``name``'s device copy of the first element of a core's slice."""
        op, buf = self.operands.get(name), self.buffers.get(name)
        if op is None or buf is None or not buf.shape:
            return 0
        layout = buf.layout if buf.layout is not None else StickLayout.default(buf.shape, stored_dtype(buf.dtype))
        if op.strides:  # read through a view: walk the view's strides, then back to the base buffer's index
            flat = op.offset + sum(min(ranges[a][0], n - 1) * st for a, n, st in zip(op.axes, op.shape, op.strides)
                                   if a is not None and a in ranges)
            index = []
            for n in reversed(buf.shape):
                flat, i = divmod(flat, n)
                index.append(i)
            index.reverse()
        else:
            index = [min(ranges[a][0], n - 1) if a is not None and a in ranges else 0
                     for a, n in zip(op.axes, buf.shape)]
        return layout.device_offset(layout.device_coords(index)) * op.itemsize
