"""The fast event loop follows the firing rule as the reference simulator states it, op for op."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spyre_lab.device.config import DATASHEET, MEASURED, SPYRE
from spyre_lab.device.isa import CoreOps, LXOverflowError, TileProgram
from spyre_lab.device.kernels import elementwise_kernel, matmul_kernel, softmax_kernel, sum_kernel
from spyre_lab.device.sim_costs import RECV, RING
from spyre_lab.device.sim_event import run_event
from spyre_lab.device.sim_reference import run_reference


def _assert_same(kernel: TileProgram, cfg=SPYRE, capacity: int | None = None) -> None:
    capacity = capacity or cfg.lx_bytes
    try:
        fast = run_event(kernel, cfg, capacity, want_events=True)
    except LXOverflowError as err:
        with pytest.raises(LXOverflowError) as ref_err:
            run_reference(kernel, cfg, capacity)
        assert ref_err.value.core == err.core
        return
    ref = run_reference(kernel, cfg, capacity)
    assert fast.makespan == pytest.approx(ref.makespan, rel=1e-9, abs=1e-6)
    assert len(fast.events) == len(ref.ops)
    for (core, unit, _, start, dur, _), o in zip(fast.events, ref.ops, strict=True):
        assert core == o.core and (unit == RING if o.unit == RECV else unit == o.unit)
        assert start + dur == pytest.approx(o.end, rel=1e-9, abs=1e-6), (kernel.name, o.op.name)
    for key, cycles in ref.busy.items():
        assert fast.busy[key] == pytest.approx(cycles, rel=1e-9, abs=1e-6)
    assert {c: p for c, p in fast.lx_peak.items() if p} == {c: p for c, p in ref.lx_peak.items() if p}


@pytest.mark.parametrize("build", [
    lambda: elementwise_kernel(1 << 16, 4, tile_bytes=8 * 1024),
    lambda: sum_kernel(1 << 16, 4, tile_bytes=8 * 1024),
    lambda: softmax_kernel(64, 1024, 2, fused=False),
    lambda: matmul_kernel(256, 256, 512, 2, 2, 2),
    lambda: matmul_kernel(128, 256, 256, 1, 2, 1, broadcast=False),
], ids=["elementwise", "sum_ring", "softmax_staged", "matmul_k_split", "matmul_plain"])
@pytest.mark.parametrize("cfg", [MEASURED, DATASHEET], ids=["measured", "datasheet"])
def test_reference_and_fast_agree_on_the_reference_kernels(build, cfg):
    _assert_same(build(), cfg)


@st.composite
def random_kernels(draw):
    """A few cores, each a random dataflow graph of loads, SFU and PT ops and stores over earlier ops."""
    cores = draw(st.integers(1, 3))
    programs = []
    for _ in range(cores):
        p = CoreOps()
        for i in range(draw(st.integers(1, 12))):
            kind = draw(st.sampled_from(["load", "load", "vector", "special", "matmul", "store"]))
            earlier = list(range(len(p.ops)))
            deps = draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)) if earlier else []
            size = draw(st.sampled_from([128, 1024, 4096, 16384]))
            if kind == "load" or not deps:
                p.load(f"b{i}", size, deps=deps, share=draw(st.sampled_from([1, 1, 2, 8])))
            elif kind == "store":
                p.store(size, deps=deps)
            elif kind == "matmul":
                p.matmul(f"m{i}", draw(st.sampled_from([1, 8, 64])), 64, 64, deps=deps, out_bytes=size)
            else:
                getattr(p, kind)(f"v{i}", size // 2, deps=deps, out_bytes=size)
        programs.append(p)
    return TileProgram("random", programs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernel=random_kernels(), capacity=st.sampled_from([20000, 60000, 1 << 21]),
       cfg=st.sampled_from([MEASURED, DATASHEET]))
def test_fast_event_loop_equals_the_reference_on_random_kernels(kernel, capacity, cfg):
    _assert_same(kernel, cfg, capacity)
