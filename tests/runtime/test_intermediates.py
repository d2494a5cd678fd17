"""The intermediates pool: compiled programs' private buffers placed once, first fit by live range, in one segment."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.device.memory import DeviceOutOfMemoryError
from spyre_lab.runtime.devices import get_device
from spyre_lab.runtime.intermediates import plan_live_ranges
from spyre_lab.runtime.programs import load, run_program

UNFUSED = CompileOptions(fusion=frozenset())


def test_an_intermediate_reuses_the_bytes_of_one_whose_life_ended():
    kernels = [["x", "t1"], ["t1", "t2"], ["t2", "t3"], ["t3", "out"]]
    placed = {p.slot: p for p in plan_live_ranges({"t1": 300, "t2": 100, "t3": 200}, kernels, 128, 1 << 20)}
    assert (placed["t1"].first, placed["t1"].last) == (0, 1)
    assert placed["t1"].offset == 0 and placed["t1"].nbytes == 384           # whole 128 B sticks
    assert placed["t2"].offset == 384                                        # t1 is still read by kernel 1
    assert placed["t3"].offset == 0                                          # t1 is dead by kernel 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=4), min_size=1, max_size=10),
       st.lists(st.integers(1, 5000), min_size=8, max_size=8))
def test_intermediates_whose_lives_overlap_never_share_a_byte(kernel_uses, sizes):
    kernels = [[f"t{i}" for i in uses] for uses in kernel_uses]
    wanted = {f"t{i}": n for i, n in enumerate(sizes)}
    placed = plan_live_ranges(wanted, kernels, 128, 1 << 30)
    assert {p.slot for p in placed} == {s for k in kernels for s in k}
    for p in placed:
        assert p.offset % 128 == 0 and p.nbytes >= wanted[p.slot]
        assert p.first == min(k for k, used in enumerate(kernels) if p.slot in used)
        assert p.last == max(k for k, used in enumerate(kernels) if p.slot in used)
    for p in placed:
        for q in placed:
            lives_overlap = p is not q and p.first <= q.last and q.first <= p.last
            if lives_overlap:
                assert p.offset + p.nbytes <= q.offset or q.offset + q.nbytes <= p.offset


def test_a_plan_larger_than_the_segment_is_refused_by_name():
    with pytest.raises(DeviceOutOfMemoryError, match=r"intermediates segment.*intermediate t2"):
        plan_live_ranges({"t1": 600, "t2": 600}, [["t1", "t2"]], 128, 1024)


def _chain(t: torch.Tensor) -> torch.Tensor:
    return ((t * 2 + 1).exp() - 3).abs() * 0.5


def test_a_chain_reuses_its_own_intermediate_addresses_and_computes_right():
    """Unfused, an elementwise chain's intermediates live one kernel each: the plan puts every other one at the
    same address, and each kernel claims that address before it runs, so every value is read from the right
    buffer."""
    x = torch.randn(32, 64, dtype=torch.float16)
    program = compile_graph(_chain, [x], UNFUSED)
    (out,) = run_program(program, [x.to("spyre")])
    pool = load(program).binding_plan(0)[1].intermediates
    offsets = [p.offset for p in pool.placements]
    assert len(pool.placements) >= 3 and len(set(offsets)) < len(offsets)      # shared bytes
    assert pool.peak_bytes < pool.total_bytes
    assert "intermediates:" in pool.describe() and pool.placements[0].slot in pool.describe()
    assert get_device(0).intermediates_peak_bytes >= pool.peak_bytes
    row = next(r for r in torch.spyre.memory_summary().splitlines() if "intermediates (largest plan)" in r)
    assert row.rstrip().endswith("of 16.00 GiB")
    torch.testing.assert_close(out.cpu(), _chain(x.float()).half(), atol=2e-2, rtol=2e-2)


def test_programs_share_the_segment_and_each_finds_its_own_intermediates():
    """Two programs plan from the start of the segment, so their intermediates share addresses; launched in turn,
    each still reads its own values (a kernel claims its addresses before it runs)."""
    x, y = torch.randn(32, 64, dtype=torch.float16), torch.randn(8, 8, dtype=torch.float16)
    first = compile_graph(_chain, [x], UNFUSED)
    second = compile_graph(lambda t: ((t * 4 - 2).exp() + 1).neg(), [y], UNFUSED)
    xs, ys = x.to("spyre"), y.to("spyre")
    for _ in range(2):
        (a,) = run_program(first, [xs])
        (b,) = run_program(second, [ys])
        torch.testing.assert_close(a.cpu(), _chain(x.float()).half(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(b.cpu(), ((y.float() * 4 - 2).exp() + 1).neg().half(), atol=2e-2, rtol=2e-2)
    base = get_device(0).intermediates_base
    addresses = [{s.buffer.address for s in load(p).binding_plan(0)[1].intermediates.slots.values()}
                 for p in (first, second)]
    assert base in addresses[0] and base in addresses[1]
