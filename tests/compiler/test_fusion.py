"""The scheduler: each fusion rule forms its kernel, switches off, respects boundaries, and never changes numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from warning_checks import only_warnings

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.executor import execute
from spyre_lab.compiler.options import FUSION_RULES, CompileOptions

ALL = CompileOptions()
NONE = CompileOptions(fusion=frozenset())


def softmax_fn(x):
    return torch.softmax(x, dim=-1)


def mlp_fn(x, wg, wu, wd):
    return (F.silu(x @ wg) * (x @ wu)) @ wd


def epilogue_fn(x, w, b):
    return torch.relu(x @ w + b) * 0.5


def rmsnorm_fn(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).half() * w


def chain_fn(x):
    return torch.tanh(x * 2 + 1)


def block_fn(x, wg, wu, wd, w):
    h = rmsnorm_fn(x, w)
    return softmax_fn(mlp_fn(h, wg, wu, wd)) + chain_fn(x)


@pytest.fixture(scope="module")
def data():
    torch.manual_seed(0)
    return {
        "x": torch.randn(48, 128).half(),
        "wg": (torch.randn(128, 192) * 0.1).half(), "wu": (torch.randn(128, 192) * 0.1).half(),
        "wd": (torch.randn(192, 128) * 0.1).half(), "b": torch.randn(192).half(), "w": torch.randn(128).half(),
    }


def rules(program):
    return [k.rule for k in program.kernels]


def test_fused_softmax_keeps_intermediates_in_lx(data):
    program = compile_graph(softmax_fn, [data["x"]], ALL)
    (kernel,) = program.kernels
    assert kernel.rule == "softmax"
    assert [n.op for n in kernel.nodes] == ["amax", "sub", "exp", "sum", "div"]
    assert len(kernel.lx_resident) == 4 and kernel.inputs == program.inputs
    assert program.pool_bytes == 0


def test_staged_softmax_goes_through_dram(data):
    program = compile_graph(softmax_fn, [data["x"]], ALL.without("softmax"))
    assert [[n.op for n in k.nodes] for k in program.kernels] == [["amax"], ["sub", "exp", "sum"], ["div"]]
    assert program.pool_bytes > 0 and len(program.dram_plan) == 3   # amax, exp and sum cross kernels


def test_mlp_rule_fuses_gate_up_silu_mul_down(data):
    args = [data[k] for k in ("x", "wg", "wu", "wd")]
    program = compile_graph(mlp_fn, args, ALL)
    assert rules(program) == ["mlp"]
    kernel = program.kernels[0]
    assert [n.op for n in kernel.nodes] == ["matmul", "matmul", "silu", "mul", "matmul"]
    assert set(kernel.inputs) == set(program.inputs) and len(kernel.lx_resident) == 4
    off = compile_graph(mlp_fn, args, ALL.without("mlp"))
    assert "mlp" not in rules(off) and len(off.kernels) >= 3


def test_matmul_epilogue(data):
    args = [data["x"], data["wg"], data["b"]]
    program = compile_graph(epilogue_fn, args, ALL)
    assert rules(program) == ["matmul_epilogue"]
    assert [n.op for n in program.kernels[0].nodes] == ["matmul", "add", "relu", "mul"]
    off = compile_graph(epilogue_fn, args, ALL.without("matmul_epilogue"))
    assert rules(off)[0] == "single" and len(off.kernels) == 2     # the pointwise tail still chains


def test_reduction_fusion_makes_rmsnorm_one_kernel(data):
    program = compile_graph(rmsnorm_fn, [data["x"], data["w"]], ALL)
    assert rules(program) == ["reduction_fusion"]
    off = compile_graph(rmsnorm_fn, [data["x"], data["w"]], ALL.without("reduction_fusion"))
    assert len(off.kernels) > 1 and any(k.nodes[0].op == "mean" for k in off.kernels)


def test_pointwise_chain(data):
    assert rules(compile_graph(chain_fn, [data["x"]], ALL)) == ["pointwise_chain"]
    assert len(compile_graph(chain_fn, [data["x"]], NONE).kernels) == 3


def test_no_fusion_is_one_kernel_per_node(data):
    args = [data[k] for k in ("x", "wg", "wu", "wd", "w")]
    program = compile_graph(block_fn, args, NONE)
    assert len(program.kernels) == program.unfused_kernels
    assert all(len(k.nodes) == 1 for k in program.kernels)


@pytest.mark.parametrize("limit", [3, 4])
def test_bundle_tensor_limit(data, limit):
    """A fused kernel references at most ``limit`` DRAM tensors (a lone op is its own kernel whatever it needs)."""
    x = data["x"]

    def many(a, b, c, d, e):
        return (((a + b) * c - d) + e).exp()

    args = [x, x + 1, x * 2, x - 1, x * 0.5]
    program = compile_graph(many, args, CompileOptions(max_bundle_tensors=limit))
    for k in program.kernels:
        assert len(k.nodes) == 1 or len(set(k.inputs) | set(k.outputs)) <= limit
    assert 1 < len(program.kernels) < 5
    torch.testing.assert_close(execute(program, args).outputs[0], many(*args))


def test_fallback_is_a_hard_boundary(data):
    def with_fallback(x):
        return torch.cumsum(x * 2, dim=-1).exp() + 1

    with only_warnings("aten.cumsum runs on the host CPU"):   # warned once per process: first here or earlier
        program = compile_graph(with_fallback, [data["x"]], ALL)
    kinds = [(k.is_fallback, [n.op for n in k.nodes]) for k in program.kernels]
    assert kinds == [(False, ["mul"]), (True, ["cumsum"]), (False, ["exp", "add"])]


@pytest.mark.parametrize("rule", ["all", *FUSION_RULES, "none"])
def test_fusion_never_changes_the_numbers(data, rule):
    args = [data[k] for k in ("x", "wg", "wu", "wd", "w")]
    options = {"all": ALL, "none": NONE}.get(rule) or ALL.without(rule)
    reference = execute(compile_graph(block_fn, args, ALL), args).outputs[0]
    out = execute(compile_graph(block_fn, args, options), args).outputs[0]
    # fp16 buffers round identically whatever the grouping; only a different core slicing of an op can move a
    # CPU kernel's vectorised tail, by at most 1 fp16 ulp
    torch.testing.assert_close(out, reference, atol=1e-3, rtol=2**-10)
    eager = block_fn(*(t.float() for t in args[:-1]), args[-1].float())
    torch.testing.assert_close(out.float(), eager, atol=2e-2, rtol=2e-2)
