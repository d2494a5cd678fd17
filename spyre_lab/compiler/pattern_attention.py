"""The attention pattern: ``Q K^T`` -> score ops -> softmax -> ``P V`` recognised as one :class:`Attention` node.

The ``attention`` row of the rules table (:mod:`~spyre_lab.compiler.rules`) points here. The matcher walks
the region between the two matmuls, checks that every node in it is a score op, a piece of the softmax or
SDPA's masked-row test, and builds the node whose online-softmax compute replaces them all.
"""

from __future__ import annotations

import math

import torch

from spyre_lab.compiler.access import Access, Read, compose
from spyre_lab.compiler.constant_facts import all_zero
from spyre_lab.compiler.ir import IRNode, MatMul, Pointwise, Reduction
from spyre_lab.compiler.patterns import Match, layout_preserving, softmax_nodes
from spyre_lab.compiler.tiling_attention import Attention, online_attention


def match_attention_group(s, node: IRNode) -> Match | None:
    """The rules table's matcher: the Attention node starting at ``node`` (its ``Q K^T``), claiming its members."""
    att = match_attention(s, node)
    return Match(att.members, [att]) if att is not None else None


_MASK_BRANCH_OPS = {"eq", "ne", "logical_not", "any", "all", "isinf", "cast"}
"""Ops that may sit beside the score chain in SDPA's "a row with every score masked gives 0" test; never score ops."""


def masked_row_test(s, cond: str, scores: str, keys: tuple[str, ...]) -> list[IRNode] | None:
    """The nodes of ``cond = not any(not (scores == -inf))`` over ``keys``: SDPA's "every key of this row is masked"
    test, which the online softmax answers by ``l == 0``; None for any other condition (it then runs as written).

    The ``-inf`` the comparison holds is read by running the node on a probe, so only that constant matches."""
    chain: list[IRNode] = []
    for op in ("logical_not", "any", "logical_not", "eq"):
        node = s.producer.get(cond)
        if node is None or node.op != op or len(node.inputs) != 1:
            return None
        if op == "any" and not (isinstance(node, Reduction) and node.reduction_dims == keys):
            return None
        chain.append(node)
        cond = node.inputs[0]
    probe = torch.tensor([-math.inf, -6.0e4, 0.0, math.inf])
    equal = s.lowered.access[chain[-1].name].op_fn(probe)
    if cond != scores or equal.tolist() != [True, False, False, False]:
        return None
    return chain


def _region(s, mm1: MatMul, mm2: MatMul) -> list[IRNode] | None:
    """Nodes from ``mm1`` to ``mm2`` (descendants of one and ancestors of the other, plus dead ends hanging off
    them), in program order; None if one of them is read outside the region or is a graph output."""
    lo, hi = s.position[mm1.name], s.position[mm2.name]
    nodes = s.graph.nodes[lo:hi + 1]
    down = {mm1.name}
    for n in nodes[1:]:
        if any(s.producer.get(b) is not None and s.producer[b].name in down for b in n.inputs):
            down.add(n.name)
    up = {mm2.name}
    for n in reversed(nodes):
        if n.name in up:
            up |= {s.producer[b].name for b in n.inputs if b in s.producer}
    members = [n for n in nodes if n.name in down and (n.name in up or not s.users_of(n))]
    names = {n.name for n in members}
    for n in members:
        if n is mm2:
            continue
        if n.output in s.graph_outputs or any(u.name not in names for u in s.users_of(n)):
            return None
    return members


def match_attention(s, mm1: IRNode) -> Attention | None:
    """``mm1 = Q @ K^T`` -> pointwise score ops -> softmax (amax, sub, exp, sum, div) -> [casts, SDPA's masked-row
    where] -> ``mm2 = P @ V``, all over one ``[*batch, M, N]`` score space: the Attention node replacing them."""
    if not isinstance(mm1, MatMul):
        return None
    after = s.graph.nodes[s.position[mm1.name] + 1:]
    amax = next((n for n in after if isinstance(n, Reduction) and n.op == "amax"), None)
    soft = softmax_nodes(s, amax) if amax is not None else None
    if soft is None or amax.reduction_dims != (list(amax.dims)[-1],):      # a softmax over the keys only
        return None
    div = soft[-1]
    mm2 = next((n for n in after if isinstance(n, MatMul) and s.position[n.name] > s.position[div.name]), None)
    if mm2 is None:
        return None
    members = _region(s, mm1, mm2)
    if members is None or not {n.name for n in soft} <= {n.name for n in members}:
        return None
    b, m, n = mm1.b, mm1.m, mm1.n
    if (mm2.b, mm2.m, mm2.k) != (b, m, n):
        return None
    score_shape = s.graph.buffers[amax.inputs[0]].shape
    if len(score_shape) < 2 or tuple(score_shape[-2:]) != (m, n) or math.prod(score_shape[:-2]) != b:
        return None
    # score chain: mm1 -> ... -> softmax input, one pointwise op after another
    chain: list[IRNode] = []
    cur = mm1.output
    x = amax.inputs[0]
    member_names, soft_names = {q.name for q in members}, {q.name for q in soft}   # names: IRNode == is deep
    while cur != x:
        nxt = [u for u in s.users_of(s.producer[cur]) if u.name != amax.name and isinstance(u, Pointwise)
               and u.op not in _MASK_BRANCH_OPS - {"cast"} and u.name in member_names
               and u.name not in soft_names]
        if len(nxt) != 1 or tuple(s.graph.buffers[nxt[0].output].shape) != tuple(score_shape):
            return None
        if sum(1 for bname in nxt[0].inputs if bname == cur) != 1:
            return None
        chain.append(nxt[0])
        cur = nxt[0].output
    # after the softmax: casts and the masked-row where, up to mm2's A operand
    zero_rows = False
    p_buf = div.output
    chain_names = {q.name for q in chain}
    rest = [q for q in members if q is not mm1 and q is not mm2 and q.name not in soft_names
            and q.name not in chain_names]
    test_names: set[str] = set()
    for q in rest:
        if q.op == "where" and p_buf in q.inputs:
            zero = next((c for c in q.inputs if c in s.lowered.constants), None)
            test = masked_row_test(s, q.inputs[0], x, amax.reduction_dims)
            if zero is None or not all_zero(s.lowered.constants[zero]) or q.inputs[-1] != p_buf or test is None:
                return None
            zero_rows, p_buf = True, q.output
            test_names |= {t.name for t in test}
        elif q.op == "cast" and q.inputs == (p_buf,) and q.name != "" and s.users_of(q):
            p_buf = q.output
        elif q.op not in _MASK_BRANCH_OPS:
            return None
    if any(q.op in _MASK_BRANCH_OPS - {"cast"} and q.name not in test_names for q in rest):
        return None                                         # a comparison that is not the masked-row test
    if mm2.inputs[0] != p_buf or s.read_of(mm2, p_buf) is None or not layout_preserving(s.read_of(mm2, p_buf)):
        return None
    if any(s.read_of(c, bname) is not None and not layout_preserving(s.read_of(c, bname))
           for c in [*chain, amax] for bname in c.inputs if bname in {mm1.output, *(q.output for q in chain)}):
        return None
    return _attention_node(s, mm1, mm2, chain, members, zero_rows, score_shape)


def _attention_node(s, mm1: MatMul, mm2: MatMul, chain: list[IRNode], members: list[IRNode],
                    zero_rows: bool, score_shape: tuple[int, ...]) -> Attention:
    """Build the node, its reads (Q, K^T, V, then each extra as a [B, M, N] view) and its online-softmax compute."""
    b, m, n = mm1.b, mm1.m, mm1.n
    acc1, acc2 = s.lowered.access[mm1.name], s.lowered.access[mm2.name]
    reads = [acc1.reads[0], acc1.reads[1], acc2.reads[1]]
    produced = {q.output for q in members}
    extra_reads: list[Read] = []
    slots: list[list[int | None]] = []       # per chain node: index into extras of each input (None: the chain)
    for c in chain:
        row: list[int | None] = []
        for r in s.lowered.access[c.name].reads:
            if r.buffer in produced:
                row.append(None)
                continue
            steps = (*r.steps, (torch.ops.aten.expand.default, (list(score_shape),)),
                     (torch.ops.aten.reshape.default, ([b, m, n],)))
            meta = r.meta.expand(score_shape).reshape(b, m, n)
            extra_reads.append(Read(r.buffer, steps, meta, ("B", "M", "N")))
            row.append(len(extra_reads) - 1)
        slots.append(row)
    fns = [s.lowered.access[c.name].op_fn for c in chain]
    out_dtype = s.graph.buffers[mm2.output].dtype

    def score_fn(tile: torch.Tensor, extras: list[torch.Tensor]) -> torch.Tensor:
        t = tile
        for fn, row in zip(fns, slots):
            t = fn(*(t if i is None else extras[i] for i in row))
        return t

    def op_fn(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, *extras: torch.Tensor) -> torch.Tensor:
        return online_attention(q, kt, v, extras, score_fn, zero_rows, out_dtype)

    all_reads = [*reads, *extra_reads]
    const_extras = {r.buffer: r.apply(s.lowered.constants[r.buffer]) for r in extra_reads
                    if r.buffer in s.lowered.constants}
    additive = all(c.op in ("add", "mul", "div", "cast") for c in chain)
    node = Attention(f"attention_{mm2.name}", "attention", tuple(r.buffer for r in all_reads), mm2.output,
                     {"B": b, "M": m, "N": n, "K": mm1.k, "E": mm2.n}, compose(all_reads, op_fn),
                     reduction_dims=("N", "K"), stick_dim="E", members=list(members),
                     score_ops=tuple(c.op for c in chain), extras=tuple(r.buffer for r in extra_reads),
                     const_extras=const_extras, additive_only=additive, zero_masked_rows=zero_rows,
                     reads=tuple(all_reads))
    s.lowered.access[node.name] = Access(all_reads, ("B", "M", "E"), op_fn)
    s.decisions[node.name] = (f"attention: {len(members)} nodes ({' -> '.join(dict.fromkeys(q.op for q in members))}) "
                              "as one online-softmax kernel; the [B, M, N] scores stay in LX")
    return node
