"""Trace a Dynamo graph on the host: device literals in the graph (``device="spyre"``) become ``"cpu"``.

Why: a compiled Program is device-agnostic. ``to_aten`` traces the graph on CPU fake tensors, while
unmodified model code writes the device into the graph (``torch.arange(n, device=x.device)``,
``inv_freq.to(x.device)``, ``torch.tensor([], device=self.device)``); left alone, those make spyre
fake tensors that meet the CPU ones and tracing stops with a device mismatch. ``torch.autocast("spyre")``
regions become CPU autocast regions, whose lower-precision op list matches the spyre one
(:mod:`spyre_lab.runtime.autocast`), so compiled code casts the same matmuls to fp16 as eager. Inside a Program every
value lives on the card anyway, so the graph is traced as if the card's device were the host's; the
runtime places inputs and outputs on the card when it launches the Program.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.amp.autocast_mode import _enter_autocast

DEVICE_TYPE = "spyre"


def _is_device_literal(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == DEVICE_TYPE
    return isinstance(value, str) and (value == DEVICE_TYPE or value.startswith(DEVICE_TYPE + ":"))


def _on_host(value: Any) -> Any:
    if _is_device_literal(value):
        return "cpu" if isinstance(value, str) else torch.device("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    return value


def trace_on_host(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite every spyre device literal in ``gm``'s node arguments to the CPU, in place; returns ``gm``."""
    changed = False
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        if node.target is _enter_autocast and node.args and _is_device_literal(node.args[0]) and node.args[1] is None:
            # an unspecified dtype means the device's autocast dtype, not the host's (bf16 on the CPU)
            node.args = (node.args[0], torch.get_autocast_dtype(DEVICE_TYPE), *node.args[2:])
        args, kwargs = _on_host(node.args), {k: _on_host(v) for k, v in node.kwargs.items()}
        if args != node.args or kwargs != node.kwargs:
            node.args, node.kwargs = args, kwargs
            changed = True
    if changed:
        gm.recompile()
    return gm
