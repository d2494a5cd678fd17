"""A Python number next to a device tensor is an immediate operand of the kernel, not a rounded fp16 buffer.

``x * 0.17677`` reaches a one-op compile as ``mul(x, tensor(0.17677))``; stored as a constant buffer the scalar
was rounded to the card's fp16 (with a dtype warning) and the product differed from the CPU's by an ulp.
"""

import warnings

import pytest
import torch

import spyre_lab  # noqa: F401  (registers the device)

CASES = {
    "mul": lambda t: t * 0.17677,
    "div": lambda t: t / 3.3,
    "add": lambda t: t + 1e-3,
    "sub": lambda t: t - 2.1,
    "add alpha": lambda t: torch.add(t, 0.3, alpha=0.7),
    "where": lambda t: torch.where(t > 0, t, 0.123),
}


def _no_storage_warning(caught: list[warnings.WarningMessage]) -> None:
    stored = [str(w.message) for w in caught if "spyre stores" in str(w.message)]
    assert not stored, stored


@pytest.mark.parametrize("name", CASES)
def test_eager_scalar_ops_equal_the_cpu_exactly(name):
    f = CASES[name]
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1)).half()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = f(x.to("spyre")).cpu()
    _no_storage_warning(caught)
    assert got.dtype == torch.float16
    assert torch.equal(got, f(x))


def test_compiled_scalar_ops_equal_the_cpu_exactly():
    def fn(t):
        return torch.where(t > 0, t * 0.17677 + 1e-3, t / 3.3)

    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(2)).half()
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(fn, backend="spyre")(x.to("spyre")).cpu()
    _no_storage_warning(caught)
    assert torch.equal(got, fn(x))


def test_promotion_still_follows_the_scalar_when_it_must():
    """An int tensor times a float scalar is float32 on the CPU: the card keeps that dtype (stored as fp16,
    which it says once per process), so the immediate rule applies only next to a floating operand."""
    x = torch.arange(6)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = x.to("spyre") * 0.5
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), x * 0.5)
