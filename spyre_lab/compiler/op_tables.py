"""Which ATen ops lower to what: the tables lowering dispatches on, and the decompositions it traces with.

An ATen op either runs on the device as a pointwise op (SFU), a reduction, or a matmul (PE array); is a
free view folded into its consumers' reads; depends only on a shape (folded to a constant); or runs on
the host as a ``Fallback`` with a reason a learner can read.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

DEVICE_POINTWISE: dict[str, str] = {
    # aten overload packet -> LoopIR op name
    "add": "add", "sub": "sub", "rsub": "rsub", "mul": "mul", "div": "div", "neg": "neg", "pow": "pow",
    "rsqrt": "rsqrt", "sqrt": "sqrt", "exp": "exp", "log": "log", "abs": "abs", "reciprocal": "reciprocal",
    "silu": "silu", "gelu": "gelu", "sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu", "erf": "erf",
    "clamp": "clamp", "clamp_min": "clamp", "clamp_max": "clamp", "maximum": "maximum", "minimum": "minimum",
    "where": "where", "masked_fill": "masked_fill",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "logical_not": "logical_not", "logical_and": "logical_and", "logical_or": "logical_or",
    "_to_copy": "cast", "clone": "copy", "copy": "copy", "alias": "copy", "lift_fresh_copy": "copy",
    "cat": "cat", "index_select": "index_select",
}
"""Elementwise (and data-movement) ops the SFU runs. sin/cos stay on the host, as on the real stack."""

DEVICE_REDUCTIONS = {"sum", "mean", "amax", "amin", "argmax", "argmin", "any", "all", "prod", "max", "min", "topk",
                     "var", "var_mean"}

MULTI_OUTPUT_NAMES = {"var_mean": ("var", "mean")}

VIEW_OPS = {
    "view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand", "unsqueeze", "squeeze",
    "slice", "select", "detach", "alias_copy", "view_copy", "permute_copy", "expand_copy", "squeeze_copy",
    "unsqueeze_copy", "slice_copy", "t_copy", "transpose_copy",
}

SPLIT_OPS = {"split", "split_with_sizes", "unbind"}
"""Multi-output views: every piece becomes a read of the source (getitem picks one)."""

SHAPE_ONLY_OPS = {"full_like", "zeros_like", "ones_like", "empty_like", "new_zeros", "new_ones", "new_full",
                  "new_empty", "empty_strided", "empty"}

MATMUL_OPS = {"mm", "bmm", "addmm", "baddbmm"}

HOST_ONLY_REASON = {
    "embedding": "embedding gather runs on the host, as in torch-spyre (CPU fallback with auto-transfer)",
    "sin": "sin/cos run on the host in torch-spyre", "cos": "sin/cos run on the host in torch-spyre",
    "cumsum": "scan ops run on the host", "tril": "tril/triu run on the host", "triu": "tril/triu run on the host",
    "convolution": "convolution has no Spyre lowering here",
}


@functools.cache
def decomposition_table() -> dict:
    """ATen core decompositions, minus the ops Spyre keeps whole (silu/gelu/softmax lower as fused targets),
    plus layer_norm so it reaches the device as reductions (var_mean) and pointwise ops."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    keep = {aten.silu, aten.gelu, aten._softmax, aten.clamp, aten.masked_fill, aten.sigmoid, aten.relu}
    table = {op: fn for op, fn in core_aten_decompositions().items()
             if getattr(op, "overloadpacket", None) not in keep}
    table.update(get_decompositions([aten.native_layer_norm]))
    return table
