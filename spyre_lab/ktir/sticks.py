"""Argument tensors in the device's stick layout: every innermost row padded to whole 128-byte sticks.

The compiler lays each tensor out so that every row of its innermost dim starts on a stick; the KTIR it
exports describes those tensors with stick-padded memory-view strides (``compiler.ktir_layout``). To run such
a kernel, hand it each argument in that layout (:func:`to_sticks`) and read its outputs back
(:func:`from_sticks`). The padding holds zeros and no kernel reads or writes it, so the numbers are the
dense tensors' own.
"""

from __future__ import annotations

import math

import torch

from spyre_lab.device.config import SPYRE


def padded(n: int, dtype: torch.dtype, stick_bytes: int = SPYRE.stick_bytes) -> int:
    """``n`` elements rounded up to whole sticks (a row of one element still fills a stick)."""
    per = max(1, stick_bytes // torch.empty((), dtype=dtype).element_size())
    return max(1, math.ceil(n / per)) * per


def to_sticks(t: torch.Tensor, stick_bytes: int = SPYRE.stick_bytes) -> torch.Tensor:
    """``t`` with its innermost dim zero-padded to whole sticks (contiguous; a 0-d tensor is returned as is)."""
    if t.dim() == 0:
        return t
    out = torch.zeros(*t.shape[:-1], padded(t.shape[-1], t.dtype, stick_bytes), dtype=t.dtype)
    out[..., : t.shape[-1]] = t
    return out


def from_sticks(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The dense tensor of ``shape`` held in the stick-padded ``t`` (the inverse of :func:`to_sticks`)."""
    if not shape:
        return t.reshape(-1)[:1].reshape(())
    return t.reshape(*shape[:-1], -1)[..., : shape[-1]]
