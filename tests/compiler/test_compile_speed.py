"""Codegen shortcuts that make compiling faster must not change what is compiled."""

from __future__ import annotations

import functools

import torch

from spyre_lab.compiler import codegen_matmul, plan_memo
from spyre_lab.compiler.codegen import generate_kernel
from spyre_lab.compiler.ir import BufferInfo, MatMul, NodeGroup
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.scratchpad import LXBuffer, plan_scratchpad
from spyre_lab.compiler.spec_common import live_bytes_bound
from spyre_lab.device.config import SPYRE
from spyre_lab.device.isa import OpKind


def _noop(*_):
    return None


def gemv(n: int, k: int) -> tuple[NodeGroup, dict[str, BufferInfo]]:
    f16 = torch.float16
    bufs = {"a": BufferInfo("a", (1, k), f16, "input"), "w": BufferInfo("w", (k, n), f16, "constant"),
            "c": BufferInfo("c", (1, n), f16, "output")}
    node = MatMul("mm", "matmul", ("a", "w"), "c", {"B": 1, "M": 1, "N": n, "K": k}, _noop, ("K",), "N", 1, 1, n, k)
    return NodeGroup("gemv", [node], "single", ["a", "w"], ["c"]), bufs


def renamed_gemv(n: int, k: int, tag: str) -> tuple[NodeGroup, dict[str, BufferInfo]]:
    """:func:`gemv` with every buffer renamed (``a`` -> ``x<tag>``, ``w`` -> ``w<tag>``, ``c`` -> ``y<tag>``)."""
    first, bufs = gemv(n, k)
    rename = {"a": f"x{tag}", "w": f"w{tag}", "c": f"y{tag}"}
    node = first.nodes[0]
    other = NodeGroup(f"gemv_{tag}", [MatMul(f"mm{tag}", "matmul", (rename["a"], rename["w"]), rename["c"],
                                             dict(node.dims), _noop, ("K",), "N", 1, 1, node.n, node.k)],
                      "single", [rename["a"], rename["w"]], [rename["c"]])
    return other, {rename[b]: BufferInfo(rename[b], i.shape, i.dtype, i.role) for b, i in bufs.items()}


def test_partners_of_one_rank_share_ops_but_talk_to_their_own_group(monkeypatch):
    kernel, bufs = gemv(4096, 4096)
    shared = generate_kernel(kernel, bufs, SPYRE, CompileOptions())
    assert shared.division.split_reduction_dim == "K"
    monkeypatch.setattr(codegen_matmul, "per_core_programs",
                        functools.partial(codegen_matmul.per_core_programs, reuse_partners=False))
    plan_memo.clear()                                     # plan it again rather than reuse the first plan
    fresh = generate_kernel(kernel, bufs, SPYRE, CompileOptions())
    for c, (p, q) in enumerate(zip(shared.tile_kernel.programs, fresh.tile_kernel.programs)):
        assert p.ops == q.ops, f"core {c}"
    ids = {id(op) for p in shared.tile_kernel.programs for op in p}
    assert len(ids) < shared.tile_kernel.num_ops          # cores of one rank hold the very same op objects
    peers = {op.peer for p in shared.tile_kernel.programs for op in p if op.kind is OpKind.RING_SEND}
    assert len(peers) > 1
    assert shared.simulate().time_us == fresh.simulate().time_us


def test_live_bytes_bound_never_exceeds_the_planned_peak():
    bufs = [LXBuffer("a", 100, 0, 2), LXBuffer("b", 50, 1, 3), LXBuffer("c", 70, 3, 4),
            LXBuffer("d", 60, 2, 2, "a"), LXBuffer("e", 30, 4, 4)]
    plan = plan_scratchpad(bufs, 10_000, "greedy")
    assert live_bytes_bound(bufs) == 150 <= plan.peak


def test_a_repeated_kernel_is_planned_once_and_renamed():
    """Two kernels that differ only in their buffers' names (two layers' gemvs): one plan, the second renamed."""
    first, bufs = gemv(4096, 4096)
    rename = {"a": "x7", "w": "w7", "c": "y7"}
    node = first.nodes[0]
    other = NodeGroup("gemv_7", [MatMul("mm7", "matmul", ("x7", "w7"), "y7", dict(node.dims), _noop, ("K",), "N",
                                       1, 1, node.n, node.k)], "single", ["x7", "w7"], ["y7"])
    other_bufs = {rename[b]: BufferInfo(rename[b], i.shape, i.dtype, i.role) for b, i in bufs.items()}
    plan_memo.clear()
    a = generate_kernel(first, bufs, SPYRE, CompileOptions())
    b = generate_kernel(other, other_bufs, SPYRE, CompileOptions())
    assert plan_memo.stats()["plans"] == 1
    assert b.name == b.tile_kernel.name == "gemv_7" and b.address_slots == ["x7", "w7", "y7"]
    assert set(b.operands) == set(b.buffers) == {"x7", "w7", "y7"} and b.buffers["w7"] is other_bufs["w7"]
    ops_a = [op for p in a.tile_kernel.programs for op in p]
    ops_b = [op for p in b.tile_kernel.programs for op in p]
    assert [(o.kind, o.nbytes, o.deps, o.peer) for o in ops_a] == [(o.kind, o.nbytes, o.deps, o.peer) for o in ops_b]
    loads = [o.name for o in ops_b if o.kind is OpKind.LOAD]
    assert any("x7" in n for n in loads) and not any(n.split()[1].startswith(("a[", "w[")) for n in loads)
    assert a.simulate().time_us == b.simulate().time_us


def test_options_no_planner_reads_share_one_plan():
    """The fusion rules, the timing mode and the bundle limit shape the schedule, not a kernel's plan: a kernel
    planned under another rule set reuses the plan; an option a planner reads (double buffering) plans again."""
    kernel, bufs = gemv(4096, 4096)
    plan_memo.clear()
    a = generate_kernel(kernel, bufs, SPYRE, CompileOptions())
    b = generate_kernel(kernel, bufs, SPYRE, CompileOptions(fusion=frozenset(), timing="event", max_bundle_tensors=3))
    assert plan_memo.stats()["plans"] == 1
    assert a.simulate().time_us == b.simulate().time_us
    c = generate_kernel(kernel, bufs, SPYRE, CompileOptions(double_buffer=False))
    assert plan_memo.stats()["plans"] == 2
    assert c.simulate().time_us != a.simulate().time_us


def test_a_repeated_kernel_is_timed_once(monkeypatch):
    """Copies of one plan share its analytic timing (whichever asks first times it); an event trace, which names
    the ops, stays each copy's own."""
    from spyre_lab.device import sim

    calls = []
    real = sim.simulate
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: calls.append(k.get("mode")) or real(*a, **k))
    kernel, bufs = gemv(4096, 4096)
    plan_memo.clear()
    a = generate_kernel(kernel, bufs, SPYRE, CompileOptions())
    b = generate_kernel(kernel, bufs, SPYRE, CompileOptions())
    assert a.analytic is b.analytic and a.analytic.result is None      # one timing for the plan, not yet made
    assert b.simulate() is a.simulate() and calls == ["analytic"]
    assert b.simulate("event") is not a.simulate("event") and calls == ["analytic", "event", "event"]
    assert set(a.traces) == set(b.traces) == {"event"} and a.traces["event"] is not b.traces["event"]
    renamed = generate_kernel(*renamed_gemv(4096, 4096, "7"), SPYRE, CompileOptions())
    assert renamed.analytic is a.analytic and renamed.simulate() is a.simulate()
    names = {e.name for e in renamed.simulate("event").trace.events}
    assert any(n.startswith("load x7 ") for n in names) and not any(n.startswith("load a ") for n in names)
    assert any(e.name.startswith("load a ") for e in a.simulate("event").trace.events)  # each its own names


def test_a_spec_planned_on_its_own_is_timed_on_its_own():
    """Two plans of different kernels never share a timing: the shared result is the plan's, not a global one."""
    plan_memo.clear()
    a = generate_kernel(*gemv(4096, 4096), SPYRE, CompileOptions())
    b = generate_kernel(*gemv(4096, 1024), SPYRE, CompileOptions())
    assert a.analytic is not b.analytic
    assert a.simulate().time_us != b.simulate().time_us
