"""``compile_graph``: the compiler's pipeline, FX graph -> ATen -> LoopIR -> kernels -> Program.

Stages, named after their Inductor / torch-spyre counterparts:

1. ``to_aten``: Dynamo's graph is traced with ``make_fx`` on fake tensors under ``no_grad`` with a
   decomposition table (what AOTAutograd's inference path does, without building a joint graph),
   functionalized so in-place ops become pure ones. No real data is touched at compile time.
2. ``lowering.lower``: ATen -> LoopIR (GraphLowering).
3. ``layout_propagation.propagate_layouts``: stick layouts and restickify (propagate_spyre_tensor_layouts,
   insert_restickify).
4. ``fusion.schedule``: fused kernels (Scheduler / spyre_fuse_nodes).
5. ``codegen.generate_kernel`` per device kernel: work division, LX plan, tile programs (KernelSpec).
6. ``program.plan_intermediates``: the DRAM pool (memory_planning) -> ``Program``.

Nothing here touches data or a device: the result is a :class:`~spyre_lab.compiler.program.Program`,
which the runtime binds to device memory and launches (``torch.compile(backend="spyre")`` is the
runtime's :mod:`~spyre_lab.runtime.dynamo_backend`) and :mod:`~spyre_lab.compiler.executor` can run on
CPU tensors.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from spyre_lab.compiler import cache
from spyre_lab.compiler.codegen import generate_kernel
from spyre_lab.compiler.device_literals import trace_on_host
from spyre_lab.compiler.fusion import schedule
from spyre_lab.compiler.ir import NodeGroup
from spyre_lab.compiler.layout_propagation import propagate_layouts
from spyre_lab.compiler.lowering import LoweringError, decomposition_table, lower
from spyre_lab.compiler.options import FUSION_RULES, CompileOptions
from spyre_lab.compiler.program import HostFallback, Launch, Program, UnplannedSpec, plan_intermediates
from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.isa import LXOverflowError
from spyre_lab.heap import cyclic_gc_paused


def _fake_like(mode: Any, x: Any) -> Any:
    """A CPU fake tensor with ``x``'s shape, strides and dtype (x may be real, meta, fake or a device tensor)."""
    if not isinstance(x, torch.Tensor):
        return x
    with mode:
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="cpu")


def to_aten(fn: Callable | fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """Trace ``fn`` to an inference-only, functional ATen graph on fake tensors."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

    if isinstance(fn, fx.GraphModule):
        fn = trace_on_host(fn)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [_fake_like(mode, x) for x in example_inputs]
    try:
        with torch.no_grad(), mode:
            return make_fx(torch.func.functionalize(fn, remove="mutations"),
                           decomposition_table=decomposition_table())(*fakes)
    except (DynamicOutputShapeException, DataDependentOutputException) as e:
        raise LoweringError(
            f"{e}: an output shape depends on data, which a static Spyre program cannot hold. Under torch.compile "
            "leave torch._dynamo.config.capture_dynamic_output_shape_ops and capture_scalar_outputs off (the "
            "default): Dynamo then splits the graph there and runs that op eagerly; with compile_graph, compile "
            "the parts before and after it separately"
        ) from e


_TRACES: OrderedDict[str, tuple[Any, fx.GraphModule]] = OrderedDict()
MAX_TRACES = 16


def _traced(fn: Callable | fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """``to_aten`` once per (function, input signature): the ATen graph depends on neither the options nor the card,
    so compiling the same function again under other fusion rules or another config redoes only the compiler."""
    key = cache.cache_key(fn, example_inputs, CompileOptions(), SPYRE)[0]
    hit = _TRACES.get(key)
    if hit is not None and hit[0] is fn:
        _TRACES.move_to_end(key)
        return hit[1]
    gm = to_aten(fn, example_inputs)
    _TRACES[key] = (fn, gm)
    while len(_TRACES) > MAX_TRACES:
        _TRACES.popitem(last=False)
    return gm


def _plan(kernel: NodeGroup, buffers: Mapping, cfg: SpyreConfig, options: CompileOptions) -> Launch:
    slots = list(dict.fromkeys([*kernel.inputs, *kernel.outputs]))
    if kernel.is_fallback:
        return HostFallback(kernel.name, kernel, slots)
    try:
        return generate_kernel(kernel, buffers, cfg, options)
    except (LXOverflowError, ValueError, NotImplementedError) as e:
        # the numbers do not depend on the tile plan, so the program still runs; it just has no modeled time
        warnings.warn(f"spyre: kernel {kernel.name} has no tile plan and will not be timed: {e}", stacklevel=3)
        return UnplannedSpec(kernel.name, kernel, slots, f"{type(e).__name__}: {e}")


def _check_inputs(example_inputs: Sequence[Any]) -> None:
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (list, tuple)):
        raise TypeError(f"example_inputs must be a list of the call's arguments, got {type(example_inputs).__name__}; "
                        "write compile_graph(fn, [x]) for a single input")
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and (x.is_complex() or x.dtype == torch.float64):
            raise TypeError(f"input {i} has dtype {x.dtype}, for which the Spyre compiler has no device layout; "
                            "convert it with .half() (the device dtype) or .float()")


def compile_graph(fn: Callable | fx.GraphModule, example_inputs: Sequence[Any],
                  options: CompileOptions | None = None, cfg: SpyreConfig = SPYRE, *,
                  aten_graph: fx.GraphModule | None = None) -> Program:
    """Compile ``fn`` (an FX GraphModule, nn.Module or function) for ``example_inputs``' shapes into a Program.

    Cached: the same graph at the same shapes, options and config returns the cached Program. ``aten_graph``:
    ``fn``'s ATen graph at these inputs, when the caller has it already (an eager op's one-op graph,
    :mod:`~spyre_lab.compiler.one_op_graph`): it is not traced again.
    """
    options = options or CompileOptions()
    if not isinstance(options, CompileOptions):
        raise TypeError(f"options must be a CompileOptions, got {type(options).__name__}; "
                        "use CompileOptions(**fields) or pass a dict to torch.compile(options=...)")
    _check_inputs(example_inputs)
    key, structure, signature = cache.cache_key(fn, example_inputs, options, cfg)
    hit = cache.get(key)
    if hit is not None:
        hit.cache_note = "cache hit: same graph, shapes, options and config; nothing compiled"
        return hit
    start = time.perf_counter()
    with cyclic_gc_paused():
        program = _compiled(fn, example_inputs, options, cfg, aten_graph, key)
    program.compile_ms = (time.perf_counter() - start) * 1e3
    program.cache_note = cache.store(key, structure, signature, program, keep_alive=fn)
    return program


def _compiled(fn: Callable | fx.GraphModule, example_inputs: Sequence[Any], options: CompileOptions,
              cfg: SpyreConfig, aten_graph: fx.GraphModule | None, key: Any) -> Program:
    """The compiler's stages, trace to Program (not cached here: :func:`compile_graph` caches)."""
    aten_gm = _traced(fn, example_inputs) if aten_graph is None else aten_graph
    lowered = lower(aten_gm)
    restickifies = propagate_layouts(lowered, cfg)
    scheduled = schedule(lowered, options, cfg)
    kernels = scheduled.kernels
    unfused = len(lowered.graph.nodes)
    buffers = lowered.graph.buffers
    launches = [scheduled.planned.get(k.name) or _plan(k, buffers, cfg, options) for k in kernels]
    keep = {r.buffer for r in lowered.outputs} | {v.buffer for _, v in lowered.mutations}
    dram_plan, pool = plan_intermediates(kernels, buffers, keep)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return Program(
        name=name, kernels=kernels, launches=launches, inputs=lowered.input_names, outputs=lowered.outputs,
        buffers=buffers, constants=lowered.constants, access=lowered.access, options=options, cfg=cfg,
        dram_plan=dram_plan, pool_bytes=pool, restickifies=restickifies, fallback_ops=lowered.fallback_ops,
        unfused_kernels=unfused, cache_key=key, mutations=lowered.mutations,
        aten_ops=sum(1 for n in aten_gm.graph.nodes if n.op == "call_function"),
    )


def options_from(raw: Mapping[str, Any] | CompileOptions | None) -> CompileOptions:
    """``torch.compile(..., options={...})`` dict -> CompileOptions, with errors that name the bad key."""
    if raw is None:
        return CompileOptions()
    if isinstance(raw, CompileOptions):
        return raw
    fields = set(CompileOptions.__dataclass_fields__)
    unknown = set(raw) - fields
    if unknown:
        raise ValueError(f"unknown spyre compile option(s) {sorted(unknown)}; valid: {sorted(fields)}")
    raw = dict(raw)
    if "fusion" in raw:
        raw["fusion"] = _fusion_rules(raw["fusion"])
    return CompileOptions(**raw)


def _fusion_rules(fusion: Any) -> frozenset[str]:
    """``options["fusion"]``: True (every rule), False (none), one rule name, or a collection of rule names."""
    if fusion is True or fusion is False:
        return frozenset(FUSION_RULES if fusion else ())
    if isinstance(fusion, str):
        fusion = [fusion]
    if not isinstance(fusion, (list, tuple, set, frozenset)) or not all(isinstance(r, str) for r in fusion):
        raise TypeError(f"spyre compile option 'fusion' must be True (every rule), False (none), a rule name or a "
                        f"list of rule names from {list(FUSION_RULES)}; got {fusion!r}")
    return frozenset(fusion)


__all__ = ["compile_graph", "options_from", "to_aten"]
