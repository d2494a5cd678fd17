"""The ``torch.compile`` backend "spyre": Dynamo's graph -> the compiler's Program -> launched on every call.

``torch.compile(model, backend="spyre", options={"fusion": []})`` reaches :func:`spyre_backend` through the
``torch_dynamo_backends`` entry point. The compiler turns the graph into a Program
(:func:`~spyre_lab.compiler.backend.compile_graph`, nothing touches data); the :class:`CompiledGraph`
handed back to Dynamo launches that Program on every call: on spyre tensors, or when the graph places values
on the card itself (``.to("spyre")``, ``device="spyre"``), through the runtime (bound to device memory, JobPlans
with program correction, outputs stay on the card); otherwise through the compiler's reference interpreter
(:func:`~spyre_lab.compiler.executor.execute`). What the caller sees besides the numbers -- each output's device,
outputs that are views of inputs or of each other, fresh tensors for the rest -- follows eager, read from
Dynamo's example values (:class:`~spyre_lab.compiler.caller_view.CallerView`); a call whose in-place update of
an input overlaps another input runs the graph op by op. :func:`explain` finds the Programs compiled for a model.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from spyre_lab.compiler.backend import compile_graph, options_from
from spyre_lab.compiler.caller_view import CallerView
from spyre_lab.compiler.executor import ExecutionResult, execute
from spyre_lab.compiler.explain import Explanation
from spyre_lab.compiler.explain import explain as explain_programs
from spyre_lab.compiler.lowering import LoweringError
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.program import Program
from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.runtime.programs import run_program
from spyre_lab.user_line import warn_at_user_line

ENTRY_POINT = "spyre_lab.runtime.dynamo_backend:spyre_backend"

_last_result: ExecutionResult | None = None


class CompiledGraph:
    """What the backend hands back to Dynamo: runs its Program on every call (one Program per shape when
    Dynamo traced symbolically)."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], options: CompileOptions,
                 cfg: SpyreConfig) -> None:
        self.gm, self.options, self.cfg = gm, options, cfg
        self._input_refs = [weakref.ref(x) for x in example_inputs if isinstance(x, torch.Tensor)]
        self.programs: dict[str, Program] = {}
        self.program: Program | None = None
        self.last_result: ExecutionResult | None = None
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        self.out_leaves, self.out_spec = tree_flatten(out_node.args[0])
        # per output leaf: a constant, a tensor the program produces, or a host value (decided once, not per call)
        self._out_kinds = ["const" if not isinstance(leaf, fx.Node) else "tensor" if _is_tensor(leaf) else "host"
                           for leaf in self.out_leaves]
        self.host_values = _host_value_graph(gm, self.out_leaves)   # SymInt outputs: sizes, not device data
        # devices and aliasing the caller sees, read before compiling (tracing rewrites the graph's device literals)
        self.view = CallerView(gm, [leaf for leaf, kind in zip(self.out_leaves, self._out_kinds) if kind == "tensor"])
        self.eager_graph = fx.GraphModule(gm, copy.deepcopy(gm.graph))   # run op by op when a Program cannot be
        self._warned_aliasing = False
        self._shared: dict[int, frozenset[int]] = {}
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

    def _aliased_update(self, program: Program, tensors: list[torch.Tensor]) -> bool:
        """Does the program update an input in place that shares memory with another input? A Program traced on
        separate inputs would then read the other input's old values (``f(d, d[1])`` after ``a.mul_(2)``)."""
        updated = sorted({program.inputs.index(name) for name, _ in program.mutations})
        clash = self.view.aliased_update(updated, tensors)
        if clash is None:
            return False
        if not self._warned_aliasing:
            self._warned_aliasing = True
            warn_at_user_line(
                f"spyre: the compiled function updates its tensor argument {clash[0]} in place while argument "
                f"{clash[1]} shares that memory; a spyre Program reads its inputs as separate tensors, so calls "
                "like this one run op by op (eager), where every read sees the update. Pass separate tensors "
                "(.clone() one of them) to run the compiled Program")
        return True

    def all_programs(self) -> list[Program]:
        return ([self.program] if self.program is not None else []) + list(self.programs.values())

    def __call__(self, *args: Any) -> Any:
        global _last_result
        program = self.program_for(args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if program.mutations and self._aliased_update(program, tensors):
            return self.eager_graph(*args)
        if self.view.on_card or any(t.device.type == "spyre" for t in tensors):
            # on the card (spyre inputs, or a graph that places values there: .to("spyre"), device="spyre"):
            # the runtime copies host inputs over, binds the Program to DRAM buffers and launches each kernel
            # as a JobPlan (program correction -> H2D of the blob -> Compute); outputs stay on the device
            outputs = run_program(program, tensors, mode=self.options.timing)
            suspects = self._shared.get(id(program))
            if suspects is None:                             # worked out once per Program (kept alive by self)
                suspects = self._shared[id(program)] = _shared_outputs(program)
        else:
            result = execute(program, tensors, mode=self.options.timing)
            self.last_result = _last_result = result
            outputs, suspects = result.outputs, ()          # the interpreter hands out copies
        produced = iter(self.view.finish(outputs, tensors, suspects))
        values = iter(self.host_values(*args) if self.host_values is not None else ())
        leaves = [leaf if kind == "const" else next(produced) if kind == "tensor" else next(values)
                  for leaf, kind in zip(self.out_leaves, self._out_kinds)]
        return tree_unflatten(leaves, self.out_spec)


def _shared_outputs(program: Program) -> frozenset[int]:
    """Outputs the runtime may hand back in memory the caller already holds: a view of an input buffer, or a
    buffer an earlier output returned too (constants are copied by ``run_program``)."""
    inputs, seen, shared = set(program.inputs), set(), set()
    for k, read in enumerate(program.outputs):
        if read.buffer in inputs or read.buffer in seen:
            shared.add(k)
        seen.add(read.buffer)
    return frozenset(shared)


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


def compiled_graphs_for(obj: object) -> list[CompiledGraph]:
    """The CompiledGraphs Dynamo produced for a compiled module (matched by its parameters), newest last."""
    if isinstance(obj, CompiledGraph):
        return [obj]
    from torch._dynamo.eval_frame import OptimizedModule

    module = obj._orig_mod if isinstance(obj, OptimizedModule) else obj
    params = {id(p) for p in module.parameters()} if isinstance(module, torch.nn.Module) else set()
    if params:
        return [g for g in _REGISTRY if g.reads_any_of(params)]
    return _REGISTRY[-1:]


def compiled_graphs() -> list[CompiledGraph]:
    """Every CompiledGraph the backend made that is still kept (the newest 64), oldest first."""
    return list(_REGISTRY)


def last_result() -> ExecutionResult | None:
    """The ExecutionResult (outputs, trace, kernel times) of the last compiled-graph call on CPU tensors."""
    return _last_result


def forget_last_result() -> None:
    """No compiled-graph call seen yet (:func:`spyre_lab.runtime.process_state.reset`)."""
    global _last_result
    _last_result = None


def explain(obj: object, mode: str | None = None) -> Explanation:
    """Explain a Program, a CompiledGraph, or a module or function compiled with ``torch.compile(backend="spyre")``:
    graph -> kernels -> work division -> LX plan -> modeled times, plus the program cache's counts."""
    if isinstance(obj, Program):
        return explain_programs(obj, mode)
    programs = [p for g in compiled_graphs_for(obj) for p in g.all_programs()]
    if not programs:
        raise ValueError(f"nothing compiled for {type(obj).__name__} yet: call the compiled model once "
                         "(torch.compile is lazy), or pass a Program from compile_graph")
    return explain_programs(programs, mode)


def register() -> None:
    """Make ``backend="spyre"`` resolve. With the package installed, Dynamo finds it through the
    ``torch_dynamo_backends`` entry point (and registers it itself when loading it, so registering here
    too would collide); from a plain source checkout, or an install whose entry point names an older
    location, register it directly."""
    from importlib.metadata import entry_points

    if any(ep.name == "spyre" and ep.value == ENTRY_POINT for ep in entry_points(group="torch_dynamo_backends")):
        return                                    # Dynamo loads it on first use; importing Dynamo here costs ~1 s
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if _COMPILER_FNS.get("spyre") is not spyre_backend:
        _COMPILER_FNS.pop("spyre", None)
        register_backend(spyre_backend, name="spyre")


register()

__all__ = ["CompiledGraph", "compiled_graphs", "compiled_graphs_for", "explain", "last_result", "register",
           "spyre_backend"]
