"""Paged attention as a compiler kernel family: the KernelSpec of a launch shape, timed by the simulators.

The spec wraps the paged tiler's plan (same per-core tile programs, so the same modeled time as simulating
the plan itself), is kept per launch shape, and the runtime's ``LoadedFamilyKernel`` reads its time and
events from it.
"""

from __future__ import annotations

import pytest

from spyre_lab.compiler.explain import KERNEL_FAMILY_EXPLAINERS, explain
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.paged_attention import (
    ADDRESS_SLOTS,
    OUTPUT_SLOTS,
    PagedAttentionSpec,
    cache_info,
    describe,
    paged_attention_spec,
)
from spyre_lab.compiler.tiling_paged_attention import PagedShape, plan_paged_attention
from spyre_lab.device.config import SPYRE
from spyre_lab.device.sim import simulate

SHAPES = [PagedShape(32, 8, 128, 16, ((32, 1),)),                      # batch-1 decode, 512 keys of context
          PagedShape(32, 8, 128, 16, ((4, 1), (0, 7), (9, 1), (0, 0))),  # decode rows, a prefill, a padding row
          PagedShape(4, 2, 32, 16, ((2, 1), (1, 1), (0, 0)))]            # tiny-granite's sizes


@pytest.mark.parametrize("shape", SHAPES, ids=["decode-b1", "mixed", "tiny"])
def test_the_spec_is_the_tilers_plan_and_times_as_it_does(shape):
    spec = paged_attention_spec(shape, SPYRE)
    assert isinstance(spec, KernelSpec) and isinstance(spec, PagedAttentionSpec)
    assert spec.rule == "attention" and tuple(spec.address_slots) == ADDRESS_SLOTS
    assert all(spec.roles[s] == "OUTPUT" for s in OUTPUT_SLOTS) and set(spec.roles) == set(OUTPUT_SLOTS)
    plan = plan_paged_attention(shape, SPYRE, name="paged attention")
    direct = simulate(plan.kernel, SPYRE, mode="analytic", trace=False)
    sim = spec.simulate("analytic")
    assert sim.time_us == direct.time_us and sim.dram_bytes == direct.dram_bytes
    assert spec.tile_kernel.num_ops == plan.kernel.num_ops and spec.chunks == plan.block_chunks()
    assert spec.division.cores_used == len(plan.kernel.active_cores) or not plan.kernel.active_cores
    assert spec.blocks_read == sum(nb for nb, q in shape.seqs if q > 0) * shape.kv_heads
    assert spec.lx_plan.peak <= SPYRE.lx_budget_bytes


def test_a_launch_shape_is_planned_once():
    shape = PagedShape(4, 2, 32, 16, ((3, 1), (5, 1)))
    first = paged_attention_spec(shape, SPYRE)
    count = cache_info()["shapes"]
    assert paged_attention_spec(PagedShape(4, 2, 32, 16, ((3, 1), (5, 1))), SPYRE) is first
    assert cache_info()["shapes"] == count
    assert paged_attention_spec(shape, SPYRE, double_buffer=False) is not first      # another plan


def test_the_runtime_kernel_reads_time_events_and_args_from_its_spec():
    from spyre_lab.runtime.programs import LoadedFamilyKernel, LoadedFamilyLaunch

    ran = []
    kernel = LoadedFamilyKernel("paged attention L0", ADDRESS_SLOTS, OUTPUT_SLOTS, lambda spec, ops: ran.append(spec))
    assert kernel.time_us == 0.0 and kernel.sim_trace is None and kernel.args == {}      # before any launch
    launchable = LoadedFamilyLaunch(kernel)
    assert launchable.kernels == [kernel] and launchable.mutations == [] and launchable.name == kernel.name
    for shape in SHAPES[1:]:
        spec = paged_attention_spec(shape, SPYRE)
        kernel.spec = spec
        sim = spec.simulate("analytic")
        assert kernel.time_us == sim.time_us and "simulated" in kernel.timing
        assert kernel.args["blocks_read"] == spec.blocks_read and kernel.args["bottleneck"] == sim.bottleneck
        assert kernel.sim_trace is not None and len(kernel.sim_trace) > 0
        kernel.run(None)
        assert ran[-1] is spec


def test_describe_says_time_blocks_and_plan():
    spec = paged_attention_spec(SHAPES[0], SPYRE)
    first, shape_line, plan_line = describe(spec)
    assert f"{spec.simulate().time_us:.2f} us modeled" in first
    assert f"{spec.blocks_read} cache blocks read" in first
    assert "(cache blocks, queries) per sequence [(32, 1)]" in shape_line and plan_line.endswith(spec.plan.reason)


def test_compiler_explain_appends_each_kernel_familys_section():
    def added() -> str:
        return "family section for the test"

    KERNEL_FAMILY_EXPLAINERS.append(added)
    try:
        import torch

        from spyre_lab.compiler import compile_graph

        program = compile_graph(lambda x: x + 1, [torch.ones(4, 64, dtype=torch.float16)])
        text = explain(program)
        assert text.index("Program ") < text.index("family section for the test")
    finally:
        KERNEL_FAMILY_EXPLAINERS.remove(added)
    assert "family section for the test" not in explain(program)
