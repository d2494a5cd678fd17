"""The eager one-op program cache serves a call only with a program built for the same operands.

A program is found again by its key (op, operand geometry, constant values), so two things must hold:
the key tells apart constants that compute differently (``0.0`` and ``-0.0``; each NaN is the same NaN),
and the program never reads a constant the caller can still change (a CPU scalar tensor is keyed by value,
so the program keeps a copy of it, not the caller's tensor).
"""

from __future__ import annotations

import pytest
import torch

from spyre_lab.runtime import eager_programs
from spyre_lab.runtime.errors import SpyreUsageError

X = torch.tensor([-1.5, 0.5, 2.5, 4.0], dtype=torch.float16)
MASK = torch.tensor([True, False, True, False])

SCALAR_TENSOR_OPS = {
    "maximum": lambda x, t: torch.maximum(x, t),
    "minimum": lambda x, t: torch.minimum(x, t),
    "add": lambda x, t: x + t,
    "mul": lambda x, t: x * t,
    "div": lambda x, t: x / t,
    "where": lambda x, t: torch.where(x > 1, x, t),
    "masked_fill": lambda x, t: x.masked_fill(x > 1, t),
    "clamp": lambda x, t: torch.clamp(x, min=t),
    "lerp": lambda x, t: torch.lerp(x, x * 2, t),
    "ge": lambda x, t: x >= t,
}
"""Device ops that take a CPU 0-dim tensor beside a spyre tensor."""


@pytest.fixture(autouse=True)
def fresh_cache():
    eager_programs.clear_program_cache()
    yield
    eager_programs.clear_program_cache()


def _on_spyre(fn, x, *rest):
    return fn(x.to("spyre"), *rest).cpu()


@pytest.mark.parametrize("name", sorted(SCALAR_TENSOR_OPS))
def test_changing_a_cpu_scalar_after_a_call_does_not_change_later_calls(name):
    fn = SCALAR_TENSOR_OPS[name]
    t = torch.tensor(2.0, dtype=torch.float16)
    assert torch.equal(_on_spyre(fn, X, t), fn(X, t))
    t.fill_(3.0)                                               # the caller reuses its scalar
    assert torch.equal(_on_spyre(fn, X, torch.tensor(2.0, dtype=torch.float16)),
                       fn(X, torch.tensor(2.0, dtype=torch.float16)))
    assert torch.equal(_on_spyre(fn, X, t), fn(X, t))         # and the changed one is its new value


SIGNED_ZERO_OPS = {
    "mul scalar": lambda x, zero: x * zero,
    "mul cpu tensor": lambda x, zero: x * torch.tensor(zero),
    "add scalar": lambda x, zero: x * 0.0 + zero,
    "fill_": lambda x, zero: x.clone().fill_(zero),
    "masked_fill": lambda x, zero: x.masked_fill(x > 1, zero),
    "where scalar": lambda x, zero: torch.where(x > 1, x, zero),
    "clamp": lambda x, zero: torch.clamp(x, min=zero, max=zero),
}


@pytest.mark.parametrize("name", sorted(SIGNED_ZERO_OPS))
@pytest.mark.parametrize("first", [0.0, -0.0], ids=["plus_first", "minus_first"])
def test_plus_and_minus_zero_constants_run_their_own_programs(name, first):
    fn = SIGNED_ZERO_OPS[name]
    for zero in (first, -first):
        want = fn(X, zero)
        got = _on_spyre(fn, X, zero)
        assert torch.equal(got, want)
        assert torch.equal(torch.signbit(got), torch.signbit(want)), f"{name} with {zero!r} after {first!r}"


def test_reciprocal_of_a_signed_zero_product_has_the_sign_of_the_zero():
    z = torch.ones(3, dtype=torch.float16, device="spyre")
    assert torch.equal((1 / (z * 0.0)).cpu(), torch.full((3,), float("inf"), dtype=torch.float16))
    assert torch.equal((1 / (z * -0.0)).cpu(), torch.full((3,), -float("inf"), dtype=torch.float16))


@pytest.mark.parametrize("form", ["python float", "cpu tensor"])
def test_nan_constants_are_one_program_not_a_cache_miss_per_call(form):
    x = X.to("spyre")

    def nan():                       # a new NaN object each call: NaN never compares equal to itself
        return float("nan") if form == "python float" else torch.tensor(float("nan"))

    first = torch.maximum(x, torch.tensor(float("nan"))) if form == "cpu tensor" else x * nan()
    size = eager_programs.program_cache_size()
    for _ in range(4):
        again = torch.maximum(x, nan()) if form == "cpu tensor" else x * nan()
        assert torch.isnan(again.cpu()).all()
    assert torch.isnan(first.cpu()).all()
    assert eager_programs.program_cache_size() == size


def test_a_cpu_operand_with_dimensions_is_refused_after_a_scalar_of_the_same_value_ran():
    x = X.to("spyre")
    torch.maximum(x, torch.tensor(2.0, dtype=torch.float16))
    with pytest.raises(SpyreUsageError, match=r"only 0-dim CPU tensors are accepted"):
        torch.maximum(x, torch.tensor([2.0], dtype=torch.float16))


def test_int_float_and_bool_constants_of_one_value_keep_their_own_result_dtypes(fresh_warnings):
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    for scalar in (1, True, 1.0):
        want = x * scalar
        if want.dtype == torch.float32:
            with pytest.warns(UserWarning, match=r"spyre stores torch.float32 tensors as float16"):
                got = x.to("spyre") * scalar
        else:
            got = x.to("spyre") * scalar
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
