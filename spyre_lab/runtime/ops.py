"""Eager ops: every ATen op on a spyre tensor enters :func:`dispatch`, registered as the PrivateUse1 fallback.

Three roads, chosen per op:

* **Views** (any op whose schema returns an alias: view, as_strided, transpose, slice, ...) are
  built by redispatching to the Meta kernel, which makes a new TensorImpl on the *same* storage.
  No data moves; the device payload is shared, as on the card.
* **Device ops** (:data:`DEVICE_OPS`, the pointwise / reduction / matmul family the real stack
  compiles) go through :func:`launch_eager`: the op becomes a one-kernel program, cached per
  (op, shapes, strides, dtypes, constants), launched through the JobPlan path (correction,
  H2D of the blob, Compute) exactly like compiled work. The kernel computes with torch on the
  host mirror of the operands it finds through its patched addresses; its device time is a
  roofline (DRAM bytes vs PE / SFU throughput plus the per-kernel launch cost), labelled as such.
* **CPU fallback** (everything else): a real D2H of the inputs, the CPU op, an H2D of the
  results, all on the trace, with one ``warnings.warn`` per op. Ops whose output size depends
  on the data (nonzero, masked_select, unique, ...) are host ops by design and do not warn.

Backward through spyre tensors is refused: this device is inference-only.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.device.config import SpyreConfig
from spyre_lab.runtime.device_module import _device_index, get_device
from spyre_lab.runtime.jobplan import JobPlan, Operands, ProgramKernel, RuntimeOptions, dma_us, plan_launch
from spyre_lab.runtime.streams import TIMELINE, current_stream
from spyre_lab.runtime.tensor import (
    SpyreUsageError,
    buffer_of,
    device_nbytes,
    empty_spyre,
    from_host,
    host_view,
    warn_if_narrowed,
    write_into,
)

_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
aten = torch.ops.aten

DEVICE_OPS = frozenset({
    # pointwise arithmetic and math
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "reciprocal", "pow", "sqrt", "rsqrt", "exp", "log",
    "tanh", "sigmoid", "relu", "silu", "gelu", "erf", "maximum", "minimum", "clamp", "clamp_min", "clamp_max",
    "ceil", "floor", "sign", "square", "hardtanh", "leaky_relu", "elu", "softplus", "mish", "lerp",
    # comparisons and selection
    "eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "logical_not", "logical_and", "logical_or",
    "bitwise_and", "bitwise_not",
    # data movement the device does itself
    "clone", "fill", "zero", "cat", "index_select", "_to_copy", "copy",
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

DIRECT_KERNELS = (aten.native_layer_norm.default, aten.view.dtype, aten.rms_norm.default)
"""Ops the dispatcher would otherwise decompose or run with a composite kernel before the backend
fallback sees them; a direct PrivateUse1 registration keeps them whole, like the real stack's
fused custom ops (a decomposed rms_norm would also round its fp32 intermediates to fp16)."""

REFERENCE_ONLY = frozenset({"rms_norm", "_fused_rms_norm", "native_layer_norm", "var", "std", "lerp"})
"""Device ops whose compiled programs round fp16 intermediates (as the card does: no fp32 upcast), so
squares of large inputs overflow (norms, var/std) or a cancellation loses digits (lerp) where the CPU
op, computing in fp32, does not. In eager mode they run the reference kernel so eager results equal
the CPU's; under torch.compile the compiled numerics apply."""

_TRANSCENDENTAL = frozenset({"exp", "log", "tanh", "sigmoid", "silu", "gelu", "erf", "rsqrt", "sqrt", "pow",
                             "_softmax", "_log_softmax", "softplus", "mish", "elu", "native_layer_norm",
                             "rms_norm", "_fused_rms_norm", "reciprocal", "div"})
_MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "dot", "mv"})

# estimates (documented nowhere): one host core doing the CPU fallback's work.
HOST_FALLBACK_FLOPS = 20e9
HOST_FALLBACK_BYTES_PER_S = 10e9
HOST_FALLBACK_DISPATCH_US = 5.0


class SpyreInferenceOnlyError(RuntimeError):
    """Raised when autograd tries to run a backward pass through spyre tensors."""


def packet_name(op: torch._ops.OpOverload) -> str:
    """``add_`` and ``add`` share one kernel: the in-place form only differs in where it writes."""
    name = op.overloadpacket.__name__
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@functools.cache
def _is_view(op: torch._ops.OpOverload) -> bool:
    if op is aten._unsafe_view.default:
        return True
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


@functools.cache
def _mutated_args(op: torch._ops.OpOverload) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, kwarg_only) of every argument the op writes: self of in-place ops (read and
    written) and out= tensors (keyword-only, written without being read)."""
    return tuple((i, a.name, a.kwarg_only) for i, a in enumerate(op._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


# --- entry point --------------------------------------------------------------------------------
def dispatch(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """The PrivateUse1 fallback: every ATen op on a spyre tensor lands here."""
    if torch._C._current_graph_task_id() != -1:
        raise SpyreInferenceOnlyError(
            f"spyre is an inference-only device: backward() reached {op} on a spyre tensor. Run inference "
            "under torch.inference_mode() / torch.no_grad(), or train on the CPU and move the trained model "
            "with .to('spyre')."
        )
    special = _SPECIAL.get(op)
    if special is not None:
        return special(*args, **kwargs)
    if _is_view(op):
        return _view(op, args, kwargs)
    return launch_eager(op, args, kwargs)


def _view(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    if op in (aten.view.dtype, aten.view_as_real.default, aten.view_as_complex.default):
        source = args[0]
        target = args[1] if op is aten.view.dtype else None
        if target is not None and target == source.dtype:
            return aten.alias.default.redispatch(_META, source)
        raise SpyreUsageError(
            f"{op} reinterprets the bits of a spyre tensor, but spyre stores data stickified in its device dtype, "
            "so there are no host bits to reinterpret; do it on the CPU: t.cpu().view(dtype)"
        )
    return op.redispatch(_META, *args, **kwargs)


# --- device selection and checks ---------------------------------------------------------------
def _device_of(op: torch._ops.OpOverload, leaves: list[Any], kwargs: dict) -> int:
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
            if x.device.type not in ("spyre", "meta") and x.dim() > 0:
                raise SpyreUsageError(
                    f"{op} mixes a {x.device} tensor of shape {tuple(x.shape)} with spyre tensors; move it first "
                    "with .to('spyre') (only 0-dim CPU tensors are accepted as scalars)"
                )
    if indices:
        return indices.pop()
    device = kwargs.get("device")
    return _device_index(device if device is not None and torch.device(device).type == "spyre" else None)


def _to_cpu_kwargs(kwargs: dict) -> dict:
    if "device" in kwargs and kwargs["device"] is not None:
        return {**kwargs, "device": torch.device("cpu")}
    return kwargs


# --- the one launch function ---------------------------------------------------------------------
def launch_eager(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run one ATen op on spyre tensors: as a device program when it is a device op, else on the CPU."""
    leaves, spec = tree_flatten((args, kwargs))
    index = _device_of(op, leaves, kwargs)
    name = packet_name(op)
    if name in DEVICE_OPS:
        try:
            program = _eager_program(op, leaves, spec, index, _shape_of_call(args, kwargs))
        except _NeedsHost:
            program = None
        if program is not None:
            return _run_program(program, leaves, spec, index)
    return _run_on_host(op, leaves, spec, index, warn=name not in HOST_BY_DESIGN)


class _NeedsHost(Exception):
    """The op cannot be sized ahead of running it (data-dependent output): take the host road."""


@dataclass(eq=False)
class EagerProgram:
    """A one-kernel program for one op signature: what it reads, writes and allocates."""

    name: str
    kernels: list[ProgramKernel]
    input_leaves: list[int]                  # leaf positions of spyre inputs, slot in<i>
    mutated_leaves: list[int]                # leaf positions written in place (subset of input_leaves)
    out_meta: Any                            # pytree of meta outputs / ("arg", leaf) markers
    new_outputs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]   # size, stride, dtype per out<j>
    resize: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]                # out= args that must grow
    num_nodes: int = 1
    compiled: Any = None                     # the compiler's Program for this op, when it has one


_PROGRAMS: dict[Any, EagerProgram] = {}


def clear_program_cache() -> None:
    """Drop every cached one-op program (after a device reset their images are stale)."""
    _PROGRAMS.clear()


def program_cache_size() -> int:
    return len(_PROGRAMS)


def _shape_of_call(args: tuple, kwargs: dict) -> tuple:
    """What fixes the pytree spec of an ATen call (cheaper to hash than the TreeSpec itself): the
    number of positional args, the keyword names, and the length of every list argument."""
    def arity(v: Any) -> int:
        return len(v) if isinstance(v, (list, tuple)) else -1

    return len(args), tuple(arity(a) for a in args), tuple((k, arity(v)) for k, v in kwargs.items())


def _signature(op: torch._ops.OpOverload, leaves: list[Any], call_shape: tuple) -> Any:
    parts: list[Any] = [op, call_shape]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if x.device.type == "spyre":
                parts.append((tuple(x.shape), x.stride(), x.storage_offset(), x.dtype))
            else:
                parts.append(("cpu", x.dtype, x.item()))
        elif isinstance(x, (list, tuple)):
            parts.append(tuple(x))
        else:
            parts.append((type(x), x))
    return tuple(parts)


def _eager_program(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, index: int,
                   call_shape: tuple) -> EagerProgram:
    try:
        key = _signature(op, leaves, call_shape)
        hash(key)
    except TypeError:
        key = None
    program = _PROGRAMS.get(key) if key is not None else None
    if program is None:
        program = _build_program(op, leaves, spec, get_device(index).config)
        if key is not None:
            _PROGRAMS[key] = program
    return program


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.device.type == "spyre":
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _build_program(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, cfg: SpyreConfig) -> EagerProgram:
    meta_leaves = [_to_meta(x) for x in leaves]
    meta_args, meta_kwargs = tree_unflatten(meta_leaves, spec)
    meta_kwargs = _to_cpu_kwargs(meta_kwargs)
    if "device" in meta_kwargs:
        meta_kwargs["device"] = torch.device("meta")
    try:
        out = op(*meta_args, **meta_kwargs)
    except (NotImplementedError, RuntimeError) as exc:
        if "data-dependent" in str(exc) or "meta" in str(exc).lower():
            raise _NeedsHost from exc
        raise
    input_leaves = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.device.type == "spyre"]
    by_identity = {id(meta_leaves[i]): i for i in input_leaves}
    written = _written_leaves(op, leaves, spec)
    out_leaves, out_spec = tree_flatten(out)
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
    write_only = set(_written_leaves(op, leaves, spec, only_out=True))
    in_metas = [meta_leaves[i] for i in input_leaves if i not in write_only]
    out_metas = [o for o in out_leaves if isinstance(o, torch.Tensor)]
    time_us, detail = roofline_us(packet_name(op), in_metas, out_metas, cfg)
    slots = [f"in{k}" for k in range(len(input_leaves))] + [f"out{j}" for j in range(len(new_outputs))]
    compute = _make_compute(op, leaves, spec, input_leaves, written, markers, out_spec)
    kernel = ProgramKernel(name, slots, compute, time_us, timing="roofline, no compiled program", args=detail)
    out_args = set(_written_leaves(op, leaves, spec, only_out=True))
    compiled = None
    if set(written) == out_args and packet_name(op) not in REFERENCE_ONLY:  # functional or out=
        compiled = _compile_one_op(op, leaves, spec, [i for i in input_leaves if i not in out_args], out_metas)
    return EagerProgram(name, [kernel], input_leaves, written, (markers, out_spec), new_outputs, resize,
                        compiled=compiled)


def _compile_one_op(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, input_leaves: list[int],
                    out_metas: list[torch.Tensor]) -> Any:
    """The compiler's Program for this single op, or None when the compiler is absent or would not
    run the whole op on the device (a host fallback or an unplanned kernel inside)."""
    try:
        from spyre_lab.compiler.backend import compile_graph
        from spyre_lab.compiler.program import HostFallback, UnplannedKernel
    except ImportError:
        return None
    functional = _functional_variant(op)
    if functional is None:
        return None
    out_names = {name for _, name, kwarg_only in _mutated_args(op) if kwarg_only}
    inputs = set(input_leaves)
    constants = [None if i in inputs else x for i, x in enumerate(leaves)]

    def one_op(*tensors: torch.Tensor) -> Any:
        values = list(constants)
        for leaf, t in zip(input_leaves, tensors):
            values[leaf] = t
        args, kwargs = tree_unflatten(values, spec)
        kwargs = {k: v for k, v in kwargs.items() if k not in out_names}
        return functional(*args, **_to_cpu_kwargs(kwargs))

    examples = [torch.zeros_like(torch.empty_strided(leaves[i].shape, leaves[i].stride(), dtype=leaves[i].dtype))
                for i in input_leaves]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = compile_graph(one_op, examples)
    except Exception:
        return None
    if any(isinstance(launch, (HostFallback, UnplannedKernel)) for launch in program.launches):
        return None
    produced = [(tuple(program.buffers[r.buffer].shape), program.buffers[r.buffer].dtype) for r in program.outputs]
    if len(produced) != len(out_metas) or not program.launches:
        return None
    return program if _agrees_with_reference(program, one_op, examples) else None


def _agrees_with_reference(program: Any, one_op: Callable[..., Any], examples: list[torch.Tensor]) -> bool:
    """Run the compiled program once on sample data against the CPU op: a program that disagrees
    is not used (the reference kernel runs instead), so a compiler gap never becomes a wrong value."""
    from spyre_lab.runtime.executor import execute

    g = torch.Generator().manual_seed(0)
    samples = [torch.randn(x.shape, generator=g).to(x.dtype) if x.dtype.is_floating_point else x for x in examples]
    try:
        expected = [t for t in tree_flatten(one_op(*samples))[0] if isinstance(t, torch.Tensor)]
        got = execute(program, samples).outputs
        for e, o in zip(expected, got, strict=True):
            torch.testing.assert_close(o, e, atol=1e-3, rtol=1e-3, equal_nan=True)
    except Exception:
        _disagreements.add(program.name)
        return False
    return True


_disagreements: set[str] = set()


@functools.cache
def _functional_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``op`` itself if it writes nothing; for an out= overload, the overload of the same packet that
    takes the same arguments without ``out`` and writes nothing (``exp.out`` -> ``exp.default``)."""
    if not _mutated_args(op):
        return op
    wanted = [a.name for a in op._schema.arguments if not (a.alias_info is not None and a.alias_info.is_write)]
    for name in op.overloadpacket.overloads():
        candidate = getattr(op.overloadpacket, name)
        args = candidate._schema.arguments
        if not any(a.alias_info is not None and a.alias_info.is_write for a in args) and \
                [a.name for a in args] == wanted:
            return candidate
    return None


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or t.is_non_overlapping_and_dense()


def _written_leaves(op: torch._ops.OpOverload, leaves: list[Any], spec: Any,
                    only_out: bool = False) -> list[int]:
    """Leaf positions of the tensors the op writes (``only_out``: just the out= ones), found by tagging
    the leaves and reading the schema."""
    mutated = _mutated_args(op)
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
        result = op(*args, **_to_cpu_kwargs(kwargs))
        for leaf in written:
            operands.write(slot_of_leaf[leaf], host[leaf])
        for (kind, j), value in zip(markers, tree_flatten(result)[0]):
            if kind == "new":
                operands.write(f"out{j}", value)

    return compute


def _run_program(program: EagerProgram, leaves: list[Any], spec: Any, index: int) -> Any:
    markers, out_spec = program.out_meta
    for leaf, (size, stride) in program.resize.items():
        _resize(leaves[leaf], size, stride)
    if program.compiled is not None:
        from spyre_lab.runtime.programs import run_program

        written = set(program.mutated_leaves)
        targets = [leaves[ref] if kind == "arg" else None for kind, ref in markers]
        with TIMELINE.launch(program.name, eager=True, compiled=True):
            produced = run_program(program.compiled,
                                   [leaves[leaf] for leaf in program.input_leaves if leaf not in written],
                                   outputs=targets)
        results = [leaves[ref] if kind == "arg" else value for (kind, ref), value in zip(markers, produced)]
        return tree_unflatten(results, out_spec)
    outputs = [empty_spyre(size, stride, dtype, index) for size, stride, dtype in program.new_outputs]
    bindings = {f"in{k}": leaves[leaf] for k, leaf in enumerate(program.input_leaves)}
    bindings.update({f"out{j}": t for j, t in enumerate(outputs)})
    plan: JobPlan = plan_launch(program, bindings, get_device(index))
    with TIMELINE.launch(program.name, eager=True):
        plan.submit(current_stream(index), RuntimeOptions())
    results = [leaves[ref] if kind == "arg" else outputs[ref] for kind, ref in markers]
    return tree_unflatten(results, out_spec)


# --- modeled device time of a one-op kernel -----------------------------------------------------------
def roofline_us(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                cfg: SpyreConfig) -> tuple[float, dict[str, Any]]:
    """Modeled time of one op as a device kernel: max(DRAM bytes, compute) plus the launch cost."""
    nbytes = sum(device_nbytes(t) for t in (*inputs, *outputs))
    memory_s = nbytes / cfg.dram_bandwidth
    if name in _MATMULS:
        flops = _matmul_flops(name, inputs, outputs)
        compute_s = flops / cfg.peak_flops
    else:
        elems = max([t.numel() for t in (*inputs, *outputs)] or [0])
        passes = cfg.transcendental_factor if name in _TRANSCENDENTAL else 1
        flops = elems * passes
        compute_s = flops / (cfg.sfu_elems_per_cycle_per_core * cfg.cores * cfg.clock_hz)
    launch_us = cfg.cycles_to_us(cfg.kernel_launch_cycles)
    time_us = max(memory_s, compute_s) * 1e6 + launch_us
    bound = "memory" if memory_s >= compute_s else "compute"
    return time_us, {"bytes": nbytes, "flops": flops, "bound": bound, "launch_us": launch_us}


def _matmul_flops(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    out = outputs[0] if outputs else inputs[0]
    if name == "dot":
        return 2 * inputs[0].numel()
    operands = inputs[-2:] if name in ("mm", "bmm", "mv") else inputs[1:3]
    k = operands[0].shape[-1] if operands[0].dim() else 1
    return 2 * out.numel() * k


# --- CPU fallback -------------------------------------------------------------------------------------
_warned_ops: set[str] = set()


def _run_on_host(op: torch._ops.OpOverload, leaves: list[Any], spec: Any, index: int, warn: bool) -> Any:
    name = f"aten::{op.overloadpacket.__name__}"
    if warn and name not in _warned_ops:
        _warned_ops.add(name)
        warnings.warn(f"{name} has no spyre kernel; it runs as a CPU fallback (inputs copied to the host, the CPU op, "
                      "results copied back). Each call pays two PCIe transfers.", stacklevel=4)
    device = get_device(index)
    stream = current_stream(index)
    written = set(_written_leaves(op, leaves, spec))
    with TIMELINE.launch(f"{name} (CPU fallback)", fallback=True):
        host = list(leaves)
        moved_in = 0
        write_only = set(_written_leaves(op, leaves, spec, only_out=True))
        for i, x in enumerate(leaves):
            if i in write_only:  # out= tensors are written, never read: nothing to copy over
                host[i] = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
            elif isinstance(x, torch.Tensor) and x.device.type == "spyre":
                nbytes = device_nbytes(x)
                moved_in += nbytes
                stream.enqueue(f"D2H {name} input", "pcie.d2h", _pcie(index), dma_us(nbytes, device), bytes=nbytes,
                               kind="D2H", fallback=True)
                host[i] = host_view(x).clone() if i in written else host_view(x)
        stream.synchronize()
        args, kwargs = tree_unflatten(host, spec)
        result = op(*args, **_to_cpu_kwargs(kwargs))
        out_leaves, out_spec = tree_flatten(result)
        out_bytes = sum(t.numel() * t.element_size() for t in out_leaves if isinstance(t, torch.Tensor))
        TIMELINE.host_work(f"{name} on CPU", _host_cost_us(moved_in + out_bytes, out_leaves), kind="HostCompute",
                           fallback=True, timing="modeled (host estimate)")
        host_to_leaf = {id(host[i]): i for i in written}
        results = []
        for value in out_leaves:
            if isinstance(value, torch.Tensor) and id(value) in host_to_leaf:
                target = leaves[host_to_leaf[id(value)]]
                if tuple(target.shape) != tuple(value.shape):
                    _resize(target, tuple(value.shape), None)
                write_into(target, value)
                _h2d(stream, target, name)
                results.append(target)
            elif isinstance(value, torch.Tensor):
                out = from_host(value, index)
                _h2d(stream, out, name)
                results.append(out)
            else:
                results.append(value)
        for i in written - set(host_to_leaf.values()):
            write_into(leaves[i], host[i])
            _h2d(stream, leaves[i], name)
    return tree_unflatten(results, out_spec)


def _pcie(index: int) -> str:
    from spyre_lab.runtime.streams import PCIE_LANE, device_lane

    return device_lane(PCIE_LANE, index)


def _h2d(stream: Any, t: torch.Tensor, name: str) -> None:
    nbytes = device_nbytes(t)
    stream.enqueue(f"H2D {name} result", "pcie.h2d", _pcie(stream.device_index),
                   dma_us(nbytes, get_device(stream.device_index)), bytes=nbytes, kind="H2D", fallback=True)


def _host_cost_us(nbytes: int, outputs: list[Any]) -> float:
    elems = sum(t.numel() for t in outputs if isinstance(t, torch.Tensor))
    return HOST_FALLBACK_DISPATCH_US + max(nbytes / HOST_FALLBACK_BYTES_PER_S, elems / HOST_FALLBACK_FLOPS) * 1e6


# --- special ops: allocation, copies, scalars, resize -------------------------------------------------
def _empty_memory_format(size: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                         pin_memory: Any = None, memory_format: Any = None) -> torch.Tensor:
    dtype = dtype or torch.get_default_dtype()
    stride = None
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
    return empty_spyre(size, stride, dtype, _device_index(device))


def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> torch.Tensor:
    return empty_spyre(size, stride, dtype or torch.get_default_dtype(), _device_index(device))


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Copies across the PCIe link (and within / between cards), each one a traced DMA."""
    if src.dtype.is_complex or dst.dtype.is_complex:
        raise TypeError("spyre has no complex dtypes; keep complex tensors on the CPU")
    if dst.device.type == "spyre" and src.device.type != "spyre":
        with TIMELINE.launch("H2D copy", bytes=device_nbytes(dst)):
            warn_if_narrowed(dst.dtype)
            write_into(dst, src.to(dst.dtype) if src.dtype != dst.dtype else src)
            stream = current_stream(dst.device.index)
            nbytes = device_nbytes(dst)
            stream.enqueue(f"H2D {tuple(dst.shape)} {dst.dtype}", "pcie.h2d", _pcie(dst.device.index),
                           dma_us(nbytes, get_device(dst.device.index)), bytes=nbytes, kind="H2D")
            if not non_blocking:
                stream.synchronize()
        return dst
    if src.device.type == "spyre" and dst.device.type != "spyre":
        with TIMELINE.launch("D2H copy", bytes=device_nbytes(src)):
            values = host_view(src)
            stream = current_stream(src.device.index)
            nbytes = device_nbytes(src)
            stream.enqueue(f"D2H {tuple(src.shape)} {src.dtype}", "pcie.d2h", _pcie(src.device.index),
                           dma_us(nbytes, get_device(src.device.index)), bytes=nbytes, kind="D2H")
            stream.synchronize()
            dst.copy_(values)
        return dst
    # spyre -> spyre
    if src.device.index == dst.device.index:
        return launch_eager(aten.copy_.default, (dst, src), {})
    with TIMELINE.launch("D2D copy between cards"):
        values = host_view(src).clone()
        nbytes = device_nbytes(src)
        s_src, s_dst = current_stream(src.device.index), current_stream(dst.device.index)
        _, end = s_src.enqueue("D2H peer copy", "pcie.d2h", _pcie(src.device.index),
                               dma_us(nbytes, get_device(src.device.index)), bytes=nbytes, kind="D2H")
        s_dst.enqueue("H2D peer copy", "pcie.h2d", _pcie(dst.device.index),
                      dma_us(nbytes, get_device(dst.device.index)), after_us=end, bytes=nbytes, kind="H2D")
        write_into(dst, values)
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(src.shape):
        if dst.device.type == "spyre":
            _resize(dst, tuple(src.shape), None)
        else:
            dst.resize_(src.shape)
    return _copy_from(src, dst)


def _copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if src.device.type != "spyre" or dst.device.type != "spyre" or src.device.index != dst.device.index:
        return _copy_from(src, dst, non_blocking)
    return launch_eager(aten.copy_.default, (dst, src), {"non_blocking": non_blocking})


def _local_scalar_dense(t: torch.Tensor) -> Any:
    with TIMELINE.launch("item"):
        stream = current_stream(t.device.index)
        nbytes = device_nbytes(t)
        stream.enqueue("D2H item", "pcie.d2h", _pcie(t.device.index), dma_us(nbytes, get_device(t.device.index)),
                       bytes=nbytes, kind="D2H")
        stream.synchronize()
        return host_view(t).item()


def _resize(t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...] | None) -> None:
    """Give ``t`` a new shape; grow its storage (a new DRAM block, old contents kept) if needed."""
    from spyre_lab.runtime.tensor import _contiguous_strides, storage_numel

    stride = _contiguous_strides(size) if stride is None else tuple(stride)
    need = storage_numel(size, stride, t.storage_offset())
    buffer = buffer_of(t)
    if need <= buffer.numel:
        aten.set_.source_Storage_storage_offset.redispatch(_CPU, t, t.untyped_storage(), t.storage_offset(),
                                                           size, stride)
        return
    grown = empty_spyre((need,), None, t.dtype, t.device.index)
    if buffer.numel:
        write_into(grown[: buffer.numel], buffer.host_flat())
    aten.set_.source_Storage_storage_offset.redispatch(_CPU, t, grown.untyped_storage(), t.storage_offset(),
                                                       size, stride)


def _resize_(t: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    stride = None
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
    _resize(t, tuple(size), stride)
    return t


def _set_storage(t: torch.Tensor, source: Any, storage_offset: int = 0, size: Any = None,
                 stride: Any = None) -> torch.Tensor:
    if getattr(source, "spyre_buffer", None) is None:
        raise SpyreUsageError("set_() on a spyre tensor needs a spyre storage (one made by the spyre runtime)")
    if size is None:
        size, stride = (source.nbytes() // t.element_size(),), (1,)
    return aten.set_.source_Storage_storage_offset.redispatch(_CPU, t, source, storage_offset, size, stride)


def _set_tensor(t: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    return _set_storage(t, source.untyped_storage(), source.storage_offset(), source.size(), source.stride())


def _pin_memory(*args: Any, **kwargs: Any) -> Any:
    raise SpyreUsageError("pin_memory() is for CPU tensors that feed a device; a spyre tensor is already on the device")


_SPECIAL: dict[Any, Callable[..., Any]] = {
    aten.empty.memory_format: _empty_memory_format,
    aten.empty_strided.default: _empty_strided,
    aten._copy_from.default: _copy_from,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.resize_.default: _resize_,
    aten.set_.source_Storage: _set_storage,
    aten.set_.source_Storage_storage_offset: _set_storage,
    aten.set_.source_Tensor: _set_tensor,
    aten.record_stream.default: lambda *a, **k: None,
    aten.is_pinned.default: lambda *a, **k: False,
    aten._pin_memory.default: _pin_memory,
}
