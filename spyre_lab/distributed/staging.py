"""Moving a spyre tensor's values to the wire and back, for the numerics that travel through gloo.

The modeled time of a collective is charged by the backend from its algorithm (:mod:`.algorithms`); the
real bytes meanwhile go through gloo on the host. Reading and writing the payload here therefore adds no
modeled time (a ``.cpu()`` would charge a D2H the modeled card-to-card transfer does not make).
Gloo carries fp16 and fp32, never bf16: any other floating dtype travels as fp32 and comes back cast.
"""

from __future__ import annotations

import torch

from spyre_lab.runtime import device_nbytes, host_view, write_into

WIRE_FLOAT_DTYPES = (torch.float16, torch.float32)


def is_spyre(t: torch.Tensor) -> bool:
    return t.device.type == "spyre"


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype gloo carries for ``dtype``: fp16/fp32 as is, other floats (bf16, fp64) as fp32."""
    if dtype.is_floating_point and dtype not in WIRE_FLOAT_DTYPES:
        return torch.float32
    return dtype


def to_wire(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy of spyre tensor ``t``'s values, in a dtype gloo carries."""
    return host_view(t).to(wire_dtype(t.dtype), copy=True).contiguous()


def empty_wire(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor gloo can receive ``t``'s values into."""
    return torch.empty(t.shape, dtype=wire_dtype(t.dtype))


def from_wire(t: torch.Tensor, wire: torch.Tensor) -> None:
    """Write the received ``wire`` values into spyre tensor ``t`` (cast to its dtype, stored as the card stores)."""
    write_into(t, wire.to(t.dtype))


def card_bytes(t: torch.Tensor) -> int:
    """Bytes the card moves for ``t`` (its device format: fp16 for floats), what a modeled transfer costs."""
    return device_nbytes(t)
