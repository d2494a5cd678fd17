"""Codegen tiles inputs read through views (permute, expand, reshape) by the node's iteration space."""

from __future__ import annotations

import torch
from warning_checks import only_warnings

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.codegen import KernelSpec
from spyre_lab.compiler.examples import granite_layer
from spyre_lab.compiler.ir import InputView
from spyre_lab.compiler.program import UnplannedSpec
from spyre_lab.compiler.tiling_common import view_operand
from spyre_lab.device.config import SPYRE

F16 = torch.float16


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=F16, device="meta")


def only_kernel(program) -> KernelSpec:
    (spec,) = program.launches
    assert isinstance(spec, KernelSpec), spec.explain()
    return spec


def test_view_operand_orders_axes_by_stride_and_drops_broadcasts():
    # x[32, 1024, 128] read as x.transpose(1, 2) and iterated as (d0, d1, d2) = (32, 128, 1024)
    view = InputView((32, 128, 1024), (131072, 1, 128), 0, ("d0", "d1", "d2"))
    op = view_operand("x", view, {"d0": 32, "d1": 128, "d2": 1024}, 2)
    assert op.shape == (32, 1024, 128) and op.axes == ("d0", "d2", "d1") and op.strides == (131072, 128, 1)
    # a tile of 4 heads x 16 columns x all 1024 rows touches 4 * 1024 rows of one 64-element stick each
    assert op.tile_bytes({"d0": 4, "d1": 16, "d2": 1024}, SPYRE.stick_bytes) == 4 * 1024 * SPYRE.stick_bytes

    expanded = InputView((8, 4, 1024, 128), (131072, 0, 128, 1), 0, ("d0", "d1", "d2", "d3"))
    op = view_operand("k", expanded, {"d0": 8, "d1": 4, "d2": 1024, "d3": 128}, 2)
    assert op.axes == ("d0", "d2", "d3") and "d1" not in op.dims     # the expanded dim reads the same bytes

    strided = InputView((16,), (8,), 0, ("d0",))                       # every 8th element: a stick per element
    assert view_operand("s", strided, {"d0": 16}, 2).tile_bytes({"d0": 16}, SPYRE.stick_bytes) == 16 * 128

    overlapping = InputView((4, 4), (1, 1), 0, ("d0", "d1"))
    assert view_operand("o", overlapping, {"d0": 4, "d1": 4}, 2) is None


def test_transposed_restickify_is_planned_within_lx():
    x = meta(32, 1024, 128)
    spec = only_kernel(compile_graph(lambda t: t.transpose(-1, -2).contiguous(), [x]))
    assert spec.rule == "restickify" and spec.dims == {"d0": 32, "d1": 128, "d2": 1024}
    assert spec.lx_plan.peak <= SPYRE.lx_budget_bytes
    src = spec.address_slots[0]
    assert spec.operands[src].axes == ("d0", "d2", "d1")
    nbytes = x.numel() * 2
    assert spec.bytes_out == nbytes
    # every byte of x is loaded once: column tiles of whole sticks (128 wide rows, cut into 64-element sticks)
    assert spec.bytes_in == nbytes
    # each core's slice starts at x[d0, d2, d1] (the transpose), wherever the device layout keeps that element
    layout = spec.buffers[src].layout
    starts = set()
    for ranges in spec.slices:
        if ranges:
            index = [ranges["d0"][0], ranges["d2"][0], ranges["d1"][0]]
            starts.add(spec.slice_offset(src, ranges))
            assert spec.slice_offset(src, ranges) == layout.device_offset(layout.device_coords(index)) * 2
    assert len(starts) == spec.division.cores_used > 1


def test_expand_copy_is_planned_and_broadcasts_the_shared_tile():
    k = meta(8, 1, 1024, 128)
    spec = only_kernel(compile_graph(lambda t: t.expand(8, 4, 1024, 128).contiguous(), [k]))
    assert spec.lx_plan.peak <= SPYRE.lx_budget_bytes
    assert spec.bytes_out == 8 * 4 * 1024 * 128 * 2
    assert spec.operands[spec.address_slots[0]].dims == {"d0", "d2", "d3"}
    # the division keeps the expanded dim inside each tile: every byte of k is loaded once, not four times
    assert spec.division.splits.get("d1", 1) == 1 and spec.tiles["d1"] == 4
    assert spec.bytes_in == k.numel() * 2


def test_granite_8b_shaped_layer_plans_every_kernel():
    d, heads, kv_heads, ff, seq = 4096, 32, 8, 12800, 1024
    hd, kv = d // heads, d // heads * kv_heads
    shapes = [(1, seq, d), (seq, hd), (seq, hd), (d, d), (d, kv), (d, kv), (d, d), (d, ff), (d, ff), (ff, d),
              (d,), (d,)]
    with only_warnings(r"runs on the host CPU"):         # "has no tile plan" would be another warning: a failure
        program = compile_graph(lambda *a: granite_layer(*a), [meta(*s) for s in shapes])
    unplanned = [launch.explain() for launch in program.launches if isinstance(launch, UnplannedSpec)]
    assert unplanned == []
    for launch in program.device_launches:
        assert launch.lx_plan.peak <= SPYRE.lx_budget_bytes
    restick = [launch for launch in program.device_launches if launch.rule == "restickify"]
    assert restick and all(launch.bytes_in == launch.bytes_out for launch in restick)
    assert program.modeled_time_us() > 0


def test_batched_matmul_reads_a_permuted_input_by_its_own_dims():
    x, w = meta(256, 8, 128), meta(8, 128, 256)          # A = x.permute(1, 0, 2): [8, 256, 128], sticks intact
    program = compile_graph(lambda a, b: torch.bmm(a.permute(1, 0, 2), b), [x, w])
    spec = only_kernel(program)
    a = spec.operands[spec.address_slots[0]]
    assert a.shape == (256, 8, 128) and a.axes == ("M", "B", "K")
    # no core is told it shares A's tiles with cores that work on other batches or rows
    loads_a = [op for p in spec.tile_kernel.programs for op in p if op.kind.name == "LOAD" and op.out
               and op.out.startswith(spec.address_slots[0])]
    splits = spec.division.splits
    assert all(op.share <= splits.get("N", 1) for op in loads_a)
