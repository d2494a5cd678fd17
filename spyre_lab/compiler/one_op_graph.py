"""The ATen graph of one eager op: traced once per form, then given each new shape without tracing again.

An eager op at a new shape compiles a one-op program, and tracing it (``make_fx`` on fake tensors, functionalized,
with the decomposition table) costs several times what the rest of the compile does. For an op the table does not
decompose, the traced graph does not depend on the shapes at all: it is the op applied to its placeholders, plus
the 0-dim constants the call's Python numbers became (``x * 0.5`` traces as ``mul(x, lift_fresh_copy(c))``). So
the graph is traced once per *form* (op, call structure, constants, input dtypes: whatever the caller keys it by),
and at a new shape the same graph is made again with the new shapes in its ``val`` metadata: what lowering reads.

A graph is reused only when every call in it is the op itself or one of :data:`SHAPE_FREE_HELPERS`, and the op is
not in the decomposition table (a decomposition may branch on shapes, or bake a size into the graph: ``mean`` is
``sum`` over ``numel``); anything else is traced at every shape, as before.
"""

from __future__ import annotations

import functools
import operator
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule

from spyre_lab.compiler.op_tables import decomposition_table

aten = torch.ops.aten

SHAPE_FREE_HELPERS = frozenset({aten.lift_fresh_copy.default, aten.alias.default, operator.getitem})
"""Calls a one-op trace adds around the op that no shape reaches (a constant's copy, functionalization's alias of
it, the items of a tuple result): with the op itself, the only calls a reusable form holds."""

MAX_FORMS = 512
_FORMS: OrderedDict[Hashable, fx.GraphModule] = OrderedDict()


def clear() -> None:
    """Forget every traced form (``runtime.process_state.reset("caches")`` clears them with the other caches)."""
    _FORMS.clear()


def one_op_graph(fn: Callable[..., Any], example_inputs: Sequence[torch.Tensor], op: torch._ops.OpOverload,
                 form: Hashable | None, trace: Callable[[Callable[..., Any], Sequence[Any]], fx.GraphModule]
                 ) -> fx.GraphModule:
    """The ATen graph of ``fn`` (a call of ``op`` on ``example_inputs``): ``trace(fn, example_inputs)`` the first
    time ``form`` is seen (None: every time), the graph of that trace with these inputs' shapes afterwards."""
    template = None if form is None else _FORMS.get(form)
    if template is not None:
        _FORMS.move_to_end(form)
        try:
            return _retyped(template, example_inputs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError):   # the op refuses these shapes: the
            pass                                                          # trace raises the error the user sees
    gm = trace(fn, example_inputs)
    if form is not None and _reusable(gm, op):
        _FORMS[form] = gm
        while len(_FORMS) > MAX_FORMS:
            _FORMS.popitem(last=False)
    return gm


@functools.cache
def _decomposed() -> frozenset:
    """The ops the decomposition table rewrites (read once: the table is built from torch's on every call)."""
    return frozenset(decomposition_table())


def _reusable(gm: fx.GraphModule, op: torch._ops.OpOverload) -> bool:
    if op in _decomposed():
        return False
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    return (sum(1 for n in calls if n.target is op) == 1
            and all(n.target is op or n.target in SHAPE_FREE_HELPERS for n in calls)
            and all("val" in n.meta for n in gm.graph.nodes if n.op != "output"))


def _retyped(template: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> fx.GraphModule:
    """A copy of ``template``'s graph whose placeholders have ``example_inputs``' shapes, strides and dtypes, and
    whose calls that read them have the ``val`` their op gives on those (meta tensors: lowering reads a value's
    shape and dtype only). Calls no placeholder reaches (the constants) keep the template's values."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    metas: dict[fx.Node, Any] = {}          # new node -> its value on meta, for the nodes shapes reach
    inputs = iter(example_inputs)
    for node in template.graph.nodes:
        new = graph.node_copy(node, env.__getitem__)
        env[node] = new
        new.meta = dict(node.meta)
        if node.op == "placeholder":
            x = next(inputs)
            metas[new] = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
        elif node.op == "call_function" and any(a in metas for a in new.all_input_nodes):
            args, kwargs = fx.node.map_arg((new.args, new.kwargs), lambda a: metas[a] if a in metas else _meta(a))
            metas[new] = new.target(*args, **kwargs)
        else:
            continue
        new.meta["val"] = metas[new]
        new.meta.pop("tensor_meta", None)
    return _LazyGraphModule(template, graph)


def _meta(node: fx.Node) -> Any:
    """A constant node's template value on meta, so that the op meets meta tensors only."""
    val = node.meta["val"]
    if isinstance(val, torch.Tensor):
        return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta")
    return val
