"""Ordinary programs that used to stop torch.compile(backend="spyre"): each compiles and matches eager.

0-dim constants next to device values (triu, nan_to_num, minimum/maximum with a 0-dim tensor, mask assignment),
zero-size tensors (an empty slice, an empty rotary half), a flatten of a value eager keeps transposed in memory,
float64 inside a graph; and a bad option value named with what it accepts.
"""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("SPYRE_LAB_DEVICES", "2")

import torch
from compiler.caller_state import assert_same_state, observe_checked

import spyre_lab.runtime  # noqa: F401  (the spyre device and backend)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def masked_zero(x):
    x = x.clone()
    x[x > 0.5] = 0.0
    return x


def masked_softmax(x):
    return x.masked_fill(x > 0, float("-inf")).softmax(-1).nan_to_num()


def flatten_after_transposed_update(x):
    x = x.clone()
    x.t().add_(1)
    return x.reshape(-1, 1)


def rotary_with_empty_pass(x):
    rot, rest = x[..., :4], x[..., 4:]                 # Phi-3's partial rotary: the pass-through half is empty
    return torch.cat([rot * 2 - rot.flip(-1), rest], dim=-1)


ZERO_DIM = {
    "triu": torch.triu,
    "tril": lambda x: torch.tril(x, -1),
    "nan_to_num": lambda x: torch.nan_to_num(x / (x - x)),
    "maximum_0dim": lambda x: torch.maximum(x, torch.tensor(0.25, dtype=x.dtype, device=x.device)),
    "minimum_0dim": lambda x: torch.minimum(x, torch.tensor(-0.5, device=x.device).to(x.dtype)),
    "where_0dim": lambda x: torch.where(x > 0, x, torch.tensor(0.5, dtype=x.dtype, device=x.device)),
    "masked_zero": masked_zero,
    "masked_softmax": masked_softmax,
}
ZERO_SIZE = {
    "empty_slice_plus_one": lambda x: x[:, 4:] + 1,
    "sum_of_empty": lambda x: x[:, :0].sum(-1) + x[:, 0],
    "matmul_k0": lambda x: x[:, :0] @ x[:0, :],
    "rotary_with_empty_pass": rotary_with_empty_pass,
    "empty_rows_softmax": lambda x: torch.softmax(x[:0], -1),
}
LAYOUT_AND_DTYPE = {
    "flatten_after_transposed_update": flatten_after_transposed_update,
    "to_float64": lambda x: (x * 2).to(torch.float64),
    "float64_math_back_to_half": lambda x: (x.double() * 3.3).half() + x,
}
PROGRAMS = {**ZERO_DIM, **ZERO_SIZE, **LAYOUT_AND_DTYPE}


@pytest.mark.parametrize("device", ["cpu", "spyre"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_compiles_and_matches_eager(name, device):
    fn = PROGRAMS[name]
    g = torch.Generator().manual_seed(3)
    base = torch.randn(5, 4, generator=g).half()

    def inputs():
        return [base.clone().to(device)]
    want = observe_checked(fn, inputs)
    torch._dynamo.reset()
    got = observe_checked(torch.compile(fn, backend="spyre", fullgraph=name not in ("masked_zero",)), inputs)
    assert_same_state(got, want)


@pytest.mark.parametrize("bad, named", [
    (5, "fusion"), ({"softmax": 1}, "fusion"), (None, "fusion"),
])
def test_bad_fusion_option_names_the_option_and_what_it_takes(bad, named):
    compiled = torch.compile(lambda x: x * 2, backend="spyre", options={"fusion": bad})
    with pytest.raises(Exception, match=rf"'{named}' must be True \(every rule\), False \(none\), a rule name"):
        compiled(torch.ones(2).half())


@pytest.mark.parametrize("option, value", [("double_buffer", "yes"), ("max_bundle_tensors", "6")])
def test_bad_option_types_are_named(option, value):
    from spyre_lab.compiler.backend import options_from
    with pytest.raises(TypeError, match=rf"{option} must be"):
        options_from({option: value})


def test_epilogue_reading_a_matmul_operand_gets_a_tile_plan():
    """``(h @ x.t()) @ x * 0.1 + x``: the fused epilogue reads x, which the matmul also reads as B; the two tiles
    of x are different LX buffers (one name for both left the kernel without a tile plan, and untimed)."""
    from spyre_lab.compiler.backend import compile_graph
    from spyre_lab.compiler.kernel_spec import KernelSpec

    def f(h, x):
        return (h @ x.t()) @ x * 0.1 + x
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program = compile_graph(f, [torch.randn(5, 5).half(), torch.randn(5, 5).half()])
    assert all(isinstance(launch, KernelSpec) for launch in program.launches)
    assert any(k.rule == "matmul_epilogue" and "add" in [n.op for n in k.nodes] for k in program.kernels)
