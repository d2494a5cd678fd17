"""The ``torch.compile`` backend "spyre" and ``compile_graph``: FX graph -> ATen -> LoopIR -> kernels -> Program.

Stages, named after their Inductor / torch-spyre counterparts:

1. ``to_aten``: Dynamo's graph is traced with ``make_fx`` on fake tensors under ``no_grad`` with a
   decomposition table (what AOTAutograd's inference path does, without building a joint graph),
   functionalized so in-place ops become pure ones. No real data is touched at compile time.
2. ``lowering.lower``: ATen -> LoopIR (GraphLowering).
3. ``layouts.propagate_layouts``: stick layouts and restickify (propagate_spyre_tensor_layouts,
   insert_restickify).
4. ``fusion.schedule``: fused kernels (Scheduler / spyre_fuse_nodes).
5. ``codegen.generate_kernel`` per device kernel: work division, LX plan, tile programs (KernelSpec).
6. ``program.plan_intermediates``: the DRAM pool (memory_planning) -> ``Program``.

The backend returns a callable that hands real tensors to ``spyre_lab.runtime.executor.execute``:
the executor is the only thing that touches data.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.compiler import cache
from spyre_lab.compiler.device_literals import trace_on_host
from spyre_lab.compiler.fusion import schedule
from spyre_lab.compiler.ir import FusedKernel
from spyre_lab.compiler.layouts import propagate_layouts
from spyre_lab.compiler.lowering import LoweringError, decomposition_table, lower
from spyre_lab.compiler.options import FUSION_RULES, CompileOptions
from spyre_lab.compiler.program import HostFallback, Program, UnplannedKernel, plan_intermediates
from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.isa import LXOverflowError


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


def _plan(kernel: FusedKernel, buffers: Mapping, cfg: SpyreConfig, options: CompileOptions) -> Any:
    slots = list(dict.fromkeys([*kernel.inputs, *kernel.outputs]))
    if kernel.is_fallback:
        return HostFallback(kernel.name, kernel, slots)
    try:
        from spyre_lab.compiler.codegen import generate_kernel
    except ImportError as e:
        return UnplannedKernel(kernel.name, kernel, slots, f"codegen unavailable ({e})")
    try:
        return generate_kernel(kernel, buffers, cfg, options)
    except (LXOverflowError, ValueError, NotImplementedError) as e:
        # the numbers do not depend on the tile plan, so the program still runs; it just has no modeled time
        warnings.warn(f"spyre: kernel {kernel.name} has no tile plan and will not be timed: {e}", stacklevel=3)
        return UnplannedKernel(kernel.name, kernel, slots, f"{type(e).__name__}: {e}")


def _check_inputs(example_inputs: Sequence[Any]) -> None:
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (list, tuple)):
        raise TypeError(f"example_inputs must be a list of the call's arguments, got {type(example_inputs).__name__}; "
                        "write compile_graph(fn, [x]) for a single input")
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and (x.is_complex() or x.dtype == torch.float64):
            raise TypeError(f"input {i} has dtype {x.dtype}, which the Spyre device cannot hold; "
                            "convert it with .half() (the device dtype) or .float()")


def compile_graph(fn: Callable | fx.GraphModule, example_inputs: Sequence[Any],
                  options: CompileOptions | None = None, cfg: SpyreConfig = SPYRE) -> Program:
    """Compile ``fn`` (an FX GraphModule, nn.Module or function) for ``example_inputs``' shapes into a Program.

    Cached: the same graph at the same shapes, options and config returns the cached Program.
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
    aten_gm = to_aten(fn, example_inputs)
    lowered = lower(aten_gm)
    restickifies = propagate_layouts(lowered, cfg)
    planned: dict[str, Any] = {}
    kernels = schedule(lowered, options, cfg, planned)
    unfused = len(lowered.graph.nodes)
    buffers = lowered.graph.buffers
    launches = [planned.get(k.name) or _plan(k, buffers, cfg, options) for k in kernels]
    keep = {r.buffer for r in lowered.outputs} | {v.buffer for _, v in lowered.mutations}
    dram_plan, pool = plan_intermediates(kernels, buffers, keep)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    program = Program(
        name=name, kernels=kernels, launches=launches, inputs=lowered.input_names, outputs=lowered.outputs,
        buffers=buffers, constants=lowered.constants, access=lowered.access, options=options, cfg=cfg,
        dram_plan=dram_plan, pool_bytes=pool, restickifies=restickifies, fallback_ops=lowered.fallback_ops,
        unfused_kernels=unfused, cache_key=key, mutations=lowered.mutations,
        aten_ops=sum(1 for n in aten_gm.graph.nodes if n.op == "call_function"),
    )
    program.compile_ms = (time.perf_counter() - start) * 1e3
    program.cache_note = cache.store(key, structure, signature, program, keep_alive=fn)
    return program


# --- torch.compile integration ------------------------------------------------------------------

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
        fusion = raw["fusion"]
        if isinstance(fusion, str):
            fusion = [fusion]
        raw["fusion"] = frozenset(FUSION_RULES if fusion is True else () if fusion is False else fusion)
    return CompileOptions(**raw)


_last: dict[str, Any] = {}


class CompiledGraph:
    """What the backend hands back to Dynamo: runs its Program through the executor on every call."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], options: CompileOptions,
                 cfg: SpyreConfig) -> None:
        self.gm, self.options, self.cfg = gm, options, cfg
        self._input_refs = [weakref.ref(x) for x in example_inputs if isinstance(x, torch.Tensor)]
        self.programs: dict[str, Program] = {}
        self.program: Program | None = None
        self.last_result: Any = None
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        self.out_leaves, self.out_spec = tree_flatten(out_node.args[0])
        self.host_values = _host_value_graph(gm, self.out_leaves)   # SymInt outputs: sizes, not device data
        if all(isinstance(x, torch.Tensor) for x in example_inputs):
            self.program = compile_graph(gm, example_inputs, options, cfg)
        _REGISTRY.append(self)
        del _REGISTRY[:-64]

    def reads_any_of(self, tensor_ids: set[int]) -> bool:
        """Did Dynamo pass any of these (still alive) tensors, e.g. a module's parameters, to this graph?"""
        return any(t is not None and id(t) in tensor_ids for t in (r() for r in self._input_refs))

    def program_for(self, args: Sequence[Any]) -> Program:
        if self.program is not None:
            return self.program
        program = compile_graph(self.gm, args, self.options, self.cfg)   # symbolic graph: one program per shape
        self.programs[program.cache_key] = program
        return program

    def all_programs(self) -> list[Program]:
        return ([self.program] if self.program is not None else []) + list(self.programs.values())

    def __call__(self, *args: Any) -> Any:
        program = self.program_for(args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(t.device.type == "spyre" for t in tensors):
            # on the card: the runtime binds the Program to DRAM buffers and launches each kernel as a
            # JobPlan (program correction -> H2D of the blob -> Compute); outputs stay on the device
            from spyre_lab.runtime.programs import run_program

            outputs = run_program(program, tensors, mode=self.options.timing)
            _last["program"] = program
        else:
            from spyre_lab.runtime.executor import execute

            result = execute(program, tensors, mode=self.options.timing)
            self.last_result = result
            _last["result"], _last["program"] = result, program
            outputs = result.outputs
        produced = iter(outputs)
        values = iter(self.host_values(*args) if self.host_values is not None else ())
        leaves = [leaf if not isinstance(leaf, fx.Node) else next(produced) if _is_tensor(leaf) else next(values)
                  for leaf in self.out_leaves]
        return tree_unflatten(leaves, self.out_spec)


def _is_tensor(node: fx.Node) -> bool:
    """Does the node produce a tensor? (Dynamo records each node's example value; without one, assume so.)"""
    value = node.meta.get("example_value", node.meta.get("val"))
    return value is None or isinstance(value, torch.Tensor)


def _host_value_graph(gm: fx.GraphModule, out_leaves: list[Any]) -> fx.GraphModule | None:
    """The part of Dynamo's graph that computes its non-tensor outputs (``n * 2`` for a dynamic int ``n``,
    ``x.size(0) + 1``): host arithmetic on sizes, which a device program has no output for."""
    wanted = [leaf for leaf in out_leaves if isinstance(leaf, fx.Node) and not _is_tensor(leaf)]
    if not wanted:
        return None
    needed, stack = set(), list(wanted)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    if any(_is_tensor(n) and n.op != "placeholder" for n in needed):
        raise LoweringError(f"graph output {wanted[0].name} is a Python number computed from tensor data; spyre "
                            "programs return tensors only: return the tensor and call .item() outside the "
                            "compiled function")
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in needed:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in wanted))
    return fx.GraphModule(gm, graph)


_REGISTRY: list[CompiledGraph] = []


def spyre_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> CompiledGraph:
    """The ``torch.compile`` backend: ``torch.compile(model, backend="spyre", options={"fusion": []})``."""
    options = options_from(kwargs.pop("options", None))
    cfg = kwargs.pop("cfg", SPYRE)
    if kwargs:
        warnings.warn(f"spyre backend ignores arguments {sorted(kwargs)}", stacklevel=2)
    return CompiledGraph(gm, example_inputs, options, cfg)


def compiled_graphs_for(obj: Any) -> list[CompiledGraph]:
    """The CompiledGraphs Dynamo produced for a compiled module (matched by its parameters), newest last."""
    if isinstance(obj, CompiledGraph):
        return [obj]
    module = getattr(obj, "_orig_mod", obj)
    params = {id(p) for p in module.parameters()} if isinstance(module, torch.nn.Module) else set()
    if params:
        return [g for g in _REGISTRY if g.reads_any_of(params)]
    return _REGISTRY[-1:]


def last_result() -> Any:
    """The ExecutionResult (outputs, trace, kernel times) of the last compiled-graph call."""
    return _last.get("result")


def register() -> None:
    """Make ``backend="spyre"`` resolve. With the package installed, Dynamo finds it through the
    ``torch_dynamo_backends`` entry point (and registers it itself when loading it, so registering
    here too would collide); from a plain source checkout, register it directly."""
    from importlib.metadata import entry_points

    if any(ep.name == "spyre" for ep in entry_points(group="torch_dynamo_backends")):
        return                                    # Dynamo loads it on first use; importing Dynamo here costs ~1 s
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "spyre" not in _COMPILER_FNS:
        register_backend(spyre_backend, name="spyre")


__all__ = ["CompiledGraph", "compile_graph", "options_from", "register", "spyre_backend", "to_aten"]
