"""``torch.autocast("spyre")``: matmul-class ops run in fp16, everything else as written.

Why: PyTorch ships autocast kernels for CUDA, CPU, XPU and MPS in C++, none for a PrivateUse1 device,
so without these kernels ``torch.autocast("spyre")`` would silently change nothing. The policy is
CUDA's "lower precision" list (matmuls, linear layers, convolutions, attention): their floating
inputs on the card are cast to the autocast dtype (fp32 / bf16 to fp16; fp64 and fp16 are left
alone, as CUDA does), then the op runs. fp16 is the only dtype offered
(:func:`torch.spyre.get_amp_supported_dtype`): the card stores bf16 as fp16, so a "bf16" autocast
would produce fp16 numbers under a bf16 label; ``torch.autocast("spyre", dtype=torch.bfloat16)``
gets torch's own warning that names fp16 and runs without autocast.

Ops on CUDA's "run in fp32" list need no kernel here: the card has one float format, fp16 storage
with fp32 accumulation inside every kernel, whether or not autocast is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

BACKEND = "spyre"
AMP_DTYPES: tuple[torch.dtype, ...] = (torch.float16,)
AUTOCAST_KEY = "AutocastPrivateUse1"

LOWER_PRECISION_OPS = (
    "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul", "conv1d", "conv2d", "conv3d",
    "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution", "_convolution",
    "einsum", "linalg_multi_dot", "linalg_vecdot", "linear", "matmul", "mm", "mv", "prelu",
    "scaled_dot_product_attention",
)
"""The ops CUDA autocast runs in lower precision (``AT_FORALL_LOWER_PRECISION_FP`` in PyTorch), minus
the fused RNN cells, which have no spyre kernel."""

_EXCLUDE_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if (isinstance(value, torch.Tensor) and value.device.type == BACKEND and value.is_floating_point()
            and value.dtype not in (dtype, torch.float64)):
        return value.to(dtype)
    return value


def autocast_kernel(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The AutocastPrivateUse1 kernel of ``op``: its floating spyre inputs cast to the autocast dtype, then ``op``."""

    def autocast_to_fp16(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype(BACKEND)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE_AUTOCAST):
            return op(*tree_map(lambda v: _cast(v, dtype), args), **tree_map(lambda v: _cast(v, dtype), kwargs))

    autocast_to_fp16.__name__ = f"autocast_{op.__name__}"
    return autocast_to_fp16


def autocast_ops() -> list[torch._ops.OpOverload]:
    """Every overload of the lower-precision ops this torch build has."""
    found = []
    for name in LOWER_PRECISION_OPS:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            found.extend(getattr(packet, overload) for overload in packet.overloads())
    return found
