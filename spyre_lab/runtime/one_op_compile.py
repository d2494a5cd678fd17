"""One op through the compiler: its Program, used only if it runs whole on the card and agrees with the CPU op.

An eager device op first asks the compiler for a one-op Program (``compile_graph`` on the op's functional
form). The Program is used only when every launch in it is a planned device kernel and, run once on
sample data by the reference interpreter, it matches the CPU op; otherwise the eager op runs a reference
kernel (right numbers, roofline time). Why an op was not compiled is kept: :func:`not_compiled` lists it
per op, and an op whose compiled program disagrees with the CPU op is reported once with a warning (that
is a compiler bug worth knowing about, not a coverage gap).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.compiler.backend import compile_graph, to_aten
from spyre_lab.compiler.executor import execute_values
from spyre_lab.compiler.one_op_graph import one_op_graph
from spyre_lab.compiler.program import HostFallback, Program, UnplannedSpec
from spyre_lab.runtime.launch.options import is_timing_only
from spyre_lab.runtime.op_schema import (
    constant_key,
    functional_variant,
    mutated_args,
    rewrap_numbers,
    to_cpu_kwargs,
)

_NOT_COMPILED: dict[str, str] = {}


def not_compiled() -> dict[str, str]:
    """Op name -> why its eager form runs the reference kernel instead of a compiled program."""
    return dict(_NOT_COMPILED)


def _skip(op: torch._ops.OpOverload, reason: str) -> None:
    _NOT_COMPILED.setdefault(f"aten::{op.overloadpacket.__name__}", reason)


def compile_one_op(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, input_leaves: list[int],
                    out_metas: list[torch.Tensor]) -> Program | None:
    """The compiler's Program for this single op, or None (the reason kept in :func:`not_compiled`) when
    the op has no functional form, the compiler cannot take it, or would not run it whole on the device."""
    functional = functional_variant(op)
    if functional is None:
        _skip(op, "no functional variant to compile")
        return None
    out_names = {name for _, name, kwarg_only in mutated_args(op) if kwarg_only}
    inputs = set(input_leaves)
    constants = [None if i in inputs else x for i, x in enumerate(leaves)]

    def one_op(*tensors: torch.Tensor) -> Any:
        values = list(constants)
        for leaf, t in zip(input_leaves, tensors):
            values[leaf] = t
        args, kwargs = tree_unflatten(values, spec)
        kwargs = {k: v for k, v in kwargs.items() if k not in out_names}
        args, kwargs = rewrap_numbers(functional, args, kwargs)
        return functional(*args, **to_cpu_kwargs(kwargs))

    # timing_only() never reads an example's values: shapes on meta, so a (4096, 49159) LM head costs no host bytes
    device = "meta" if is_timing_only() else "cpu"
    examples = [torch.zeros_like(torch.empty_strided(leaves[i].shape, leaves[i].stride(), dtype=leaves[i].dtype,
                                                     device=device))
                for i in input_leaves]
    if any(x.dtype == torch.float64 for x in examples):
        _skip(op, "the compiler lays out no float64 buffers")
        return None
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")   # a compiler notice here only means: not this op, see below
            graph = one_op_graph(one_op, examples, functional, _form(functional, leaves, spec, inputs), to_aten)
            program = compile_graph(one_op, examples, aten_graph=graph)
    except Exception as exc:                  # a compiler gap must not break an eager op: say so, run the reference
        reason = f"the compiler raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        name = f"aten::{op.overloadpacket.__name__}"
        if name not in _NOT_COMPILED and _runs_on_the_host(one_op, examples):  # else the CPU's own error follows
            warnings.warn(f"spyre: no compiled one-op program for {name}: {reason}. It runs as a reference kernel "
                          "(the CPU op on the card's data, timed by a roofline): right values, estimated time.",
                          RuntimeWarning, stacklevel=2)
        _skip(op, reason)
        return None
    off_device = [launch.explain() for launch in program.launches
                  if isinstance(launch, (HostFallback, UnplannedSpec))]
    if off_device:
        _skip(op, f"not whole on the device: {'; '.join(off_device)}")
        return None
    if len(program.outputs) != len(out_metas) or not program.launches:
        _skip(op, f"{len(program.outputs)} outputs compiled for {len(out_metas)} expected")
        return None
    # timing_only() produces no values, so the sample check that guards them is skipped
    return program if is_timing_only() or _agrees_with_reference(op, program, one_op, examples) else None


def _form(functional: torch._ops.OpOverload, leaves: list[Any], spec: Any, inputs: set[int]) -> tuple | None:
    """What fixes the one-op graph but its shapes: the op, the call's structure, each input's dtype, each constant's
    value (keyed as the eager cache keys it) and the host's autocast state (a traced op under CPU autocast gets
    its casts). None: a constant with no such key (the graph is traced every time)."""
    parts: list[Any] = [functional, spec, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")]
    for i, x in enumerate(leaves):
        if i in inputs:
            parts.append(("input", x.dtype))
        elif isinstance(x, torch.Tensor):
            if x.dim() or x.device.type != "cpu":
                return None
            parts.append((torch.Tensor, x.dtype, constant_key(x.item())))
        else:
            parts.append(constant_key(x))
    try:
        hash(tuple(parts))
    except TypeError:
        return None
    return tuple(parts)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """``torch.testing.assert_close(actual, expected, atol=1e-3, rtol=1e-3, equal_nan=True)`` passes, asked the
    way it asks for two dense tensors of one dtype and device (its own checks cost more than the program it
    guards); False sends the pair to ``assert_close`` itself, for its verdict and its message."""
    return (type(actual) is torch.Tensor and type(expected) is torch.Tensor and actual.shape == expected.shape
            and actual.dtype == expected.dtype and actual.device == expected.device
            and actual.layout is torch.strided and expected.layout is torch.strided
            and not (actual.dtype.is_floating_point and actual.dtype.itemsize == 1)
            and bool(torch.isclose(actual, expected, rtol=1e-3, atol=1e-3, equal_nan=True).all()))


def _runs_on_the_host(one_op: Callable[..., Any], examples: list[torch.Tensor]) -> bool:
    """Whether the CPU takes this call at all: when it refuses (``bool - bool``), the reference kernel raises the
    CPU's error, so a notice about the compiler would only hide the real message."""
    try:
        one_op(*examples)
    except Exception:
        return False
    return True


def _agrees_with_reference(op: torch._ops.OpOverload, program: Program, one_op: Callable[..., Any],
                           examples: list[torch.Tensor]) -> bool:
    """Run the compiled program once on sample data against the CPU op: a program that disagrees
    is not used (the reference kernel runs instead), so a compiler gap never becomes a wrong value."""
    g = torch.Generator().manual_seed(0)
    samples = [torch.randn(x.shape, generator=g).to(x.dtype) if x.dtype.is_floating_point else x for x in examples]
    try:
        with warnings.catch_warnings():   # notices about the sample data (a std over nothing) are not the user's
            warnings.simplefilter("ignore")
            expected = [t for t in tree_flatten(one_op(*samples))[0] if isinstance(t, torch.Tensor)]
            got = execute_values(program, samples)
        for e, o in zip(expected, got, strict=True):
            if not _close(o, e):
                torch.testing.assert_close(o, e, atol=1e-3, rtol=1e-3, equal_nan=True)   # raises, saying how
    except Exception as exc:
        name = f"aten::{op.overloadpacket.__name__}"
        if name not in _NOT_COMPILED and _runs_on_the_host(one_op, examples):  # else the CPU's own error follows
            warnings.warn(f"spyre: the compiled program for {name} disagrees with the CPU op on sample data "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0]}); the op runs its reference "
                          "kernel instead", RuntimeWarning, stacklevel=2)
        _skip(op, f"compiled program disagrees with the CPU op: {type(exc).__name__}")
        return False
    return True


