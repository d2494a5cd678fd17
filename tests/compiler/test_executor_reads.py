"""Read.apply: a chain of views replayed as one strided window gives the very tensor the chain gives."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_lab.compiler.access import Read

aten = torch.ops.aten

STEPS = {
    "t": lambda t, rng: (aten.t.default, ()) if t.dim() == 2 else None,
    "permute": lambda t, rng: (aten.permute.default, (rng.sample(range(t.dim()), t.dim()),)),
    "unsqueeze": lambda t, rng: (aten.unsqueeze.default, (rng.randrange(t.dim() + 1),)),
    "slice": lambda t, rng: (aten.slice.Tensor, (0, 1, t.shape[0])) if t.dim() and t.shape[0] > 1 else None,
    "step": lambda t, rng: (aten.slice.Tensor, (t.dim() - 1, 0, t.shape[-1], 2)) if t.dim() else None,
    "expand": lambda t, rng: (aten.expand.default, ([3, *t.shape],)),
    "select": lambda t, rng: (aten.select.int, (0, t.shape[0] - 1)) if t.dim() > 1 else None,
    "view": lambda t, rng: (aten.view.default, ([-1],)) if t.is_contiguous() else None,
    "clone": lambda t, rng: (aten.clone.default, ()),                    # a copy: not a window of the input
    "contiguous": lambda t, rng: (aten.contiguous.default, ()),     # a copy or the input itself
    "float": lambda t, rng: (aten._to_copy.default, (), ),                # same dtype: a copy
}


def _chain(base: torch.Tensor, names: list[str], seed: int) -> tuple:
    rng = random.Random(seed)
    steps, t = [], base
    for name in names:
        step = STEPS[name](t, rng)
        if step is not None:
            t = step[0](t, *step[1])
            steps.append(step)
    return tuple(steps)


@settings(max_examples=80, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       names=st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5),
       offset=st.integers(0, 3), transposed=st.booleans(), seed=st.integers(0, 1000))
def test_a_replayed_window_is_the_tensor_the_steps_give(shape, names, offset, transposed, seed):
    storage = torch.randn(200)
    base = storage[offset:offset + torch.Size(shape).numel()].view(shape)
    if transposed and base.dim() > 1:
        base = base.transpose(0, -1)
    steps = _chain(base, names, seed)
    read = Read("x", steps, torch.empty(0, device="meta"))
    first = read.apply(base)
    again = read.apply(base)                         # the replayed window, when the steps are all views
    for t in (first, again):
        expected = base
        for op, args in steps:
            expected = op(expected, *args)
        assert t.shape == expected.shape and t.stride() == expected.stride() and torch.equal(t, expected)
        views = expected.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        assert (t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()) == views
        if views:
            assert t.storage_offset() == expected.storage_offset()
    # another tensor with the same layout (another offset in another storage) gets its own window
    other = torch.randn(300)[offset + 7:offset + 7 + base.numel()].view(base.shape) if base.is_contiguous() else None
    if other is not None:
        got, expected = read.apply(other), other
        for op, args in steps:
            expected = op(expected, *args)
        assert got.stride() == expected.stride() and got.storage_offset() == expected.storage_offset()
        assert torch.equal(got, expected)


def test_a_copying_step_is_run_every_time():
    base = torch.randn(4, 6).t()
    read = Read("x", ((aten.clone.default, ()), (aten.mul.Tensor, (2.0,))), torch.empty(0, device="meta"))
    a, b = read.apply(base), read.apply(base)
    assert torch.equal(a, base * 2) and torch.equal(b, base * 2)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()     # fresh results, not a cached one
    base.add_(1)
    assert torch.equal(read.apply(base), base * 2)


def test_a_window_found_on_the_cpu_is_not_used_for_a_device_tensor():
    import spyre_lab.runtime  # noqa: F401  (registers the spyre device)

    base = torch.randn(4, 6).half()
    read = Read("x", ((aten.t.default, ()), (aten.slice.Tensor, (0, 1, 5))), torch.empty(0, device="meta"))
    read.apply(base)
    read.apply(base)                                   # the CPU window, cached
    on_card = base.to("spyre")
    got = read.apply(on_card)                          # the steps themselves, through the device's own views
    assert got.device.type == "spyre" and torch.equal(got.cpu(), base.t()[1:5])
    assert read._strided[(on_card.shape, on_card.stride(), on_card.dtype, False)] is None


def test_the_same_tensor_gets_the_same_window_until_its_layout_changes():
    base = torch.arange(24.0).reshape(4, 6)
    read = Read("x", ((aten.t.default, ()), (aten.slice.Tensor, (0, 1, 5))), torch.empty(0, device="meta"))
    read.apply(base)                                    # finds the window
    first = read.apply(base)
    assert read.apply(base) is first                    # kept for the very same tensor
    other = base.clone()
    assert read.apply(other) is not first and torch.equal(read.apply(other), first)
    base.t_()                                           # the same object, laid out anew
    again = read.apply(base)
    assert again is not first and torch.equal(again, aten.slice.Tensor(aten.t.default(base), 0, 1, 5))
