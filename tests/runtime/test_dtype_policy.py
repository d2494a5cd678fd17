"""One dtype policy for every non-fp16 floating dtype: stored as fp16 with one warning per dtype, and a
finite value beyond fp16's range raises a clear error wherever it would be written -- never a silent inf."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from spyre_lab.runtime.dtype_policy import FP16_MAX
from spyre_lab.runtime.errors import SpyreDtypeError, SpyreRangeError
from spyre_lab.runtime.tensor import buffer_of

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def _policy_warnings(caught, dtype):
    return [w for w in caught if f"spyre stores {dtype} tensors as float16" in str(w.message)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_stored_as_fp16_with_one_warning_per_dtype(dtype, fresh_warnings):
    cpu = torch.tensor([1.0, 1 / 3, 60000.0, -32768.0, 1e-9, float("inf"), float("nan")], dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = cpu.to("spyre")
        torch.zeros(3, dtype=dtype, device="spyre")            # made on the card: same storage, no second warning
        cpu.to("spyre")
    (notice,) = _policy_warnings(caught, dtype)
    assert "rounded to fp16" in str(notice.message) and "65504" in str(notice.message)
    assert x.dtype == dtype                                     # the host dtype is kept
    assert buffer_of(x).data.dtype == torch.float16             # the card holds fp16
    back = x.cpu()
    assert torch.equal(back.nan_to_num(), cpu.to(torch.float16).to(dtype).nan_to_num())
    assert back[4] == 0                                         # below fp16's smallest subnormal: 0, as documented
    assert back[5] == float("inf") and back[6].isnan()          # inf and nan are values fp16 holds


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_beyond_fp16_raise_on_the_way_in(dtype):
    with pytest.raises(SpyreRangeError, match=re.escape(f"do not fit float16 (max {FP16_MAX:g})")) as info:
        torch.tensor([1.0, -1e5], dtype=dtype).to("spyre")
    assert "scale them into range" in str(info.value) and "CPU" in str(info.value)


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_beyond_fp16_raise_from_device_ops_and_fallbacks(dtype, fresh_warnings):
    with pytest.warns(UserWarning, match=f"spyre stores {dtype} tensors as float16"):
        x = torch.tensor([1.0, 40000.0], dtype=dtype).to("spyre")
    with pytest.raises(SpyreRangeError, match=r"^aten::mul: .* values up to (80000|79872) do not fit float16"):
        x * 2                                                    # a device op's result
    with pytest.warns(UserWarning, match="cumsum has no spyre kernel"), \
            pytest.raises(SpyreRangeError, match=r"^aten::cumsum: .*do not fit float16"):
        torch.cumsum(torch.cat([x, x]), 0)                      # a CPU fallback's result
    assert torch.equal(x.cpu(), torch.tensor([1.0, 40000.0], dtype=dtype))   # nothing was half-written


def test_fp16_itself_overflows_to_inf_like_the_cpu():
    """fp16 tensors compute in fp16: an overflow is inf on the CPU too, so it is inf here."""
    x = torch.tensor([40000.0], dtype=torch.float16)
    assert torch.equal((x.to("spyre") * 2).cpu(), x * 2) and bool((x * 2).isinf().all())


def test_dtypes_without_a_device_format_are_refused_by_name():
    with pytest.raises(SpyreDtypeError, match="int16"):
        torch.ones(2, dtype=torch.int16).to("spyre")
    with pytest.raises(TypeError, match="complex"):
        torch.ones(2, dtype=torch.complex64).to("spyre")
