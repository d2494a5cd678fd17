"""The host path's caches: a program is bound once per card, simulator events are placed only when read."""

from __future__ import annotations

import torch

from spyre_lab.runtime import jobplan, last_trace, recording
from spyre_lab.runtime.jobplan import FunctionKernel, StepKind, launch


class Chain:
    """x -> x + 1 -> x + 2: a hand-made two-kernel program."""

    def __init__(self) -> None:
        self.name, self.num_nodes, self.mutations = "chain", 2, ()
        self.kernels = [FunctionKernel("k0", ["x", "t"], lambda ops: ops.write("t", ops["x"] + 1), 5.0),
                        FunctionKernel("k1", ["t", "y"], lambda ops: ops.write("y", ops["t"] + 1), 5.0)]


def _binds() -> dict[str, torch.Tensor]:
    return {s: torch.zeros(4, 64, dtype=torch.float16, device="spyre") for s in ("x", "t", "y")}


def test_a_cached_launch_does_not_rebuild_its_kernel_list(monkeypatch):
    program, binds = Chain(), _binds()
    calls = []
    real = jobplan.writebacks
    monkeypatch.setattr(jobplan, "writebacks", lambda *a: calls.append(1) or real(*a))
    launch(program, binds)
    first = len(calls)
    for _ in range(5):
        launch(program, binds)
    assert first >= 1 and len(calls) == first
    assert torch.equal(binds["y"].cpu(), torch.full((4, 64), 2.0, dtype=torch.float16))


def test_a_program_that_swaps_its_kernels_is_bound_again():
    program, binds = Chain(), _binds()
    launch(program, binds)
    program.kernels = [FunctionKernel("k0", ["x", "y"], lambda ops: ops.write("y", ops["x"] + 7), 5.0)]
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
    count, start, end = len(trace), trace.start_us, trace.end_us
    assert count > 10                              # per-core events of the one-op program are there
    assert any(e.lane.startswith("core") for e in trace.events)
    assert len(trace) == count == len(trace.events)
    assert (trace.start_us, trace.end_us) == (start, end)
    assert end == max(e.end_us for e in trace.events) and start == min(e.start_us for e in trace.events)
    cores = [e for e in launch_trace.events if e.lane.startswith("core")]
    assert cores and cores == [e for e in trace.events if e.lane.startswith("core")]
    compute = next(e for e in trace.events if e.args.get("kind") == "Compute")
    assert min(e.start_us for e in cores) >= compute.start_us
