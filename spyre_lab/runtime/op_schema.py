"""What an ATen call says about itself: views, writes, out= arguments, functional twins.

The eager dispatcher treats ops generically, so it reads everything it needs from the op's schema
(alias annotations, keyword-only ``out`` arguments) instead of keeping per-op tables.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import torch
from torch.utils._pytree import tree_unflatten

aten = torch.ops.aten


def packet_name(op: torch._ops.OpOverload) -> str:
    """``add_`` and ``add`` share one kernel: the in-place form only differs in where it writes."""
    name = op.overloadpacket.__name__
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@functools.cache                      # asked for every op on a spyre tensor: read the schema once per op
def is_view(op: torch._ops.OpOverload) -> bool:
    """True when every result aliases an input without writing it (view, transpose, slice, ...)."""
    if op is aten._unsafe_view.default:
        return True
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


@functools.cache
def mutated_args(op: torch._ops.OpOverload) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, kwarg_only) of every argument the op writes: self of in-place ops (read and
    written) and out= tensors (keyword-only, written without being read)."""
    return tuple((i, a.name, a.kwarg_only) for i, a in enumerate(op._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def to_cpu_kwargs(kwargs: dict) -> dict:
    """The call's keyword arguments with a ``device=`` moved to the CPU (factory ops run on the host)."""
    if "device" in kwargs and kwargs["device"] is not None:
        return {**kwargs, "device": torch.device("cpu")}
    return kwargs


@functools.cache
def functional_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``op`` itself if it writes nothing; for an out= overload, the overload of the same packet that
    takes the same arguments without ``out`` and writes nothing (``exp.out`` -> ``exp.default``)."""
    if not mutated_args(op):
        return op
    wanted = [(a.name, str(a.type)) for a in op._schema.arguments
              if not (a.alias_info is not None and a.alias_info.is_write)]
    for name in op.overloadpacket.overloads():
        candidate = getattr(op.overloadpacket, name)
        args = candidate._schema.arguments
        if not any(a.alias_info is not None and a.alias_info.is_write for a in args) and \
                [(a.name, str(a.type)) for a in args] == wanted:   # clamp_min.Tensor_out -> .Tensor, not .default
            return candidate
    return None


def written_leaves(op: torch._ops.OpOverload, leaves: list[Any], spec: Any,
                    only_out: bool = False) -> list[int]:
    """Leaf positions of the tensors the op writes (``only_out``: just the out= ones), found by tagging
    the leaves and reading the schema."""
    mutated = mutated_args(op)
    if not mutated:
        return []
    tags = list(range(len(leaves)))
    args, kwargs = tree_unflatten(tags, spec)
    found = []
    for pos, name, kwarg_only in mutated:
        if only_out and not kwarg_only:
            continue
        tag = kwargs.get(name) if name in kwargs else (args[pos] if pos < len(args) else None)
        if isinstance(tag, int):
            found.append(tag)
    return found


def rewrap_numbers(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
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


_FLOAT_BITS = struct.Struct("<d").pack
KEYED_BY_PARTS = frozenset({complex, list, tuple})


def constant_key(value: Any) -> Any:
    """A cache key for a constant that is equal exactly when the constants are the same value: ``0.0`` and
    ``-0.0`` (equal under ``==``, yet ``1 / x`` tells them apart) get different keys, and every NaN with the
    same bits gets one key (``nan != nan`` would make each call a cache miss that evicts a useful program)."""
    kind = type(value)
    if kind is float:
        return (float, value) if value == value and value != 0.0 else (float, _FLOAT_BITS(value))
    if kind is complex:
        return (complex, constant_key(value.real), constant_key(value.imag))
    if kind is list or kind is tuple:
        return (kind, tuple(constant_key(v) for v in value))
    return (kind, value)
