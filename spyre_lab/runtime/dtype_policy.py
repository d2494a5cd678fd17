"""The dtype policy: one rule for every source dtype (see :mod:`~spyre_lab.runtime.tensor` for the whole story).

The card computes and stores floating point in fp16: float32 / float64 / bfloat16 tensors keep their dtype on the
host side but are stored as fp16, with one warning per dtype; a finite value beyond fp16's range raises
:class:`~spyre_lab.runtime.errors.SpyreRangeError` instead of turning into inf; int64 is stored as int32 and
refuses values beyond it; complex dtypes and dtypes with no device format raise
:class:`~spyre_lab.runtime.errors.SpyreDtypeError`.
"""

from __future__ import annotations

import torch

from spyre_lab.device.layout import device_dtype as layout_device_dtype
from spyre_lab.runtime.errors import SpyreDtypeError, SpyreRangeError
from spyre_lab.user_line import warn_at_user_line

# Floating dtypes the card does not compute in: held as fp16 (the device dtype) instead.
NARROWED_TO_FP16 = (torch.float32, torch.float64, torch.bfloat16)
_UNSUPPORTED = (torch.complex32, torch.complex64, torch.complex128)
_warned_dtypes: set[torch.dtype] = set()


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a host ``dtype`` is stored in on the card (before the layout's own narrowing)."""
    if dtype in _UNSUPPORTED or dtype.is_complex:
        raise SpyreDtypeError(
            f"spyre has no complex dtypes (got {dtype}); keep complex tensors on the CPU or split real and "
            "imaginary parts with torch.view_as_real before moving them"
        )
    stored = torch.float16 if dtype in NARROWED_TO_FP16 else dtype
    try:
        layout_device_dtype(stored)
    except TypeError as e:
        raise SpyreDtypeError(f"spyre cannot hold {dtype} tensors: {e}; keep them on the CPU") from None
    return stored


FP16_MAX = torch.finfo(torch.float16).max


def check_fits_fp16(values: torch.Tensor, stored: torch.Tensor) -> None:
    """Refuse a write of ``values`` (a non-fp16 floating dtype) whose fp16 copy ``stored`` turned a
    finite value into inf: the policy is an error, never a silent inf."""
    overflow = torch.isinf(stored) & torch.isfinite(values)
    if bool(overflow.any()):
        largest = float(values[overflow].abs().max())
        raise SpyreRangeError(
            f"{values.dtype} values up to {largest:.6g} do not fit float16 (max {FP16_MAX:g}), the dtype spyre stores "
            f"{values.dtype} tensors in; scale them into range (e.g. divide by a power of two) or keep this tensor "
            "and the computation on the CPU"
        )


def check_fits_int32(values: torch.Tensor) -> None:
    """Refuse int64 values the card's int32 storage cannot hold (checked when written, not when stickified)."""
    if values.numel():
        low, high = (int(v) for v in torch.aminmax(values))
        info = torch.iinfo(torch.int32)
        if low < info.min or high > info.max:
            raise ValueError(f"int64 values in [{low}, {high}] do not fit the card's int32 storage "
                             f"([{info.min}, {info.max}]); keep such tensors on the host")


def warn_if_narrowed(dtype: torch.dtype) -> None:
    """One warning per dtype the first time a tensor of ``dtype`` is stored as fp16 on the card."""
    if dtype in NARROWED_TO_FP16 and dtype not in _warned_dtypes:
        _warned_dtypes.add(dtype)
        warn_at_user_line(
            f"spyre stores {dtype} tensors as float16 (the device dtype): values are rounded to fp16 (about 3 "
            f"significant digits, magnitudes below 6e-8 become 0), values beyond +-{FP16_MAX:g} raise an error, and "
            f".cpu() returns {dtype} holding those fp16 values. Use float16 tensors to silence this."
        )
