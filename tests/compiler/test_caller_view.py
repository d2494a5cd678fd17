"""torch.compile(backend="spyre") gives the caller what eager gives: fresh outputs, honoured aliasing, eager's devices.

Each program runs eagerly and compiled on CPU and on spyre inputs; :mod:`caller_state` records values, devices,
dtypes, object identity, the inputs after the call, what writing to the outputs does and the next call's outputs.
"""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("SPYRE_LAB_DEVICES", "2")

import torch
from compiler.caller_state import assert_same_state, observe, observe_checked

import spyre_lab.runtime  # noqa: F401  (the spyre device and backend)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def half(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).half()


def compare(fn, make_inputs, device: str, touch=None) -> None:
    """Eager and compiled on ``device``'s inputs show the caller the same state."""
    def on_device():
        return [t.to(device) for t in make_inputs()]
    want = observe_checked(fn, on_device, touch)
    torch._dynamo.reset()
    got = observe_checked(torch.compile(fn, backend="spyre"), on_device, touch)
    assert_same_state(got, want)


# --- 1: constant outputs are fresh on every call ------------------------------------------------------------
def init_zeros(x):
    return x * 2, torch.zeros(2, 3, device=x.device, dtype=x.dtype)


def init_full(x):
    return torch.full((2, 3), 0.5, device=x.device, dtype=x.dtype)


def init_ones_like(x):
    return torch.ones_like(x), x + 1


def state_and_arange(x):
    return torch.arange(6, device=x.device).reshape(2, 3), x.sum()


@pytest.mark.parametrize("device", ["cpu", "spyre"])
@pytest.mark.parametrize("fn", [init_zeros, init_full, init_ones_like, state_and_arange], ids=lambda f: f.__name__)
def test_constant_outputs_are_new_tensors_on_every_call(fn, device):
    compare(fn, lambda: [half(2, 3)], device)


def test_updated_zeros_do_not_come_back():
    compiled = torch.compile(init_zeros, backend="spyre")
    x = half(2, 3).to("spyre")
    _, state = compiled(x)
    state.add_(1)
    _, fresh = compiled(x)
    assert fresh is not state and fresh.untyped_storage().data_ptr() != state.untyped_storage().data_ptr()
    assert torch.equal(fresh.cpu(), torch.zeros(2, 3, dtype=torch.float16))


# --- 2: aliasing between inputs, and between inputs and outputs -------------------------------------------
def scale_then_read_other(a, b):
    a.mul_(2)
    return b.sum()


def add_then_read_other(a, b):
    a.add_(1)
    return b * 1


def update_view_read_base(a, b):
    b.add_(3)
    return a * 1, b.sum()


@pytest.mark.parametrize("device", ["cpu", "spyre"])
@pytest.mark.parametrize("fn, make_inputs", [
    (scale_then_read_other, lambda: (lambda d: [d, d[1]])(half(2, 4))),
    (add_then_read_other, lambda: (lambda d: [d, d.view(-1)])(half(2, 3))),
    (add_then_read_other, lambda: (lambda d: [d[:, 1:], d.t()])(half(3, 3))),
    (update_view_read_base, lambda: (lambda d: [d, d[0]])(half(2, 5))),
], ids=["row-of-mutated", "flat-view", "overlapping-views", "mutated-row-of-base"])
def test_aliased_inputs_see_the_update(fn, make_inputs, device):
    def aliased():              # the views taken on the device, so the pair really shares memory there
        tensors = make_inputs()
        root = tensors[0] if tensors[0]._base is None else tensors[0]._base
        moved = root.to(device)
        return [moved.as_strided(t.shape, t.stride(), t.storage_offset()) for t in tensors]
    want = observe_checked(fn, aliased)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="shares that memory.*op by op"):
        got = observe(torch.compile(fn, backend="spyre"), aliased)
    assert_same_state(got, want)


def test_separate_inputs_still_run_the_program():
    compiled = torch.compile(scale_then_read_other, backend="spyre")
    a, b = half(2, 4), half(4, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = compiled(a.clone(), b)
    torch.testing.assert_close(out, b.sum(), atol=1e-2, rtol=1e-2)
    # two halves of one buffer that do not overlap need no eager run either
    d = half(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.compile(scale_then_read_other, backend="spyre")(d[0], d[1])


def row_view(x):
    return x[0]


def transposed(x):
    return x.t()


def updated_then_view(x):
    x.add_(1)
    return x[1:], x * 2


def same_tensor_twice(x):
    y = x + 1
    return y, y


def outputs_share_memory(x):
    y = x * 3
    return y, y.view(-1), y[0]


def contiguous_of_contiguous(x):
    return x.contiguous(), x.view(x.shape)


@pytest.mark.parametrize("device", ["cpu", "spyre"])
@pytest.mark.parametrize("fn", [row_view, transposed, updated_then_view, same_tensor_twice, outputs_share_memory,
                                contiguous_of_contiguous], ids=lambda f: f.__name__)
def test_outputs_alias_inputs_and_each_other_as_eager(fn, device):
    compare(fn, lambda: [half(3, 4)], device)


# --- 3: devices inside a graph ----------------------------------------------------------------------------
def to_card(x):
    return x.to("spyre") * 2


def to_host(x):
    return x.cpu() * 2


def arange_on_card(x):
    return torch.arange(x.shape[0], device="spyre") + 1, x + 1


def mask_from_arange(x):
    return x[torch.arange(3, device=x.device) % 2 == 0]


@pytest.mark.parametrize("device", ["cpu", "spyre"])
@pytest.mark.parametrize("fn", [to_card, to_host, arange_on_card, mask_from_arange], ids=lambda f: f.__name__)
def test_output_devices_are_eagers(fn, device):
    compare(fn, lambda: [half(3, 4)], device)
