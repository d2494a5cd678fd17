"""Executor: numerics kernel by kernel, tile-by-tile equality, modeled trace, input checks."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from warning_checks import only_warnings

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.executor import execute
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.program import HostFallback


def softmax_fn(x):
    return torch.softmax(x, dim=-1)


def linear_fn(x, w, b):
    return torch.relu(x @ w + b)


def decode_fn(x, w):
    return x @ w


def cumsum_fn(x):
    return torch.cumsum(x, dim=-1) * 2


@pytest.fixture(scope="module")
def programs():
    torch.manual_seed(0)
    x = torch.randn(64, 200).half()
    w, b = torch.randn(200, 192).half() * 0.1, torch.randn(192).half()
    xd, wd = torch.randn(1, 256).half(), torch.randn(256, 512).half() * 0.1
    return {
        "softmax": (compile_graph(softmax_fn, [x]), [x]),
        "linear": (compile_graph(linear_fn, [x, w, b]), [x, w, b]),
        "decode": (compile_graph(decode_fn, [xd, wd]), [xd, wd]),
    }


@pytest.mark.parametrize("name", ["softmax", "linear", "decode"])
def test_tile_by_tile_gives_exactly_the_whole_tensor_result(programs, name):
    program, inputs = programs[name]
    whole = execute(program, inputs)
    tiles = execute(program, inputs, tile_by_tile=True)
    assert torch.equal(whole.outputs[0], tiles.outputs[0])
    sliced = [k for k, cores in tiles.tiles.items() if cores]
    assert sliced, "at least one kernel ran per core"
    for kernel in sliced:
        cores = tiles.tiles[kernel]
        assert len({c.core for c in cores}) == len(cores) > 1
        assert all(c.slice for c in cores)


def test_decode_matmul_k_split_partials_are_reduced_in_k_order(programs):
    program, inputs = programs["decode"]
    spec = program.launches[0]
    result = execute(program, inputs, tile_by_tile=True)
    ref = (inputs[0].float() @ inputs[1].float()).half()
    torch.testing.assert_close(result.outputs[0], ref, atol=1e-2, rtol=1e-3)
    if spec.division.splits.get("K", 1) > 1:
        partials = [c for c in result.tiles[spec.name] if any(k.endswith(".partial") for k in c.values)]
        assert partials, "K partners keep their fp32 partial sums"


def test_numbers_match_torch(programs):
    for fn, key in ((softmax_fn, "softmax"), (linear_fn, "linear")):
        program, inputs = programs[key]
        out = execute(program, inputs).outputs[0]
        ref = fn(*(t.float() for t in inputs))
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_trace_places_kernels_back_to_back_with_core_lanes(programs):
    program, inputs = programs["linear"]
    result = execute(program, inputs)
    kernels = result.trace.on("stream0")
    assert len(kernels) == len(program.launches)
    for a, b in itertools.pairwise(kernels):
        assert b.start_us == pytest.approx(a.end_us)
    assert all(t is not None and t > 0 for t in result.kernel_times_us.values())
    assert sum(result.kernel_times_us.values()) == pytest.approx(result.total_us)
    assert any(lane.startswith("core") for lane in result.trace.lanes())


def test_event_mode_timing_is_close_to_analytic(programs):
    program, inputs = programs["softmax"]
    analytic = execute(program, inputs, mode="analytic").total_us
    event = execute(program, inputs, mode="event").total_us
    assert event == pytest.approx(analytic, rel=0.25)


def test_host_fallback_gets_pcie_copies_and_a_host_event():
    x = torch.randn(8, 64).half()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = compile_graph(cumsum_fn, [x])
    assert any("cumsum" in str(w.message) for w in caught) or "cumsum" in program.fallback_ops
    assert any(isinstance(launch, HostFallback) for launch in program.launches)
    result = execute(program, [x])
    torch.testing.assert_close(result.outputs[0], torch.cumsum(x, -1) * 2)
    pcie = result.trace.on("pcie")
    assert [e.name.split()[0] for e in pcie] == ["D2H", "H2D"]
    nbytes = x.numel() * 2
    assert pcie[0].dur_us == pytest.approx(program.cfg.pcie_latency_us + nbytes / program.cfg.pcie_bandwidth * 1e6)
    host = result.trace.on("host")
    assert host[0].start_us >= pcie[0].end_us and pcie[1].start_us >= host[0].end_us


def test_bad_inputs_are_named(programs):
    program, inputs = programs["softmax"]
    with pytest.raises(ValueError, match="takes 1 inputs"):
        execute(program, inputs * 2)
    with pytest.raises(ValueError, match="compiled for"):
        execute(program, [torch.randn(3, 3).half()])
    with pytest.raises(ValueError, match="mode"):
        execute(program, inputs, mode="fast")


def test_work_division_strategies_agree(programs):
    _, inputs = programs["linear"]
    naive = compile_graph(linear_fn, inputs, CompileOptions(work_division="naive"))
    planned = compile_graph(linear_fn, inputs, CompileOptions(work_division="planned"))
    a, b = execute(naive, inputs).outputs[0], execute(planned, inputs).outputs[0]
    # same math; only a K split changes the fp32 summation order, which can move a result by 1 fp16 ulp
    torch.testing.assert_close(a, b, atol=1e-3, rtol=2**-10)


def test_in_place_updates_of_inputs_reach_the_caller():
    def update(x, cache, idx):
        cache.index_copy_(0, idx, x)
        x.mul_(2)
        return x + 1

    x, cache, idx = torch.randn(2, 64).half(), torch.zeros(5, 64).half(), torch.tensor([1, 3])
    with only_warnings(r"aten\.index_put runs on the host CPU"):
        program = compile_graph(update, [x, cache, idx])
    x0 = x.clone()
    out = execute(program, [x, cache, idx]).outputs[0]
    assert torch.equal(x, x0 * 2) and torch.equal(out, x0 * 2 + 1)
    assert torch.equal(cache[[1, 3]], x0) and cache[[0, 2, 4]].abs().sum() == 0


@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_reductions_split_across_cores_combine_partials_exactly(op):
    x = torch.randn(4, 8192).half()
    program = compile_graph(lambda t: getattr(t, op)(), [x])
    spec = program.launches[0]
    whole = execute(program, [x])
    tiles = execute(program, [x], tile_by_tile=True)
    assert torch.equal(whole.outputs[0], tiles.outputs[0])
    torch.testing.assert_close(whole.outputs[0].float(), getattr(x.float(), op)(), atol=0.05, rtol=1e-2)
    if len(spec.tile_kernel.active_cores) > 1:
        assert len(tiles.tiles[spec.name]) > 1
        assert any(k.endswith(".partial") for c in tiles.tiles[spec.name] for k in c.values)


@pytest.mark.parametrize("fn, shapes", [(linear_fn, [(64, 256), (256, 128), (128,)]),
                                        (decode_fn, [(1, 1024), (1024, 64)]), (softmax_fn, [(8, 128)])])
def test_values_only_execution_gives_the_outputs_a_launch_computes(fn, shapes):
    from spyre_lab.compiler.executor import execute_values, slices_that_matter
    from spyre_lab.runtime.programs import run_program

    torch.manual_seed(0)
    inputs = [torch.randn(s, dtype=torch.float16) for s in shapes]
    program = compile_graph(fn, inputs)
    got = execute_values(program, inputs)
    on_card = [t.cpu() for t in run_program(program, [x.to("spyre") for x in inputs])]
    assert all(torch.equal(a, b) for a, b in zip(got, on_card))
    torch.testing.assert_close(got[0], execute(program, inputs).outputs[0], atol=2e-2, rtol=2e-2)
    if fn is decode_fn:                     # a K split across cores: its per-core order is what rounds
        assert any(slices_that_matter(spec) for spec in program.launches)
