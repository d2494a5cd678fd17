"""Layout propagation: every buffer gets a StickLayout; restickify exactly where the sticks disagree."""

from __future__ import annotations

import torch

from spyre_lab.compiler.backend import compile_graph, to_aten
from spyre_lab.compiler.executor import execute
from spyre_lab.compiler.explain import explain_program
from spyre_lab.compiler.layout_propagation import propagate_layouts, stick_conflict
from spyre_lab.compiler.lowering import lower
from spyre_lab.device.config import SPYRE
from spyre_lab.device.layout import StickLayout

X = torch.randn(64, 256).half()
W = torch.randn(128, 256).half()


def lowered_with_layouts(fn, *args):
    lowered = lower(to_aten(fn, list(args)))
    return lowered, propagate_layouts(lowered, SPYRE)


def test_every_buffer_gets_the_default_stick_layout():
    lowered, _ = lowered_with_layouts(lambda x: torch.softmax(x * 2, -1), X)
    for buf in lowered.graph.buffers.values():
        assert buf.layout == StickLayout.default(buf.shape, buf.dtype)
    assert lowered.graph.buffers[lowered.graph.inputs[0]].layout.device_size == (4, 64, 64)


def test_linear_weight_input_is_restickified_each_call():
    """x @ W.T reads W (sticked on K) as the matmul's B operand, which must be sticked on N."""
    lowered, events = lowered_with_layouts(lambda x, w: x @ w.t(), X, W)
    assert len(events) == 1 and events[0].source == lowered.graph.inputs[1] and not events[0].at_compile_time
    assert "stride 256" in events[0].reason
    assert [n.op for n in lowered.graph.nodes] == ["restickify", "matmul"]
    assert lowered.graph.buffers[events[0].buffer].shape == (256, 128)


def test_pre_transposed_weight_needs_no_restickify():
    lowered, events = lowered_with_layouts(lambda x, wt: x @ wt, X, W.t().contiguous())
    assert events == [] and [n.op for n in lowered.graph.nodes] == ["matmul"]


def test_constant_weight_is_transposed_once_at_compile_time():
    """A module traced directly holds W as a constant: W.T folds into a stored, N-sticked constant (the
    vLLM plugin's "store W-transposed at load"), so no restickify kernel runs."""
    linear = torch.nn.Linear(256, 128, bias=False).half()
    program = compile_graph(linear, [X])
    assert [k.rule for k in program.kernels] == ["single"] and not program.restickifies
    (weight,) = program.constants.values()
    assert tuple(weight.shape) == (256, 128) and weight.is_contiguous()
    torch.testing.assert_close(execute(program, [X]).outputs[0], linear(X), atol=1e-2, rtol=1e-2)


def test_views_that_split_sticks_need_restickify():
    x = torch.randn(8, 128).half()
    meta = lambda t: torch.empty(t, dtype=torch.float16, device="meta")
    from spyre_lab.compiler.lowering import Read

    whole_sticks = Read("x", (), meta((8, 2, 64)).view(8, 2, 64))
    assert stick_conflict(Read("x", (("v", ()),), whole_sticks.meta), (8, 128), torch.float16, SPYRE) is None
    half_stick = meta((8, 128))[:, 32:]
    assert "into a stick" in stick_conflict(Read("x", (("s", ()),), half_stick), (8, 128), torch.float16, SPYRE)
    pieces = meta((8, 128)).view(8, 4, 32)
    assert "pieces of 32" in stick_conflict(Read("x", (("v", ()),), pieces), (8, 128), torch.float16, SPYRE)
    transposed = meta((8, 128)).t()
    assert "stride 128" in stick_conflict(Read("x", (("t", ()),), transposed), (8, 128), torch.float16, SPYRE)
    _, events = lowered_with_layouts(lambda t: t[:, 32:] * 2, x)
    assert len(events) == 1


def test_explain_shows_restickify():
    program = compile_graph(lambda x, w: x @ w.t(), [X, W])
    text = explain_program(program)
    assert "restickify" in text and "stride 256" in text
