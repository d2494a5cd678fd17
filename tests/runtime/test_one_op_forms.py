"""An eager op at a new shape reuses its form's traced graph: the program, its modeled times and the trace a learner
sees are the ones a fresh trace gives, and an op the decomposition table rewrites is traced at every shape."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.compiler import one_op_graph
from spyre_lab.compiler.backend import to_aten
from spyre_lab.runtime import last_trace, process_state

CALLS = {
    "add": lambda x: torch.add(x, x),
    "mul_scalar": lambda x: x * 0.5,
    "sum_dim": lambda x: x.sum(1),
    "amax_keepdim": lambda x: x.amax(-1, keepdim=True),
    "max_dim": lambda x: torch.max(x, 1).values,
    "mm": lambda x: x @ x.t(),
    "silu": torch.nn.functional.silu,
    "where_scalar": lambda x: torch.where(x > 0, x, 0.0),
    "clamp": lambda x: x.clamp(-0.5, 0.5),
}


def _events(trace):
    return [(e.lane, e.name, e.dur_us) for e in trace.events if not e.lane.startswith("host")]


def _run(call, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float16)
    out = call(x.to("spyre"))
    events = _events(last_trace())                        # the op's own launch (the last one: where, max...)
    return out.cpu(), events, x


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_new_shape_of_a_seen_form_matches_a_fresh_trace(name, monkeypatch):
    call = CALLS[name]
    process_state.reset("caches")
    _run(call, (4, 40))                                   # the form is traced here
    traced = []
    monkeypatch.setattr(one_op_graph, "_retyped", _counting(one_op_graph._retyped, traced))
    reused, reused_events, x = _run(call, (12, 72))
    assert traced, "the second shape was traced again"
    monkeypatch.undo()
    process_state.reset("caches")
    fresh, fresh_events, _ = _run(call, (12, 72))         # no form kept: traced as before
    assert reused_events == fresh_events and any(lane.startswith("stream") for lane, _, _ in fresh_events)
    assert torch.equal(reused, fresh)
    torch.testing.assert_close(reused, call(x), atol=2e-3, rtol=2e-3)


def _counting(fn, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return counted


def test_the_retyped_graph_is_the_traced_graph_at_the_new_shape():
    process_state.reset("caches")

    def mul(a):
        return torch.ops.aten.mul.Tensor(a, torch.tensor(0.5))

    form = ("test", "mul")
    one_op_graph.one_op_graph(mul, [torch.zeros(3, 8, dtype=torch.float16)], torch.ops.aten.mul.Tensor, form, to_aten)
    example = torch.zeros(5, 16, dtype=torch.float16)
    retyped = one_op_graph.one_op_graph(mul, [example], torch.ops.aten.mul.Tensor, form,
                                        lambda *_: pytest.fail("traced again"))
    traced = to_aten(mul, [example])
    assert retyped.code == traced.code
    for a, b in zip(retyped.graph.nodes, traced.graph.nodes):
        va, vb = a.meta.get("val"), b.meta.get("val")
        assert (a.name, a.target) == (b.name, b.target)
        if isinstance(vb, torch.Tensor):
            assert (va.shape, va.dtype, va.stride()) == (vb.shape, vb.dtype, vb.stride())
    process_state.reset("caches")


def test_a_decomposed_op_is_traced_at_every_shape():
    process_state.reset("caches")
    traces = []

    def trace(fn, examples):
        traces.append(1)
        return to_aten(fn, examples)

    def mean(a):
        return torch.ops.aten.mean.dim(a, [1])           # the table rewrites it, with the row length baked in

    for rows in (3, 5):
        one_op_graph.one_op_graph(mean, [torch.zeros(rows, rows + 1)], torch.ops.aten.mean.dim, ("test", "mean"),
                                  trace)
    assert len(traces) == (2 if torch.ops.aten.mean.dim in one_op_graph._decomposed() else 1)
    process_state.reset("caches")
