"""JobPlan: three-step program correction, patched addresses, and rebuild vs aot_patch dispatch."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import pytest
import torch

from spyre_lab.runtime import last_trace, recording
from spyre_lab.runtime.launch import LoadedFunction, RuntimeOptions, StepKind, correction_area, launch, plan_launch
from spyre_lab.runtime.tensor import buffer_of


def half(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


def _add(ops) -> None:
    ops.write("t", ops["a"] + ops["b"])


def _mul(ops) -> None:
    ops.write("out", ops["t"] * ops["c"])


@dataclass(eq=False)
class TwoKernelProgram:
    """A hand-made program: t = a + b; out = t * c, with symbolic address slots."""

    name: str = "add_then_mul"
    num_nodes: int = 2
    mutations: tuple = ()
    kernels: list = field(default_factory=lambda: [
        LoadedFunction("k0_add", ["a", "b", "t"], _add, time_us=30.0),
        LoadedFunction("k1_mul", ["t", "c", "out"], _mul, time_us=50.0),
    ])


def _bindings(seed: int) -> dict[str, torch.Tensor]:
    a, b, c = (half(64, 64, seed=seed + i) for i in range(3))
    dev = {k: v.to("spyre") for k, v in {"a": a, "b": b, "c": c}.items()}
    dev["t"] = torch.empty(64, 64, dtype=torch.float16, device="spyre")
    dev["out"] = torch.empty(64, 64, dtype=torch.float16, device="spyre")
    return dev


def test_patched_addresses_are_the_bound_tensors_and_results_are_right():
    program = TwoKernelProgram()
    first, second = _bindings(0), _bindings(10)
    launch(program, first)
    image = correction_area(program, torch.spyre.get_device(0))
    assert image.last_patched[0] == {s: first[s].data_ptr() for s in ("a", "b", "t")}
    assert image.last_patched[1] == {s: first[s].data_ptr() for s in ("t", "c", "out")}
    expected = (first["a"].cpu() + first["b"].cpu()) * first["c"].cpu()
    assert torch.equal(first["out"].cpu(), expected)

    pinned = image.pinned.data_ptr()
    launch(program, second)                      # same program, operands at other addresses
    assert {second[s].data_ptr() for s in ("a", "b", "t")} != {first[s].data_ptr() for s in ("a", "b", "t")}
    assert image.last_patched[0] == {s: second[s].data_ptr() for s in ("a", "b", "t")}
    assert torch.equal(second["out"].cpu(), (second["a"].cpu() + second["b"].cpu()) * second["c"].cpu())
    assert image.pinned.data_ptr() == pinned     # the pinned correction buffer is reused
    assert image.launches == 2


def test_last_plan_describes_what_was_submitted():
    import spyre_lab.runtime as runtime

    launch(TwoKernelProgram(), _bindings(0))
    text = runtime.last_plan().describe()
    assert "add_then_mul" in text and text.count("HostCompute") == 2 and "k1_mul" in text


def test_each_kernel_gets_hostcompute_then_h2d_then_compute():
    program = TwoKernelProgram()
    plan = plan_launch(program, _bindings(0))
    kinds = [s.kind for s in plan.steps]
    assert kinds == [StepKind.HOST_COMPUTE, StepKind.H2D, StepKind.COMPUTE] * 2
    assert plan.steps[1].nbytes == 3 * 8                   # three 8-byte addresses
    assert "HostCompute" in plan.describe()


def test_the_trace_shows_the_three_steps_in_order():
    launch(TwoKernelProgram(), _bindings(0))
    trace = last_trace()
    callback, pcie, compute = trace.on("host.callback"), trace.on("pcie"), trace.on("stream0")
    assert [e.name for e in compute] == ["k0_add", "k1_mul"]
    for k in range(2):
        assert callback[k].end_us <= pcie[k].start_us <= pcie[k].end_us <= compute[k].start_us
    assert compute[0].dur_us == 30.0 and compute[1].dur_us == 50.0


def test_a_freed_operand_cannot_be_patched_silently():
    """The prologue finds each operand through the card's live-buffer map at its patched address: when another
    buffer sits at that address the launch says so instead of computing with it."""
    program = TwoKernelProgram()
    bindings = _bindings(0)
    device = torch.spyre.get_device(0)
    launch(program, bindings)
    address, real = bindings["a"].data_ptr(), buffer_of(bindings["a"])
    other = torch.zeros(4, dtype=torch.float32, device="spyre")
    device.register_buffer(address, buffer_of(other))
    try:
        with pytest.raises(RuntimeError, match=f"{address:#x} holds torch.float32 data"):
            launch(program, bindings)
    finally:
        device.register_buffer(address, real)


def test_rebuild_and_aot_patch_give_the_same_numbers_and_different_traces():
    program = TwoKernelProgram()
    results, traces, host_ends = {}, {}, {}
    for dispatch in ("rebuild", "aot_patch"):
        torch.spyre.synchronize()
        binds = [_bindings(0) for _ in range(3)]
        with recording() as trace:
            start = torch.spyre.modeled_time_us()
            for b in binds:
                launch(program, b, options=RuntimeOptions(dispatch=dispatch))
            host_ends[dispatch] = torch.spyre.modeled_time_us() - start
            torch.spyre.synchronize()
        results[dispatch] = [b["out"].cpu() for b in binds]
        traces[dispatch] = trace
    for r, a in zip(results["rebuild"], results["aot_patch"]):
        assert torch.equal(r, a)
    rebuilds = [e for e in traces["rebuild"].on("host") if e.name.startswith("rebuild graph")]
    cfg = torch.spyre.get_device(0).config
    assert len(rebuilds) == 3 and rebuilds[0].dur_us == cfg.host_rebuild_per_node_us * 2
    assert not any(e.name.startswith("rebuild") for e in traces["aot_patch"].on("host"))
    assert host_ends["aot_patch"] < host_ends["rebuild"]
    # rebuild: the device idles while the host rebuilds; aot_patch: the host's next enqueue overlaps compute
    compute = traces["aot_patch"].on("stream0")
    host = [e for e in traces["aot_patch"].on("host") if e.name.startswith("enqueue")]
    assert any(h.start_us < c.end_us and c.start_us < h.end_us for h in host for c in compute)
    rb_compute = traces["rebuild"].on("stream0")
    assert not any(r.start_us < c.end_us and c.start_us < r.end_us for r in rebuilds for c in rb_compute)


def test_default_options_switch_eager_ops_to_rebuild():
    from spyre_lab.runtime.launch import set_default_options

    x = half(32, 32).to("spyre")
    previous = set_default_options(RuntimeOptions(dispatch="rebuild"))
    try:
        torch.exp(x)
    finally:
        set_default_options(previous)
    assert any(e.name.startswith("rebuild graph") for e in last_trace().on("host"))
    torch.exp(x)
    assert not any(e.name.startswith("rebuild graph") for e in last_trace().on("host"))


def test_runtime_options_are_validated():
    with pytest.raises(ValueError, match="rebuild"):
        RuntimeOptions(dispatch="fast")


def test_bindings_must_live_on_the_launch_device():
    binds = _bindings(0)
    binds["c"] = binds["c"].cpu()
    with pytest.raises(ValueError, match="'c': 'cpu'"):
        plan_launch(TwoKernelProgram(), binds)


def test_missing_slot_binding_is_explained():
    binds = _bindings(0)
    del binds["c"]
    with pytest.raises(KeyError, match="'c'"):
        plan_launch(TwoKernelProgram(), binds)


def test_program_region_is_released_with_the_program():
    device = torch.spyre.get_device(0)
    gc.collect()
    before = device.program_memory.num_allocations
    program = TwoKernelProgram()
    launch(program, _bindings(0))
    assert device.program_memory.num_allocations == before + 1
    del program
    gc.collect()
    assert device.program_memory.num_allocations == before


def test_bindings_resolve_through_buffers():
    binds = _bindings(0)
    assert buffer_of(binds["a"]).address == binds["a"].data_ptr()


def test_a_compiled_program_runs_through_the_jobplan_path():
    from spyre_lab.compiler import backend
    from spyre_lab.compiler.executor import execute
    from spyre_lab.runtime.programs import load, run_program

    a, b = half(64, 64, seed=1), half(64, 64, seed=2)
    program = backend.compile_graph(lambda x, y: torch.softmax(x @ y, dim=-1) + x, [a, b])
    expected = execute(program, [a, b]).outputs
    outputs = run_program(program, [a.to("spyre"), b.to("spyre")])
    trace = last_trace()
    assert all(o.device.type == "spyre" for o in outputs)
    for got, want in zip(outputs, expected):
        assert torch.equal(got.cpu(), want)
    device_launches = [launch.name for launch in program.launches if hasattr(launch, "simulate")]
    assert [e.name for e in trace.on("stream0")] == device_launches
    assert len(trace.on("host.callback")) == len(program.launches)          # one correction per launch
    assert any(lane.startswith("core") for lane in trace.lanes())            # per-core events placed
    image = correction_area(load(program), torch.spyre.get_device(0))
    assert image.launches == 1


def test_torch_compile_of_a_spyre_model_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.SiLU(), torch.nn.Linear(64, 32)).half().eval()
    x = half(8, 64)
    expected = model(x).detach()
    compiled = torch.compile(model.to("spyre"), backend="spyre")
    with torch.no_grad():
        out = compiled(x.to("spyre"))
    trace = last_trace()  # before .cpu(), which is a launch of its own
    assert trace.on("host.callback"), "every compiled launch goes through program correction"
    assert out.device.type == "spyre"
    torch.testing.assert_close(out.cpu(), expected, atol=2e-2, rtol=2e-2)


def test_a_compiled_program_survives_a_device_reset():
    from spyre_lab.compiler import backend
    from spyre_lab.runtime.programs import run_program

    a = half(16, 16)
    program = backend.compile_graph(lambda x: x * 3 + 1, [a])
    first = run_program(program, [a.to("spyre")])[0].cpu()
    torch.spyre.reset_device()
    second = run_program(program, [a.to("spyre")])[0].cpu()   # constants and program image reloaded
    assert torch.equal(first, second)
