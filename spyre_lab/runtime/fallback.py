"""CPU fallback: an op with no spyre kernel runs on the host, with both PCIe trips on the trace.

The inputs are copied to the host (a D2H per spyre input, except out= tensors, which are only
written), the CPU op runs (its host time is modeled from bytes and elements), and the results are
copied back (an H2D per result). The first call of each op warns once, naming it; ops whose output
size depends on the data are host ops by design and do not warn.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.runtime.device_module import get_device
from spyre_lab.runtime.jobplan import dma_us
from spyre_lab.runtime.op_schema import to_cpu_kwargs, written_leaves
from spyre_lab.runtime.ops_special import pcie_lane, resize
from spyre_lab.runtime.streams import TIMELINE, current_stream
from spyre_lab.runtime.tensor import device_nbytes, from_host, host_view, write_into

# estimates (documented nowhere): one host core doing the CPU fallback's work.
# estimates (measured nowhere): one host core doing a fallback's work, plus its dispatch cost.
HOST_FALLBACK_FLOPS = 20e9
HOST_FALLBACK_BYTES_PER_S = 10e9
HOST_FALLBACK_DISPATCH_US = 5.0

_warned_ops: set[str] = set()


def run_on_host(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, index: int, warn: bool) -> Any:
    """Run ``op`` (its flattened call ``leaves``/``spec``) on the CPU for card ``index``; results come
    back as spyre tensors, written-in-place arguments are updated on the card."""
    name = f"aten::{op.overloadpacket.__name__}"
    if warn and name not in _warned_ops:
        _warned_ops.add(name)
        warnings.warn(f"{name} has no spyre kernel; it runs as a CPU fallback (inputs copied to the host, the CPU op, "
                      "results copied back). Each call pays two PCIe transfers.", stacklevel=5)
    device = get_device(index)
    stream = current_stream(index)
    written = set(written_leaves(op, leaves, spec))
    with TIMELINE.launch(f"{name} (CPU fallback)", fallback=True):
        host = list(leaves)
        moved_in = 0
        write_only = set(written_leaves(op, leaves, spec, only_out=True))
        for i, x in enumerate(leaves):
            if i in write_only:  # out= tensors are written, never read: nothing to copy over
                host[i] = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
            elif isinstance(x, torch.Tensor) and x.device.type == "spyre":
                nbytes = device_nbytes(x)
                moved_in += nbytes
                stream.enqueue(f"D2H {name} input", "pcie.d2h", pcie_lane(index), dma_us(nbytes, device), bytes=nbytes,
                               kind="D2H", fallback=True)
                host[i] = host_view(x).clone() if i in written else host_view(x)
        stream.synchronize()
        args, kwargs = _rewrap_numbers(op, *tree_unflatten(host, spec))
        result = op(*args, **to_cpu_kwargs(kwargs))
        out_leaves, out_spec = tree_flatten(result)
        out_bytes = sum(t.numel() * t.element_size() for t in out_leaves if isinstance(t, torch.Tensor))
        TIMELINE.host_work(f"{name} on CPU", _host_cost_us(moved_in + out_bytes, out_leaves), kind="HostCompute",
                           fallback=True, timing="modeled (host estimate)")
        host_to_leaf = {id(host[i]): i for i in written}
        results, returned = [], set()
        for value in out_leaves:
            if isinstance(value, torch.Tensor) and id(value) in host_to_leaf:
                returned.add(host_to_leaf[id(value)])
                target = leaves[host_to_leaf[id(value)]]
                if tuple(target.shape) != tuple(value.shape):
                    resize(target, tuple(value.shape), None)
                write_into(target, value)
                _h2d(stream, target, name)
                results.append(target)
            elif isinstance(value, torch.Tensor):
                out = from_host(value, index)
                _h2d(stream, out, name)
                results.append(out)
            else:
                results.append(value)
        for i in written - returned:            # written but not returned (e.g. _cummax_helper -> ())
            write_into(leaves[i], host[i])
            _h2d(stream, leaves[i], name)
    return tree_unflatten(results, out_spec)


def _rewrap_numbers(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Python numbers where the schema wants a Tensor become 0-dim CPU tensors again.

    A composite such as ``remainder.Scalar`` calls ``remainder.Tensor_out`` with the scalar wrapped in a
    "wrapped number" tensor, and boxing into Python unwraps it back to an int, which the CPU op then
    refuses. A 0-dim tensor promotes like the wrapped number did (a dimensioned operand's dtype wins
    within its category), so the result dtype is unchanged."""
    args, kwargs = list(args), dict(kwargs)
    for position, argument in enumerate(op._schema.arguments):
        if not isinstance(argument.type, torch.TensorType):
            continue
        in_args = not argument.kwarg_only and position < len(args)
        value = args[position] if in_args else kwargs.get(argument.name)
        if isinstance(value, (bool, int, float)):
            if in_args:
                args[position] = torch.tensor(value)
            else:
                kwargs[argument.name] = torch.tensor(value)
    return tuple(args), kwargs


def _h2d(stream: Any, t: torch.Tensor, name: str) -> None:
    nbytes = device_nbytes(t)
    stream.enqueue(f"H2D {name} result", "pcie.h2d", pcie_lane(stream.device_index),
                   dma_us(nbytes, get_device(stream.device_index)), bytes=nbytes, kind="H2D", fallback=True)


def _host_cost_us(nbytes: int, outputs: list[Any]) -> float:
    elems = sum(t.numel() for t in outputs if isinstance(t, torch.Tensor))
    return HOST_FALLBACK_DISPATCH_US + max(nbytes / HOST_FALLBACK_BYTES_PER_S, elems / HOST_FALLBACK_FLOPS) * 1e6
