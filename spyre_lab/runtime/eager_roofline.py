"""The modeled device time of a one-op reference kernel: its bytes and its work, on the roofline.

An eager op with no compiled one-op program runs a reference kernel (:mod:`~spyre_lab.runtime.eager_programs`);
its time is this estimate, and the trace labels it so (``timing="roofline, no compiled program"``).
"""

from __future__ import annotations

from typing import Any

import torch

from spyre_lab.compiler.ir import TRANSCENDENTAL_OPS
from spyre_lab.device.config import SpyreConfig
from spyre_lab.device.roofline import roofline_us
from spyre_lab.runtime.tensor import device_nbytes

_TRANSCENDENTAL = TRANSCENDENTAL_OPS | {"_softmax", "_log_softmax", "mish", "elu", "native_layer_norm", "rms_norm",
                                        "_fused_rms_norm"}
"""The compiler's multi-pass SFU ops, plus composite ops whose one kernel runs one (softmax: exp; norms: rsqrt),
so an eager op and its compiled kernel pay the same passes (``div`` is one pass in both)."""
_MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "dot", "mv"})


def op_roofline_us(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                   cfg: SpyreConfig) -> tuple[float, dict[str, Any]]:
    """Modeled time of one op as a device kernel: its operands' bytes in the device format, its work
    (2 FLOPs per multiply-add on the PE arrays, else element passes on the SFUs), on the roofline.

    A scatter (``index_copy``) reads its index and source and writes only the rows it indexes, a gather
    (``index_select``) reads its index and only the rows it selects: the rest of the indexed tensor (a whole
    KV cache) is never touched, so it is not counted."""
    if name in _SCATTERS and len(inputs) == 3:
        _target, index, source = inputs
        inputs, outputs = [index, source], [source]
    elif name in _GATHERS and len(inputs) == 2 and outputs:
        _source, index = inputs
        inputs = [index, outputs[0]]
    read = sum(device_nbytes(t) for t in inputs)
    written = sum(device_nbytes(t) for t in outputs)
    if name in _MATMULS:
        return roofline_us(read, written, _matmul_flops(name, inputs, outputs), "pt", cfg)
    elems = max([t.numel() for t in (*inputs, *outputs)] or [0])
    passes = cfg.transcendental_factor if name in _TRANSCENDENTAL else 1
    return roofline_us(read, written, elems * passes, "sfu", cfg)


_SCATTERS = frozenset({"index_copy"})
_GATHERS = frozenset({"index_select"})


def _matmul_flops(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    out = outputs[0] if outputs else inputs[0]
    if name == "dot":
        return 2 * inputs[0].numel()
    operands = inputs[-2:] if name in ("mm", "bmm", "mv") else inputs[1:3]
    k = operands[0].shape[-1] if operands[0].dim() else 1
    return 2 * out.numel() * k

