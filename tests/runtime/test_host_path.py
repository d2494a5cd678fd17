"""The host path's caches: a program is bound once per card, simulator events are placed only when read."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.compiler.options import CompileOptions
from spyre_lab.runtime import last_trace, recording
from spyre_lab.runtime.devices import get_device
from spyre_lab.runtime.launch import LoadedFunction, StepKind, correction, correction_area, last_plan, launch
from spyre_lab.runtime.tensor import buffer_of


class Chain:
    """x -> x + 1 -> x + 2: a hand-made two-kernel program."""

    def __init__(self) -> None:
        self.name, self.num_nodes, self.mutations = "chain", 2, ()
        self.kernels = [LoadedFunction("k0", ["x", "t"], lambda ops: ops.write("t", ops["x"] + 1), 5.0),
                        LoadedFunction("k1", ["t", "y"], lambda ops: ops.write("y", ops["t"] + 1), 5.0)]


def _binds() -> dict[str, torch.Tensor]:
    return {s: torch.zeros(4, 64, dtype=torch.float16, device="spyre") for s in ("x", "t", "y")}


def test_a_cached_launch_does_not_rebuild_its_kernel_list(monkeypatch):
    program, binds = Chain(), _binds()
    calls = []
    real = correction.writebacks
    monkeypatch.setattr(correction, "writebacks", lambda *a: calls.append(1) or real(*a))
    launch(program, binds)
    first = len(calls)
    for _ in range(5):
        launch(program, binds)
    assert first >= 1 and len(calls) == first
    assert torch.equal(binds["y"].cpu(), torch.full((4, 64), 2.0, dtype=torch.float16))


def test_a_program_that_swaps_its_kernels_is_bound_again():
    program, binds = Chain(), _binds()
    launch(program, binds)
    program.kernels = [LoadedFunction("k0", ["x", "y"], lambda ops: ops.write("y", ops["x"] + 7), 5.0)]
    plan = launch(program, binds)
    assert [s.name for s in plan.steps if s.kind is StepKind.COMPUTE] == ["k0"]
    assert torch.equal(binds["y"].cpu(), torch.full((4, 64), 7.0, dtype=torch.float16))


def test_cached_eager_op_results_are_unchanged():
    a = torch.randn(64, 64, dtype=torch.float16)
    b = torch.randn(64, 64, dtype=torch.float16)
    x, y = a.to("spyre"), b.to("spyre")
    for _ in range(3):
        assert torch.equal(torch.add(x, y).cpu(), a + b)


def test_simulator_events_are_placed_when_read():
    x = torch.randn(64, 64, dtype=torch.float16).to("spyre")
    with recording() as trace:
        torch.add(x, x)
    launch_trace = last_trace()
    count, start, end, duration = len(trace), trace.start_us, trace.end_us, trace.duration_us
    assert count > 10                              # per-core events of the one-op program are there
    assert duration == end - start > 0             # pending: one pass over blocks and tuples
    assert any(e.lane.startswith("core") for e in trace.events)
    assert len(trace) == count == len(trace.events)
    assert (trace.start_us, trace.end_us) == (start, end)
    assert end == max(e.end_us for e in trace.events) and start == min(e.start_us for e in trace.events)
    assert trace.duration_us == duration           # materialised: the same number from the events
    cores = [e for e in launch_trace.events if e.lane.startswith("core")]
    assert cores and cores == [e for e in trace.events if e.lane.startswith("core")]
    compute = next(e for e in trace.events if e.args.get("kind") == "Compute")
    assert min(e.start_us for e in cores) >= compute.start_us


def test_the_launch_image_is_built_once_per_program_and_card_and_reused():
    program, binds = Chain(), _binds()
    launch(program, binds)
    area = correction_area(program, torch.spyre.get_device(0))
    record, prepared = area.record(program), area.queued(torch.spyre.current_stream(), "aot_patch")
    for _ in range(3):
        launch(program, binds)
    assert correction_area(program, torch.spyre.get_device(0)) is area
    assert area.record(program) is record and last_plan() is record
    assert area.queued(torch.spyre.current_stream(), "aot_patch") is prepared
    assert area.launches == 4


def test_a_new_output_buffer_is_patched():
    program, binds = Chain(), _binds()
    launch(program, binds)
    area = correction_area(program, torch.spyre.get_device(0))
    fresh = dict(binds, y=torch.zeros(4, 64, dtype=torch.float16, device="spyre"))
    launch(program, fresh)                                   # same image, a new output buffer
    assert area.last_patched[1]["y"] == fresh["y"].data_ptr() != binds["y"].data_ptr()
    assert torch.equal(fresh["y"].cpu(), torch.full((4, 64), 2.0, dtype=torch.float16))


def test_a_corrupted_blob_really_reads_another_buffer(monkeypatch):
    program, binds = Chain(), _binds()
    binds["x"].fill_(5.0)
    launch(program, binds)
    area = correction_area(program, torch.spyre.get_device(0))
    other = torch.full((4, 64), 40.0, dtype=torch.float16, device="spyre")
    class Tampered:                       # the pinned buffer a misbehaving driver would write a stale address into
        def __init__(self, pinned):       # (one kernel's part of it)
            self.pinned = pinned

        def __setitem__(self, key, values):
            values = list(values)
            if values and values[0] == binds["x"].data_ptr():
                values[0] = other.data_ptr()
            self.pinned[key] = values

        def __array__(self, dtype=None, copy=None):   # what the H2D copy reads
            return self.pinned

    monkeypatch.setattr(area, "pinned_views", [Tampered(view) for view in area.pinned_views])
    launch(program, binds)
    assert area.last_patched[0]["x"] == other.data_ptr()
    assert torch.equal(binds["y"].cpu(), torch.full((4, 64), 42.0, dtype=torch.float16))   # read `other`, not x


def test_after_a_device_reset_the_program_is_bound_again():
    program = Chain()
    launch(program, _binds())
    area = correction_area(program, torch.spyre.get_device(0))
    torch.spyre.reset_device()
    binds = _binds()
    launch(program, binds)
    again = correction_area(program, torch.spyre.get_device(0))
    assert again is not area and again.valid() and not area.valid()
    assert again.last_patched[0] == {s: binds[s].data_ptr() for s in ("x", "t")}
    assert torch.equal(binds["y"].cpu(), torch.full((4, 64), 2.0, dtype=torch.float16))


def test_a_freed_program_frees_its_launch_image():
    import gc
    import weakref

    program = Chain()
    launch(program, _binds())
    area = weakref.ref(correction_area(program, torch.spyre.get_device(0)))
    del program
    gc.collect()
    assert area() is None


def test_launch_returns_the_plan_that_ran():
    program, binds = Chain(), _binds()
    plan = launch(program, binds)
    assert [s.kind for s in plan.steps] == [StepKind.HOST_COMPUTE, StepKind.H2D, StepKind.COMPUTE] * 2
    assert plan is last_plan()


class ChainWithHostStep(Chain):
    """Chain with a host kernel in the middle (a fallback inside a compiled program): x -> x + 1 -> *3 (host) -> +1."""

    def __init__(self) -> None:
        super().__init__()
        host = LoadedFunction("h", ["t", "u"], lambda ops: ops.write("u", ops["t"] * 3), 7.0)
        host.host = True
        self.kernels = [self.kernels[0], host,
                        LoadedFunction("k1", ["u", "y"], lambda ops: ops.write("y", ops["u"] + 1), 5.0)]


@pytest.mark.parametrize("make", [Chain, ChainWithHostStep])
@pytest.mark.parametrize("dispatch", ["aot_patch", "rebuild"])
def test_the_plan_a_launch_returns_is_the_steps_that_ran(make, dispatch):
    """One launch route: the JobPlan it records (and ``plan_launch`` shows beforehand) is, step by step, what the
    stream ran: the same names and modeled durations on the step lanes, in order."""
    from spyre_lab.runtime.launch import RuntimeOptions, plan_launch

    program, binds = make(), _binds()
    binds["u"] = torch.zeros(4, 64, dtype=torch.float16, device="spyre")
    planned = plan_launch(program, binds).describe()
    with recording() as trace:
        plan = launch(program, binds, options=RuntimeOptions(dispatch=dispatch))
    step_lanes = {"host.callback", "pcie", "stream0"}
    ran = [(e.name, e.dur_us) for e in trace.events if e.lane in step_lanes]
    assert ran == [(s.name, s.dur_us) for s in plan.steps]
    assert plan.describe() == planned
    kinds = [s.kind for s in plan.steps]
    if make is Chain:
        assert kinds == [StepKind.HOST_COMPUTE, StepKind.H2D, StepKind.COMPUTE] * 2
    else:                                   # the host kernel in the middle: its operands out, the op, results back
        assert kinds[3:6] == [StepKind.D2H, StepKind.HOST_COMPUTE, StepKind.H2D]
    expected = 2.0 if make is Chain else 4.0
    assert torch.equal(binds["y"].cpu(), torch.full((4, 64), expected, dtype=torch.float16))


def test_a_deferred_stickify_reads_back_exactly():
    from spyre_lab.device.layout import unstickify
    from spyre_lab.runtime.tensor import buffer_of

    values = torch.randn(5, 70, dtype=torch.float16)            # a partial last stick: padding in the device copy
    x = values.to("spyre")
    y = torch.exp(x)
    buffer = buffer_of(y)
    assert buffer._data is None                                   # written by the kernel, not stickified yet
    device_copy = buffer.data                                     # stickified when asked for
    assert tuple(device_copy.shape) == buffer.layout.device_size
    assert torch.equal(unstickify(device_copy, buffer.layout), y.cpu())
    assert torch.equal(y.cpu(), torch.exp(values))


def test_a_compiled_programs_intermediates_take_no_tensor_dram_and_the_same_addresses_every_launch():
    """Intermediates live in the intermediates segment, placed once when the program is bound: a launch allocates
    only its outputs in tensor DRAM (nothing else shows in the peak), frees nothing else, and patches the same
    intermediate addresses every time."""
    from spyre_lab.compiler import backend
    from spyre_lab.runtime.launch.correction import correction_area
    from spyre_lab.runtime.programs import load, run_program

    a, b = torch.randn(64, 64, dtype=torch.float16), torch.randn(64, 64, dtype=torch.float16)
    program = backend.compile_graph(lambda x, y: torch.softmax(x @ y, dim=-1) * 2 + x, [a, b],
                                    CompileOptions(fusion=frozenset()))
    inputs = [a.to("spyre"), b.to("spyre")]
    run_program(program, inputs)                                  # loads constants, binds the program
    area, plan = load(program).binding_plan(0)
    assert plan.intermediates.slots, "unfused, the chain has intermediates"
    segment = get_device(0)
    low, high = segment.intermediates_base, segment.intermediates_base + segment.intermediates_bytes
    torch.spyre.reset_peak_memory_stats()
    before = torch.spyre.memory_allocated()
    (out,) = run_program(program, inputs)
    assert torch.spyre.memory_allocated() - before == torch.spyre.max_memory_allocated() - before == (
        buffer_of(out).device_nbytes)                             # only the output was allocated
    def placed() -> list[dict[str, int]]:
        return [{s: a for s, a in p.items() if s in plan.intermediates.slots} for p in area.last_patched]

    first = placed()
    del out
    assert torch.spyre.memory_allocated() == before
    run_program(program, inputs)
    assert correction_area(load(program), segment) is area and placed() == first and any(first)
    for patched in area.last_patched:
        for slot, address in patched.items():
            assert (low <= address < high) == (slot in plan.intermediates.slots)
    expected = torch.softmax((a.float() @ b.float()).half(), dim=-1) * 2 + a
    assert torch.allclose(run_program(program, inputs)[0].cpu().float(), expected.float(), atol=2e-2)


def test_a_changed_kernel_time_or_name_is_seen_by_the_next_launch():
    program, binds = Chain(), _binds()
    launch(program, binds)
    program.kernels[0].time_us = 50.0
    program.name = "chain, slower"
    launch(program, binds)
    compute = [e for e in last_trace().events if e.args.get("kind") == "Compute"]
    assert compute[0].dur_us == 50.0 and last_trace().meta["launch"] == "chain, slower"
    assert last_plan().name == "chain, slower"
