"""Lowering: ATen ops -> Pointwise / Reduction / MatMul / Fallback, free views, constants, fallbacks, errors."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from warning_checks import only_warnings

from spyre_lab.compiler import lowering
from spyre_lab.compiler.backend import compile_graph, to_aten
from spyre_lab.compiler.executor import execute
from spyre_lab.compiler.ir import Fallback, MatMul, Pointwise, Reduction
from spyre_lab.compiler.lowering import lower

torch.manual_seed(0)
X = torch.randn(4, 24, 80).half()
W = (torch.randn(80, 72) * 0.1).half()
IDX = torch.tensor([3, 0, 2], dtype=torch.int64)


def run(fn, *args, expect: tuple[str, ...] = ()):
    with only_warnings(*expect):
        program = compile_graph(fn, list(args))
    return program, execute(program, list(args)).outputs


COVERAGE = {
    "arith": lambda x: ((x + 1) * 2 - x / 3).neg() + x.pow(2),
    "transcendental": lambda x: x.abs().add(0.5).rsqrt() + x.exp().clamp(max=8) + x.abs().add(1).sqrt().log(),
    "activations": lambda x: F.silu(x) + F.gelu(x) + torch.sigmoid(x) + torch.tanh(x) + torch.relu(x),
    "reductions": lambda x: x.sum(-1) + x.mean(-1) + x.amax(-1) + x.max(dim=-1).values - x.min(dim=-1).values,
    "argmax": lambda x: x.argmax(-1),
    "topk": lambda x: torch.topk(x, 5, dim=-1).values,
    "where": lambda x: torch.where(x > 0, x, x * 0.1).masked_fill(x < -1, 0.0),
    "max_min": lambda x: torch.maximum(x, x * 0.5) + torch.minimum(x, -x),
    "cast": lambda x: (x.float() * 3).to(torch.float16),
    "views": lambda x: x.view(4, 24, 5, 16).permute(0, 2, 1, 3).reshape(4, 5, 384)[:, 1:3] * 2,
    "cat_slice": lambda x: torch.cat([x[..., :40], -x[..., 40:]], dim=-1) + x.transpose(0, 1).transpose(0, 1),
    "expand": lambda x: x[:, :1, :].expand(4, 24, 80) + x,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "layer_norm": lambda x: F.layer_norm(x, (80,)),
    "rms_norm": lambda x: F.rms_norm(x.float(), (80,)).half(),
    "index_select": lambda x: torch.index_select(x, 1, torch.tensor([3, 0, 2])) * 2,
}


@pytest.mark.parametrize("name", sorted(COVERAGE))
def test_supported_ops_run_on_device_and_match_eager(name):
    fn = COVERAGE[name]
    program, (out,) = run(fn, X)
    assert not program.fallback_ops, f"{name} fell back: {program.fallback_ops}"
    ref = fn(X.float())
    if ref.dtype.is_floating_point:
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    else:
        assert torch.equal(out, ref)


def test_matmul_family_lowers_to_matmul_nodes():
    def fn(x, w, b, a3, b3):
        return (F.linear(x, w.t(), b), torch.addmm(b, x[0], w), x @ w, torch.bmm(a3, b3), a3 @ b3[0])

    a3, b3 = torch.randn(3, 16, 80).half(), torch.randn(3, 80, 24).half()
    b = torch.randn(72).half()
    args = [X, W, b, a3, b3]
    gm = to_aten(fn, args)
    lowered = lower(gm)
    matmuls = [n for n in lowered.graph.nodes if isinstance(n, MatMul)]
    assert len(matmuls) == 5
    assert all(n.dims == {"B": n.b, "M": n.m, "N": n.n, "K": n.k} and n.reduction_dims == ("K",) for n in matmuls)
    _, outs = run(fn, *args)
    for out, ref in zip(outs, fn(*(t.float() for t in args))):
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_free_views_make_no_nodes():
    def fn(x):
        return (x.view(96, 80) * 2).view(4, 24, 80).unsqueeze(0).squeeze(0)

    lowered = lower(to_aten(fn, [X]))
    assert [n.op for n in lowered.graph.nodes] == ["mul"]
    assert lowered.outputs[0].steps, "the output is a view of the mul buffer"


def test_sdpa_causal_mask_is_a_compile_time_constant():
    q = torch.randn(1, 2, 16, 64).half()

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    lowered = lower(to_aten(fn, [q, q, q]))
    ops = [n.op for n in lowered.graph.nodes]
    assert "arange" not in ops and not any(isinstance(n, Fallback) for n in lowered.graph.nodes)
    assert ops.count("matmul") == 2 and {"amax", "exp", "sum", "div"} <= set(ops)
    masks = [name for name, v in lowered.constants.items() if tuple(v.shape) == (16, 16)]
    assert masks and all(lowered.graph.buffers[m].role == "constant" for m in masks)


def test_node_kinds_and_dims():
    def fn(x, w):
        return (x @ w).sum(-1, keepdim=True) * x.mean(-1, keepdim=True)

    lowered = lower(to_aten(fn, [X, W]))
    kinds = [(type(n).__name__, n.op) for n in lowered.graph.nodes]
    assert ("MatMul", "matmul") in kinds and ("Reduction", "sum") in kinds and ("Pointwise", "mul") in kinds
    red = next(n for n in lowered.graph.nodes if isinstance(n, Reduction) and n.op == "mean")
    assert red.reduction_dims == ("d2",) and red.dims == {"d0": 4, "d1": 24, "d2": 80} and red.stick_dim == "d1"
    pw = next(n for n in lowered.graph.nodes if isinstance(n, Pointwise))
    assert pw.stick_dim == list(pw.dims)[-1]


def test_fallback_warns_once_per_op_and_is_exact():
    lowering._WARNED.discard("cumsum")
    fn = lambda x: torch.cumsum(x, dim=-1) + torch.cumsum(x * 2, dim=-1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = compile_graph(fn, [X])
    messages = [str(w.message) for w in caught if "cumsum" in str(w.message)]
    assert len(messages) == 1 and "host CPU" in messages[0]
    assert program.fallback_ops == ["cumsum"]
    torch.testing.assert_close(execute(program, [X]).outputs[0], fn(X))


def test_embedding_falls_back_like_torch_spyre():
    table = torch.randn(10, 64).half()
    program, (out,) = run(lambda idx, t: F.embedding(idx, t) * 2, IDX, table,
                         expect=(r"aten\.embedding runs on the host CPU",))
    assert "embedding" in program.fallback_ops
    assert torch.equal(out, F.embedding(IDX, table) * 2)


def test_bad_input_dtype_names_the_fix():
    with pytest.raises(TypeError, match=r"\.half\(\)"):
        compile_graph(lambda x: x + 1, [torch.randn(4, dtype=torch.float64)])


def test_meta_inputs_compile_without_data():
    program = compile_graph(lambda x, w: torch.relu(x @ w), [torch.empty(128, 256, dtype=torch.float16,
                                                                        device="meta"),
                                                             torch.empty(256, 64, dtype=torch.float16, device="meta")])
    assert program.kernels[0].rule == "matmul_epilogue"


def test_module_constants_each_get_their_own_buffer():
    """A module traced directly folds its weights in as constants; weight and bias of one addmm stay apart."""
    model = torch.nn.Sequential(torch.nn.Linear(80, 48), torch.nn.Linear(48, 48)).half()
    x = torch.randn(6, 80).half()
    program, (out,) = run(model, x)
    assert len(program.constants) == 4 and len({tuple(c.shape) for c in program.constants.values()}) == 3
    torch.testing.assert_close(out, model(x).detach(), atol=1e-2, rtol=1e-2)


def test_split_pieces_are_views_not_fallbacks():
    """A fused QKV projection split into q, k, v lowers to slice reads of one buffer: no host fallback."""

    def qkv(x, w):
        q, k, v = torch.split(x @ w, [64, 32, 32], dim=-1)
        first, second = torch.unbind(k.reshape(8, 2, 16), dim=1)
        return q * 2, first + second, v.sum(-1)

    x, w = torch.randn(8, 64, dtype=torch.float16), torch.randn(64, 128, dtype=torch.float16)
    program = compile_graph(qkv, [x, w])
    assert not program.fallback_ops
    for got, want in zip(execute(program, [x, w]).outputs, qkv(x.float(), w.float())):
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=2e-2)
