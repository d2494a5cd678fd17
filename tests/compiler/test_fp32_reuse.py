"""A matmul node's fp32 operand copy is kept for the very same, unchanged tensor, and only for it."""

from __future__ import annotations

import torch

from spyre_lab.compiler.lowering import LastFp32


def test_the_same_unchanged_tensor_reuses_its_fp32_copy():
    convert = LastFp32()
    w = torch.randn(8, 4).half()
    first = convert(w)
    assert first.dtype == torch.float32 and torch.equal(first, w.float())
    assert convert(w) is first                                   # the same tensor, unchanged
    w.mul_(2)                                                    # changed in place: converted again
    second = convert(w)
    assert second is not first and torch.equal(second, w.float())
    other = w.clone()
    assert convert(other) is not second                          # another tensor with the same values


def test_inference_tensors_and_fp32_tensors_are_never_kept():
    convert = LastFp32()
    with torch.inference_mode():
        w = torch.randn(8, 4).half()
        first = convert(w)
        w.mul_(2)                                                # no version counter would see this
        assert torch.equal(convert(w), w.float()) and convert(w) is not first
    x = torch.randn(3, 3)
    assert convert(x) is x                                       # .float() of fp32 is the tensor itself
