"""Piecewise compilation: split a Dynamo graph at paged attention (and at the tensor-parallel all-reduces),
compile the pieces, run attention and the collectives between them.

This is vLLM's piecewise CUDA-graph scheme on the spyre backend. Dynamo traces the whole model once
per shape bucket (``fullgraph=True``, ``dynamic=False``); attention is one opaque node
(`paged_attention_op`). `piecewise_backend` cuts the graph at those nodes with ``split_module``:
everything between two attentions (o_proj, residual, RMSNorm, gate_up + SiLU*mul, down, residual,
the next RMSNorm, fused QKV, RoPE) becomes one piece compiled by ``torch.compile``'s "spyre" backend
into a device Program; the attention nodes stay in the outer graph and run between the pieces, as one
paged-attention kernel launch per layer (or, with the compiler's ``attention`` rule off, as eager device ops),
each a direct call of the op's function in the outer graph (`inline_attention`).

Identical decoder blocks give identical pieces. Dynamo names a piece's inputs after the layer they
came from (``..._layers_modules_2_...``), so each piece is renamed to positional names before it is
compiled; the compiler's program cache (keyed by graph code and input shapes) then compiles the
first middle piece and hits for every later one: three compiles per bucket however deep the model.

A tensor-parallel rank's graph also holds the row-parallel all-reduces (``spyre_engine::all_reduce_``, one
after ``o_proj`` and one after ``down_proj`` of every layer, one after the vocab-parallel embedding). They are
cut out like attention and run on the host between the pieces (spyreccl moves the values and charges the
card's modeled collective time), so each decoder block is three pieces instead of one, still shared by
every layer through the program cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from spyre_lab.engine.parallel.group import COLLECTIVE_FUNCTIONS, is_collective
from spyre_lab.engine.platforms.paged_attention_op import call_directly, is_paged_attention
from spyre_lab.runtime.dynamo_backend import CompiledGraph, spyre_backend


class CompiledPiece(torch.nn.Module):
    """A compiled piece as a submodule of the split graph (FX calls children as modules)."""

    def __init__(self, compiled: CompiledGraph) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args: Any) -> Any:
        return self.compiled(*args)


def canonicalize(gm: fx.GraphModule) -> fx.GraphModule:
    """Rename every node positionally (in0, in1, ..., v0, v1, ...) so that pieces of different layers,
    which differ only in the names Dynamo gave their inputs, have the same code."""
    inputs = values = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node._rename(f"in{inputs}")
            node.target = node.name
            inputs += 1
        elif node.op != "output":
            node._rename(f"v{values}")
            values += 1
    gm.recompile()
    return gm


def runs_between_pieces(node: fx.Node) -> bool:
    """Does this node run on its own between compiled pieces (a paged attention or a collective)?"""
    return is_paged_attention(node) or is_collective(node)


def split_at_host_calls(gm: fx.GraphModule) -> fx.GraphModule:
    """The graph as a sequence of submodules: pieces, then each node that runs between pieces (a paged attention or
    a collective, `runs_between_pieces`) alone, then pieces, ..."""
    partition, current = {}, 0
    for node in gm.graph.nodes:
        if runs_between_pieces(node):
            partition[node] = current + 1
            current += 2
        elif node.op not in ("placeholder", "output"):
            partition[node] = current
    return split_module(gm, None, lambda node: partition[node], keep_original_order=True)


def piecewise_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> fx.GraphModule:
    """A ``torch.compile`` backend: split at attention, compile each piece with the "spyre" backend.

    ``kwargs`` (e.g. ``options={"fusion": [...]}``) are passed on to the spyre backend."""
    split = split_at_host_calls(gm)
    # a piece's inputs are named after the graph nodes feeding them: the model's own inputs and weights
    # get the real tensors (so spyre_lab.explain(model) finds the pieces that read its parameters),
    # values made inside the graph get the fake tensors Dynamo recorded for them
    real = dict(zip((node.name for node in gm.graph.nodes if node.op == "placeholder"), example_inputs))
    for name, piece in list(split.named_children()):
        if any(runs_between_pieces(node) for node in piece.graph.nodes):
            continue
        example = [real.get(node.name, node.meta.get("example_value")) for node in piece.graph.nodes
                   if node.op == "placeholder"]
        setattr(split, name, CompiledPiece(spyre_backend(canonicalize(piece), example, **kwargs)))
    return inline_attention(split)


def inline_attention(split: fx.GraphModule) -> fx.GraphModule:
    """Put each attention submodule's call into the outer graph, as a direct call of the op's function
    (`paged_attention_op.call_directly`): between two pieces the step then calls the attention itself, not a
    submodule that calls the op through the dispatcher (measured: ~130 us of host time per layer and step)."""
    graph = split.graph
    for node in list(graph.nodes):
        sub = getattr(split, node.target) if node.op == "call_module" else None
        if not isinstance(sub, fx.GraphModule) or not any(runs_between_pieces(n) for n in sub.graph.nodes):
            continue
        env = dict(zip((n for n in sub.graph.nodes if n.op == "placeholder"), node.args, strict=True))
        with graph.inserting_before(node):
            for inner in sub.graph.nodes:
                if inner.op == "output":
                    result = fx.map_arg(inner.args[0], env.__getitem__)
                elif inner.op != "placeholder":
                    env[inner] = copied = graph.node_copy(inner, env.__getitem__)
                    if is_paged_attention(copied):
                        call_directly(copied)
                    elif is_collective(copied):
                        copied.target = COLLECTIVE_FUNCTIONS[copied.target]
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        delattr(split, node.target)
    graph.lint()
    split.recompile()
    return split


def compiled_pieces(split: fx.GraphModule) -> list[CompiledGraph]:
    """The compiled pieces of a split graph, in call order."""
    return [m.compiled for m in split.children() if isinstance(m, CompiledPiece)]
