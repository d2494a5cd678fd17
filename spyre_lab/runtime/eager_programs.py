"""Eager ops as one-op programs: which card an op runs on, its program built once per signature, launched.

A device op (:data:`DEVICE_OPS`) becomes an :class:`EagerProgram`: built once per (op, shapes, strides,
dtypes, constants) and kept in a cache of :data:`PROGRAM_CACHE_SIZE` programs (least recently used
dropped first). When the compiler takes the op whole and its program agrees with the CPU op
(:mod:`~spyre_lab.runtime.one_op_compile`), the launch runs the compiler's Program, timed by the
simulator; otherwise a reference kernel computes with torch on the host mirror of the operands it finds
through its patched addresses, timed by a roofline (:func:`~spyre_lab.device.roofline.roofline_us`)
and labelled so. Either way it is one launch through the one launch route, :mod:`~spyre_lab.runtime.launch`
(correction, H2D of the blob, Compute), exactly like compiled work. Everything else runs on the CPU
(:mod:`~spyre_lab.runtime.fallback`).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.compiler.program import Program
from spyre_lab.device.config import SpyreConfig
from spyre_lab.runtime.devices import INDEX_OF, device_index, get_device, on_reset, spyre_index
from spyre_lab.runtime.eager_launch import GENERAL_ROAD, EagerLauncher, launcher, run_cached
from spyre_lab.runtime.eager_roofline import op_roofline_us
from spyre_lab.runtime.errors import SpyreUsageError
from spyre_lab.runtime.fallback import run_on_host
from spyre_lab.runtime.launch.kernels import LoadedFunction, Operands
from spyre_lab.runtime.launch.options import is_timing_only
from spyre_lab.runtime.launch.route import launch
from spyre_lab.runtime.one_op_compile import compile_one_op, not_compiled
from spyre_lab.runtime.op_schema import (
    KEYED_BY_PARTS,
    constant_key,
    packet_name,
    rewrap_numbers,
    to_cpu_kwargs,
    written_leaves,
)
from spyre_lab.runtime.programs import run_program
from spyre_lab.runtime.stream import current_stream
from spyre_lab.runtime.tensor import empty_spyre, resize
from spyre_lab.runtime.timeline import TIMELINE

DEVICE_OPS = frozenset({
    # pointwise arithmetic and math
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "reciprocal", "pow", "sqrt", "rsqrt", "exp", "log",
    "tanh", "sigmoid", "relu", "silu", "gelu", "erf", "maximum", "minimum", "clamp", "clamp_min", "clamp_max",
    "ceil", "floor", "sign", "square", "hardtanh", "leaky_relu", "elu", "softplus", "mish", "lerp",
    # comparisons and selection
    "eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "logical_not", "logical_and", "logical_or",
    "bitwise_and", "bitwise_not",
    # data movement the device does itself
    "clone", "fill", "zero", "cat", "index_select", "index_copy", "_to_copy", "copy",
    # reductions and normalisations
    "sum", "mean", "amax", "amin", "max", "min", "_softmax", "_log_softmax", "native_layer_norm", "var", "std",
    "rms_norm", "_fused_rms_norm", "prod", "all", "any",
    # matmuls
    "mm", "bmm", "addmm", "baddbmm", "dot", "mv",
})
"""ATen op packets run as one-op device programs; everything else takes the CPU fallback."""

HOST_BY_DESIGN = frozenset({
    "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "unique_dim", "equal", "is_nonzero",
    "_local_scalar_dense", "item",
})
"""Ops whose output size (or type) depends on the data: the host computes them, without a warning."""

def device_of(op: torch._ops.OpOverload, leaves: list[Any], kwargs: dict, host_op: bool) -> int:
    """The card an op runs on. Its spyre operands must share one card; CPU operands are accepted as
    0-dim scalars, and by host ops (they run on the CPU anyway, e.g. indexing with CPU indices)."""
    indices = {x.device.index for x in leaves if isinstance(x, torch.Tensor) and x.device.type == "spyre"}
    if len(indices) > 1:
        listed = ", ".join(f"spyre:{i}" for i in sorted(indices))
        raise SpyreUsageError(
            f"{op} got tensors on several spyre devices ({listed}); an op runs on one card. Move operands to one "
            "device first, e.g. b = b.to(a.device)"
        )
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if x.dtype.is_complex:
                raise TypeError(f"{op}: spyre has no complex dtypes (got {x.dtype}); compute this on the CPU")
            if x.device.type not in ("spyre", "meta") and x.dim() > 0 and not host_op:
                raise SpyreUsageError(
                    f"{op} mixes a {x.device} tensor of shape {tuple(x.shape)} with spyre tensors; move it first "
                    "with .to('spyre') (only 0-dim CPU tensors are accepted as scalars)"
                )
    if indices:
        return indices.pop()
    device = kwargs.get("device")
    return device_index(device if device is not None and torch.device(device).type == "spyre" else None)


def launch_eager(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run one ATen op on spyre tensors: as a device program when it is a device op, else on the CPU.

    A call whose signature was seen before goes straight to its cached program: the checks of
    :func:`device_of` passed when that program was built, and the signature names every operand's
    card, shape, strides and dtype, so they would pass again."""
    leaves, spec, call_shape = _flatten_call(args, kwargs)
    try:
        key, index = _signature(op, leaves, call_shape)
        program = _PROGRAMS.get(key)
    except TypeError:                          # an unhashable argument: never cached
        key, program = None, None
    if program is not None:
        if next(reversed(_PROGRAMS.values())) is not program:   # the most recent already: no second hash of the key
            _PROGRAMS.move_to_end(key)
        made = program.launchers.get(index)
        if made is not None and made.generation == made.device.generation:   # its cached launcher, still valid
            result = run_cached(made, leaves, program.name)
            if result is not GENERAL_ROAD:
                return result
        return _run_program(program, leaves, spec, index)
    name = packet_name(op)
    index = device_of(op, leaves, kwargs, host_op=name not in DEVICE_OPS)
    if name in DEVICE_OPS:
        try:
            program = _eager_program(op, leaves, spec, index, key)
        except _NeedsHost:
            program = None
        if program is not None:
            return _run_program(program, leaves, spec, index)
    return run_on_host(op, leaves, spec, index, warn=name not in HOST_BY_DESIGN)


class _NeedsHost(Exception):
    """The op cannot be sized ahead of running it (data-dependent output): take the host road."""


@dataclass(eq=False)
class EagerProgram:
    """A one-kernel program for one op signature (a :class:`~spyre_lab.runtime.launch.kernels.LaunchProgram`): what it
    reads, writes and allocates."""

    name: str
    kernels: list[LoadedFunction]
    input_leaves: list[int]                  # leaf positions of spyre inputs, slot in<i>
    mutated_leaves: list[int]                # leaf positions written in place (subset of input_leaves)
    out_meta: tuple[list[tuple[str, int]], Any]  # ("arg", leaf) / ("new", j) per output leaf, and the out spec
    new_outputs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]   # size, stride, dtype per out<j>
    resize: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]                # out= args that must grow
    num_nodes: int = 1
    compiled: Program | None = None          # the compiler's Program for this op, when it has one
    mutations: tuple = ()                    # in-place updates run inside the kernel: none to write back
    fixed_timing: ClassVar[bool] = True      # its name and roofline time never change: launches need not check
    launchers: dict[int, EagerLauncher | None] = field(default_factory=dict)   # per card, see eager_launch

    @functools.cached_property
    def cached_launch(self) -> bool:
        """Whether a launch may take the cached launcher (:mod:`~spyre_lab.runtime.eager_launch`): a compiled
        program whose outputs are all new tensors, with nothing to resize and something on the card to read."""
        return (self.compiled is not None and not self.resize and bool(self.read_leaves)
                and all(kind == "new" for kind, _ in self.out_meta[0]))

    @functools.cached_property
    def read_leaves(self) -> list[int]:
        """The inputs a compiled program reads (those it writes in place are its outputs)."""
        written = set(self.mutated_leaves)
        return [leaf for leaf in self.input_leaves if leaf not in written]


_PROGRAMS: OrderedDict[Any, EagerProgram] = OrderedDict()
PROGRAM_CACHE_SIZE = 1024
"""One-op programs kept (least recently used dropped first), like a compile cache with a size limit."""


def program_cache_size() -> int:
    return len(_PROGRAMS)


def cached_programs() -> list[EagerProgram]:
    """The one-op programs kept now, least recently used first."""
    return list(_PROGRAMS.values())


def _shape_of_call(args: tuple, kwargs: dict) -> tuple:
    """What fixes the pytree spec of an ATen call (cheaper to hash than the TreeSpec itself): the
    number of positional args, the keyword names, and the length of every list argument."""
    def arity(v: Any) -> Any:
        kind = type(v)
        return (kind, len(v)) if kind in _FLAT else -1

    return len(args), tuple(arity(a) for a in args), tuple((k, arity(v)) for k, v in kwargs.items())


_FLAT = (list, tuple)
_SPECS: dict[tuple, Any] = {}


def _flatten_call(args: tuple, kwargs: dict) -> tuple[list[Any], Any, tuple]:
    """``tree_flatten((args, kwargs))`` for an ATen call, without walking the pytree every time: an ATen
    call nests at most one list deep, so its leaves are read directly, with the call shape (what
    :func:`_shape_of_call` names) on the way, and its TreeSpec is kept per call shape. Anything deeper
    takes ``tree_flatten``."""
    leaves: list[Any] = []
    arities: list[Any] = []
    for value in args:
        kind = type(value)
        if kind is list or kind is tuple:
            for item in value:
                inner = type(item)
                if inner is list or inner is tuple or inner is dict:
                    return (*tree_flatten((args, kwargs)), _shape_of_call(args, kwargs))
            leaves.extend(value)
            arities.append((kind, len(value)))
        elif kind is dict:
            return (*tree_flatten((args, kwargs)), _shape_of_call(args, kwargs))
        else:
            leaves.append(value)
            arities.append(-1)
    if kwargs:
        for value in kwargs.values():
            kind = type(value)
            if kind is dict or ((kind is list or kind is tuple) and any(type(i) in _NESTING for i in value)):
                return (*tree_flatten((args, kwargs)), _shape_of_call(args, kwargs))
            if kind is list or kind is tuple:
                leaves.extend(value)
            else:
                leaves.append(value)
        call_shape = _shape_of_call(args, kwargs)
    else:
        call_shape = (len(args), tuple(arities), ())
    spec = _SPECS.get(call_shape)
    if spec is None:
        full, spec = tree_flatten((args, kwargs))
        if len(full) != len(leaves) or any(a is not b for a, b in zip(full, leaves)):
            return full, spec, call_shape      # a container pytree reads differently: never cache it
        _SPECS[call_shape] = spec
    return leaves, spec, call_shape


_NESTING = (list, tuple, dict)


def _signature(op: torch._ops.OpOverload, leaves: list[Any], call_shape: tuple) -> tuple[tuple, int | None]:
    """What fixes an op's one-op program (op, call shape, every operand's card, shape, strides, offset and
    dtype, every constant's value, timing-only mode), and the card of its first spyre operand.

    A constant is keyed by what it *is*, not by what ``==`` says: ``0.0 == -0.0`` and ``nan != nan``, so floats
    that are zero or NaN are keyed by their bits (see :func:`constant_key`). A CPU scalar tensor is keyed by its
    dtype and value (the program holds its own copy, see :func:`_held_constants`). Any other non-spyre tensor
    (a meta tensor, a CPU tensor with dimensions) raises TypeError: its call is never cached."""
    # the op by its builtin (hashed in C; an OpOverload hashes in Python, at every lookup of the key)
    parts: list[Any] = [op._op, call_shape, is_timing_only()]   # unchecked programs never serve numerics
    index = None
    for x in leaves:
        if isinstance(x, torch.Tensor):
            device = x.device
            card = INDEX_OF.get(device)            # spyre_index's table, read without the call
            if card is None:
                card = spyre_index(device)
            if card is not None:
                if index is None:
                    index = card
                parts.append((card, x.shape, x.stride(), x.storage_offset(), x.dtype))
            elif device.type == "cpu" and x.dim() == 0:   # a CPU scalar operand: its value is a constant
                parts.append((torch.Tensor, x.dtype, constant_key(x.item())))
            else:
                raise TypeError(f"a {device} operand of shape {tuple(x.shape)} is not a cacheable constant")
        else:
            kind = type(x)
            if (kind is float and (x == 0.0 or x != x)) or kind in KEYED_BY_PARTS:
                parts.append(constant_key(x))
            else:
                parts.append((kind, x))
    return tuple(parts), index      # hashed (an unhashable constant raises TypeError) by the cache lookup


def _held_constants(leaves: list[Any], written: list[int]) -> list[Any]:
    """The call's leaves as a program keeps them: a CPU tensor operand (a 0-dim scalar) is copied, because the
    program is found again by that scalar's *value* (:func:`_signature`) and must not see the caller change it
    afterwards (``t.fill_(3.0)`` after ``torch.maximum(x, t)``). Spyre operands are bound anew at every launch."""
    held = list(leaves)
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor) and x.device.type != "spyre" and i not in written:
            held[i] = x.detach().clone()
    return held


def _eager_program(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, index: int,
                   key: tuple | None) -> EagerProgram:
    """The program for a call not in the cache: built, and kept under ``key`` (None: not cacheable)."""
    program = _build_program(op, leaves, spec, get_device(index).config)
    if key is not None:
        _PROGRAMS[key] = program
        if len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
            _PROGRAMS.popitem(last=False)
    return program


def _to_meta(x: Any) -> Any:
    """Spyre operands and CPU scalar tensors as meta tensors, for the shape-and-dtype run of an op: some meta
    kernels want every tensor on one device (``masked_fill`` with a CPU 0-dim ``value``), which a CPU scalar
    beside a spyre tensor is not, though the CPU and CUDA accept it."""
    if isinstance(x, torch.Tensor) and (x.device.type == "spyre" or (x.dim() == 0 and x.device.type == "cpu")):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _build_program(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, cfg: SpyreConfig) -> EagerProgram:
    meta_leaves = [_to_meta(x) for x in leaves]
    meta_args, meta_kwargs = tree_unflatten(meta_leaves, spec)
    meta_kwargs = to_cpu_kwargs(meta_kwargs)
    if "device" in meta_kwargs:
        meta_kwargs["device"] = torch.device("meta")
    try:
        out = _call_taking_numbers(op, meta_args, meta_kwargs, to_meta=True)
    except (NotImplementedError, RuntimeError) as exc:
        if "data-dependent" in str(exc) or "meta" in str(exc).lower():
            raise _NeedsHost from exc
        raise
    input_leaves = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.device.type == "spyre"]
    by_identity = {id(meta_leaves[i]): i for i in input_leaves}
    written = written_leaves(op, leaves, spec)
    out_leaves, out_spec = tree_flatten(out)
    if op is torch.ops.aten.native_layer_norm.default:   # Meta says fp32 mean/rstd for fp16 input; the CPU op
        out_leaves = [o.to(meta_leaves[0].dtype) for o in out_leaves]  # (the reference) keeps the input dtype
    markers: list[Any] = []
    new_outputs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = []
    for o in out_leaves:
        if isinstance(o, torch.Tensor) and id(o) in by_identity:
            markers.append(("arg", by_identity[id(o)]))
        elif isinstance(o, torch.Tensor):
            stride = o.stride() if _dense(o) else None
            markers.append(("new", len(new_outputs)))
            new_outputs.append((tuple(o.shape), stride, o.dtype))
        else:
            raise _NeedsHost
    resize = {i: (tuple(meta_leaves[i].shape), meta_leaves[i].stride()) for i in written
              if tuple(meta_leaves[i].shape) != tuple(leaves[i].shape)}
    name = f"aten::{op.overloadpacket.__name__}"
    write_only = set(written_leaves(op, leaves, spec, only_out=True))
    in_metas = [meta_leaves[i] for i in input_leaves if i not in write_only]
    out_metas = [o for o in out_leaves if isinstance(o, torch.Tensor)]
    time_us, detail = op_roofline_us(packet_name(op), in_metas, out_metas, cfg)
    slots = [f"in{k}" for k in range(len(input_leaves))] + [f"out{j}" for j in range(len(new_outputs))]
    held = _held_constants(leaves, written)
    compute = _make_compute(op, held, spec, input_leaves, written, markers, out_spec)
    kernel = LoadedFunction(name, slots, compute, time_us, timing="roofline, no compiled program", args=detail)
    out_args = set(written_leaves(op, leaves, spec, only_out=True))
    compiled = None
    if set(written) != out_args:
        detail["not_compiled"] = "writes an input in place"
    else:  # functional or out=
        compiled = compile_one_op(op, held, spec, [i for i in input_leaves if i not in out_args], out_metas)
        if compiled is None:
            detail["not_compiled"] = not_compiled().get(name, "")
    return EagerProgram(name, [kernel], input_leaves, written, (markers, out_spec), new_outputs, resize,
                        compiled=compiled)


def _call_taking_numbers(op: torch._ops.OpOverload, args: tuple, kwargs: dict, to_meta: bool = False) -> Any:
    """``op(*args, **kwargs)``; if the op refuses a Python number where its schema wants a Tensor (``int_tensor & 5``
    arrives as ``bitwise_and.Tensor(t, 5)``, the number unwrapped by boxing), again with the numbers as 0-dim
    tensors. Only then: a 0-dim tensor does not promote as the wrapped number did beside another 0-dim operand."""
    try:
        return op(*args, **kwargs)
    except RuntimeError as exc:
        if "Expected a value of type 'Tensor'" not in str(exc) and "Expected a value of type 'Optional[Tensor]'" \
                not in str(exc):
            raise
    args, kwargs = rewrap_numbers(op, args, kwargs)
    if to_meta:
        args, kwargs = tuple(_to_meta(a) for a in args), {k: _to_meta(v) for k, v in kwargs.items()}
    return op(*args, **kwargs)


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or is_non_overlapping_and_dense_or_false(t)

def _make_compute(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, input_leaves: list[int],
                  written: list[int], markers: list[Any], out_spec: Any) -> Callable[[Operands], None]:
    constants = [None if i in input_leaves else x for i, x in enumerate(leaves)]
    slot_of_leaf = {leaf: f"in{k}" for k, leaf in enumerate(input_leaves)}

    def compute(operands: Operands) -> None:
        host = list(constants)
        for leaf, slot in slot_of_leaf.items():
            value = operands[slot]
            host[leaf] = value.clone() if leaf in written else value
        args, kwargs = tree_unflatten(host, spec)
        result = _call_taking_numbers(op, args, to_cpu_kwargs(kwargs))
        for leaf in written:
            operands.write(slot_of_leaf[leaf], host[leaf])
        for (kind, j), value in zip(markers, tree_flatten(result)[0]):
            if kind == "new":
                operands.write(f"out{j}", value)

    return compute


def _run_program(program: EagerProgram, leaves: list[Any], spec: Any, index: int) -> Any:
    markers, out_spec = program.out_meta
    if program.cached_launch:        # through the program's launcher on this card (made at its first launch here,
        made = program.launchers.get(index, _UNMADE)             # and again after a reset of the card)
        if made is _UNMADE or (made is not None and made.generation != made.device.generation):
            made = program.launchers[index] = launcher(program.compiled, program.read_leaves, index, out_spec)
        result = GENERAL_ROAD if made is None else run_cached(made, leaves, program.name)
        if result is not GENERAL_ROAD:
            return result
    for leaf, (size, stride) in program.resize.items():
        resize(leaves[leaf], size, stride)
    if program.compiled is not None:
        targets = [leaves[ref] if kind == "arg" else None for kind, ref in markers]
        TIMELINE.begin_launch(program.name, {"eager": True, "compiled": True})
        try:
            produced = run_program(program.compiled, [leaves[leaf] for leaf in program.read_leaves], outputs=targets)
        finally:
            TIMELINE.end_launch()
        results = [leaves[ref] if kind == "arg" else value for (kind, ref), value in zip(markers, produced)]
    else:
        outputs = [empty_spyre(size, stride, dtype, index) for size, stride, dtype in program.new_outputs]
        bindings = {f"in{k}": leaves[leaf] for k, leaf in enumerate(program.input_leaves)}
        bindings.update({f"out{j}": t for j, t in enumerate(outputs)})
        launch(program, bindings, stream=current_stream(index), eager=True)
        results = [leaves[ref] if kind == "arg" else outputs[ref] for kind, ref in markers]
    return results[0] if out_spec.is_leaf() else tree_unflatten(results, out_spec)


_UNMADE = object()


def clear_program_cache() -> None:
    """Drop every cached one-op program (after a device reset their images are stale)."""
    _PROGRAMS.clear()


on_reset(clear_program_cache)
