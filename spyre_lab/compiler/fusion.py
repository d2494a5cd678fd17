"""The scheduler: LoopIR nodes -> ``NodeGroup``s (Inductor's ``Scheduler`` + torch-spyre's ``spyre_fuse_nodes``).

A fused kernel is one SuperDSC bundle: its inputs and outputs travel through DRAM, everything it
produces and consumes itself stays in the cores' LX scratchpads. Rules (names from
``options.FUSION_RULES``, each switchable):

* ``attention``: ``Q K^T`` -> score ops (scale, additive or causal mask) -> softmax -> ``P V`` (SDPA's
  decomposition or the hand-written form) becomes one :class:`~spyre_lab.compiler.tiling_attention.Attention`
  node: an online-softmax kernel whose score matrix stays in LX. Off, the softmax and matmul rules apply.
* ``softmax``: amax -> sub -> exp -> sum -> div over one row, all five in one kernel. Off, the
  staged form of the torch-spyre study is used: max | sub-exp-sum | div, through DRAM.
* ``mlp``: gate and up matmuls sharing their input, SiLU, multiply, and the down matmul when it
  follows -- only x, the weights and the result touch DRAM. Cost-based: the fused kernel is kept
  only when its modeled time beats the kernels the other rules would form (at large M it does not).
* ``matmul_epilogue``: pointwise ops on a matmul's output (bias, residual add, scale) in the matmul kernel.
* ``reduction_fusion``: pointwise prologue into a reduction and its epilogue after it (RMSNorm, LayerNorm).
* ``pointwise_chain``: producer -> consumer pointwise ops.

Hard boundaries: host fallbacks, restickify kernels, the bundle limit of
``max_bundle_tensors`` unique DRAM tensors, and iteration spaces that do not share rows.
Nodes join in program order, like torch-spyre's consecutive bundling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from spyre_lab.compiler.access import Lowered, Read, compose
from spyre_lab.compiler.ir import Fallback, Graph, InputView, IRNode, MatMul, NodeGroup, Pointwise, Reduction
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.tiling_attention import Attention, online_attention
from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.isa import LXOverflowError

if TYPE_CHECKING:
    from spyre_lab.compiler.kernel_spec import KernelSpec


def _rows(node: IRNode) -> int:
    """Rows of a node's iteration space (everything but the innermost dim): fused nodes must agree."""
    if isinstance(node, MatMul):
        return node.b * node.m
    sizes = list(node.dims.values())
    return math.prod(sizes[:-1]) if sizes else 1


def _layout_preserving(r: Read) -> bool:
    """A view that only regroups outer dims keeps the sticks where they are: safe inside a kernel."""
    if r.is_identity:
        return True
    m = r.meta
    return m.is_contiguous() and m.storage_offset() == 0 and m.dim() > 0


class _Scheduler:
    def __init__(self, lowered: Lowered, options: CompileOptions, cfg: SpyreConfig) -> None:
        self.lowered = lowered
        self.graph: Graph = lowered.graph
        self.options = options
        self.cfg = cfg
        self.decisions: dict[str, str] = {}                    # node name -> why its kernel looks the way it does
        self.estimated: dict[tuple[str, ...], KernelSpec] = {}  # node names -> the spec a cost estimate planned
        self.unplannable: dict[tuple[str, ...], str] = {}       # node names -> why codegen could not plan them
        self.rules = options.fusion
        self.producer = {n.output: n for n in self.graph.nodes}
        self.users: dict[str, list[IRNode]] = {}
        for n in self.graph.nodes:
            for b in dict.fromkeys(n.inputs):
                self.users.setdefault(b, []).append(n)
        self.graph_outputs = {r.buffer for r in lowered.outputs} | {v.buffer for _, v in lowered.mutations}
        self.position = {n.name: i for i, n in enumerate(self.graph.nodes)}

    # --- helpers --------------------------------------------------------------------------------
    def reads(self, node: IRNode) -> list[Read]:
        return self.lowered.access[node.name].reads

    def only_user(self, buffer: str, user: IRNode) -> bool:
        return buffer not in self.graph_outputs and all(u is user for u in self.users.get(buffer, []))

    def read_of(self, node: IRNode, buffer: str) -> Read | None:
        return next((r for r in self.reads(node) if r.buffer == buffer), None)

    def internal_edge(self, consumer: IRNode, buffer: str) -> bool:
        r = self.read_of(consumer, buffer)
        return r is not None and _layout_preserving(r)

    def users_of(self, node: IRNode) -> list[IRNode]:
        return self.users.get(node.output, [])

    def dram_tensors(self, nodes: Sequence[IRNode]) -> tuple[list[str], list[str], list[str]]:
        produced = {n.output for n in nodes}
        members = {n.name for n in nodes}
        inputs = list(dict.fromkeys(b for n in nodes for b in n.inputs if b not in produced))
        outputs, lx = [], []
        for n in nodes:
            external = n.output in self.graph_outputs or any(u.name not in members for u in self.users_of(n))
            (outputs if external else lx).append(n.output)
        return inputs, outputs, lx

    def fits_bundle(self, nodes: Sequence[IRNode]) -> bool:
        ins, outs, _ = self.dram_tensors(nodes)
        return len(set(ins) | set(outs)) <= self.options.max_bundle_tensors

    # --- patterns -------------------------------------------------------------------------------
    def match_softmax(self, amax: IRNode) -> list[IRNode] | None:
        if not (isinstance(amax, Reduction) and amax.op == "amax"):
            return None
        x = self.reads(amax)[0]
        sub = next((u for u in self.users_of(amax) if u.op == "sub" and self.read_of(u, x.buffer) == x), None)
        if sub is None or not self.only_user(amax.output, sub):
            return None
        exp = self._single_user(sub, "exp")
        red = self._single_user(exp, "sum", allow_more=True) if exp else None
        if red is None or red.reduction_dims != amax.reduction_dims:
            return None
        div = next((u for u in self.users_of(red) if u.op == "div"), None)
        if div is None or set(div.inputs) != {exp.output, red.output}:
            return None
        if not {u.name for u in self.users_of(exp)} <= {red.name, div.name}:
            return None
        if exp.output in self.graph_outputs or red.output in self.graph_outputs:
            return None
        return [amax, sub, exp, red, div]

    def _single_user(self, node: IRNode, op: str, allow_more: bool = False) -> IRNode | None:
        users = self.users_of(node)
        hit = [u for u in users if u.op == op and self.internal_edge(u, node.output)]
        if not hit or (len(users) != 1 and not allow_more) or node.output in self.graph_outputs:
            return None
        return hit[0]

    def match_mlp(self, gate: IRNode) -> list[IRNode] | None:
        if not isinstance(gate, MatMul):
            return None
        silu = self._single_user(gate, "silu")
        if silu is None:
            return None
        mul = self._single_user(silu, "mul")
        if mul is None:
            return None
        other = next((b for b in mul.inputs if b != silu.output), None)
        up = self.producer.get(other)
        a_gate = self.reads(gate)[0]
        if not isinstance(up, MatMul) or up is gate or self.reads(up)[0].buffer != a_gate.buffer:
            return None
        if not (self.only_user(up.output, mul) and self.internal_edge(mul, up.output)):
            return None
        group = [gate, up, silu, mul]
        down = next((u for u in self.users_of(mul) if isinstance(u, MatMul)), None)
        if (down is not None and self.only_user(mul.output, down) and self.reads(down)[0].buffer == mul.output
                and self.internal_edge(down, mul.output) and self.fits_bundle([*group, down])):
            group.append(down)
        return group if self.fits_bundle(group) else None

    # --- cost-based choice ------------------------------------------------------------------------
    def separate_groups(self, nodes: Sequence[IRNode]) -> list[tuple[list[IRNode], str]]:
        """The kernels the other rules form from ``nodes`` alone (greedy bundling in program order)."""
        groups: list[_Group] = []
        group_of: dict[str, int] = {}
        for n in sorted(nodes, key=lambda n: self.position[n.name]):
            if not self.join(groups, group_of, n):
                groups.append(_Group([n], "single", True))
                group_of[n.output] = len(groups) - 1
        return [(g.nodes, g.rule) for g in groups]

    def estimate_us(self, parts: Sequence[tuple[list[IRNode], str]]) -> float:
        """Modeled time of running ``parts`` as kernels (inf if one of them cannot be planned): what
        ``codegen.estimate_us`` computes, keeping each plan so the kernel that wins is not planned twice."""
        from spyre_lab.compiler.codegen import generate_kernel

        total = 0.0
        for nodes, rule in parts:
            key = tuple(n.name for n in nodes)
            if key in self.unplannable:
                return math.inf
            if key not in self.estimated:
                ins, outs, lx = self.dram_tensors(nodes)
                kernel = NodeGroup(f"{rule}_{nodes[0].output}", list(nodes), rule, ins, outs, lx)
                try:
                    self.estimated[key] = generate_kernel(kernel, self.graph.buffers, self.cfg, self.options)
                except (LXOverflowError, ValueError, NotImplementedError) as e:
                    self.unplannable[key] = f"{kernel.name} cannot be planned ({type(e).__name__}: {e})"
                    return math.inf
            total += self.estimated[key].simulate("analytic").time_us
        return total

    def choose_mlp(self, group: list[IRNode]) -> list[IRNode] | None:
        """Keep the fused MLP only where the model says it is faster than the kernels the other rules would form.

        Fusion keeps gate, up and their product in LX, but LX caps the rows a tile holds, and every row tile
        re-reads the core's weight slice: at large M separate matmuls (each reading its weight once per
        row tile of its own, larger tiles) win. With a down projection a third option is weighed: gate, up,
        SiLU and mul fused, the down matmul on its own. Returns the nodes to fuse under ``mlp`` (None: none).
        """
        options: dict[str, tuple[list[IRNode], list[tuple[list[IRNode], str]]]] = {"fused": (group, [(group, "mlp")])}
        if len(group) == 5:
            options["fused without down"] = (group[:4], [(group[:4], "mlp"), *self.separate_groups(group[4:])])
        options["separate"] = ([], self.separate_groups(group))
        times = {name: self.estimate_us(parts) for name, (_, parts) in options.items()}
        best = min(times, key=lambda name: times[name])             # ties keep the more fused option
        why_not = [self.unplannable[key] for _, parts in options.values() for nodes, _ in parts
                   if (key := tuple(n.name for n in nodes)) in self.unplannable]
        self.decisions[group[0].name] = ("mlp: " + " vs ".join(f"{name} {t:.0f} us" for name, t in times.items())
                                         + f" -> {best} (modeled)" + "".join(f"; {w}" for w in why_not))
        return options[best][0] or None

    def schedulable(self, group: list[IRNode]) -> bool:
        """A pattern group runs at its last member's position: outside users of its outputs must come later."""
        last = max(self.position[n.name] for n in group)
        members = {n.name for n in group}
        for n in group:
            for u in self.users_of(n):
                if u.name not in members and self.position[u.name] < last:
                    return False
        return True

    # --- greedy bundling --------------------------------------------------------------------------
    def join_rule(self, group: list[IRNode], node: IRNode) -> str | None:
        """The rule under which ``node`` may join ``group`` (None: start a new kernel)."""
        if isinstance(node, (Fallback, MatMul)) or node.op == "restickify":
            return None
        if any(isinstance(n, Fallback) or n.op == "restickify" for n in group):
            return None
        if not any(b in {n.output for n in group} and self.internal_edge(node, b) for b in node.inputs):
            return None
        if _rows(node) != _rows(group[0]) and not isinstance(group[0], MatMul):
            return None
        has_mm = any(isinstance(n, MatMul) for n in group)
        reductions = sum(isinstance(n, Reduction) for n in [*group, node])
        if has_mm:
            if isinstance(node, Reduction) or _rows(node) != _rows(group[0]):
                return None
            if "reduction_fusion" in self.rules and self.feeds_reduction(node):
                return None
            rule = "matmul_epilogue"
        elif reductions:
            rule = "reduction_fusion"
        else:
            rule = "pointwise_chain"
        if rule not in self.rules or not self.fits_bundle([*group, node]):
            return None
        return rule

    def join(self, groups: list[_Group], group_of: dict[str, int], node: IRNode) -> bool:
        """Join ``node`` to the latest open group that produces one of its inputs, if a rule allows it and
        every other input is ready by then (the node moves up to that kernel)."""
        candidates = sorted({group_of[b] for b in node.inputs if b in group_of}, reverse=True)
        for gi in candidates:
            g = groups[gi]
            if not g.open:
                continue
            if any(group_of.get(b, -1) > gi for b in node.inputs):
                continue
            rule = self.join_rule(g.nodes, node)
            if rule is None:
                continue
            g.nodes.append(node)
            g.rule = rule if g.rule == "single" else _combine(g.rule, rule)
            group_of[node.output] = gi
            return True
        return False

    def feeds_reduction(self, node: IRNode, depth: int = 4) -> bool:
        """Does ``node`` lead (through pointwise ops) into a reduction? Then it is that reduction's prologue."""
        frontier = [node]
        for _ in range(depth):
            frontier = [u for n in frontier for u in self.users_of(n) if isinstance(u, (Pointwise, Reduction))]
            if any(isinstance(u, Reduction) for u in frontier):
                return True
        return False

    def align_epilogue_dims(self, nodes: list[IRNode]) -> None:
        """Name an epilogue's dims after the matmul's output dims (d0, d1 -> M, N), so a core's M/N slice
        of the matmul is also its slice of the epilogue."""
        mm = next(n for n in nodes if isinstance(n, MatMul))
        out_names = self.lowered.access[mm.name].out_axes
        out_shape = self.graph.buffers[mm.output].shape
        for n in nodes:
            if not isinstance(n, Pointwise) or self.graph.buffers[n.output].shape != out_shape:
                continue
            rename = dict(zip(n.dims, out_names))
            access = self.lowered.access[n.name]
            n.dims = {rename[d]: size for d, size in n.dims.items()}
            n.stick_dim = rename.get(n.stick_dim, n.stick_dim)
            access.reads = [Read(r.buffer, r.steps, r.meta, tuple(rename.get(a, a) for a in r.axes))
                            for r in access.reads]
            access.out_axes = tuple(rename.get(a, a) for a in access.out_axes)

    def staged_softmax(self, group: list[IRNode]) -> list[tuple[list[IRNode], str]]:
        amax, sub, exp, red, div = group
        middle: list[tuple[list[IRNode], str]]
        if "reduction_fusion" in self.rules:
            middle = [([sub, exp, red], "reduction_fusion")]
        elif "pointwise_chain" in self.rules:
            middle = [([sub, exp], "pointwise_chain"), ([red], "single")]
        else:
            middle = [([sub], "single"), ([exp], "single"), ([red], "single")]
        return [([amax], "single"), *middle, ([div], "single")]

    def run(self) -> tuple[list[NodeGroup], dict[str, KernelSpec]]:
        """The kernels in launch order, and the specs cost estimates already planned for some of them."""
        patterns, claimed = self.match_patterns()
        groups = self.bundle(patterns, claimed)
        for g in groups:
            if g.rule == "matmul_epilogue":
                self.align_epilogue_dims(g.nodes)
        return self.kernels(groups)

    def match_patterns(self) -> tuple[dict[str, tuple[list[IRNode], str]], set[str]]:
        """Softmax and MLP groups, keyed by the member they run at (their last), and every node they claim."""
        patterns: dict[str, tuple[list[IRNode], str]] = {}
        claimed: set[str] = set()
        if "attention" in self.rules:
            for node in list(self.graph.nodes):
                att = match_attention(self, node)
                if att is None or any(n.name in claimed for n in att.members):
                    continue
                patterns[att.members[-1].name] = ([att], "attention")
                claimed |= {n.name for n in att.members}
        for node in self.graph.nodes:
            if node.name in claimed:
                continue
            for rule, matcher in (("softmax", self.match_softmax), ("mlp", self.match_mlp)):
                group = matcher(node)
                if group is None or any(n.name in claimed for n in group) or not self.schedulable(group):
                    continue
                if rule == "mlp":
                    if rule not in self.rules:
                        continue
                    group = self.choose_mlp(group)
                    if group is None:
                        continue
                last = max(group, key=lambda n: self.position[n.name])
                patterns[last.name] = (group, rule)
                claimed |= {n.name for n in group}
                break
        return patterns, claimed

    def bundle(self, patterns: dict[str, tuple[list[IRNode], str]], claimed: set[str]) -> list[_Group]:
        """Walk the nodes in program order: pattern groups land whole, every other node joins a group or opens one."""
        groups: list[_Group] = []
        group_of: dict[str, int] = {}                           # buffer -> index of the group producing it

        def add(nodes: list[IRNode], rule: str, open_: bool) -> None:
            groups.append(_Group(list(nodes), rule, open_))
            for n in nodes:
                group_of[n.output] = len(groups) - 1

        for node in self.graph.nodes:
            if node.name in patterns:
                group, prule = patterns[node.name]
                if prule == "softmax" and "softmax" not in self.rules:
                    for nodes, rule in self.staged_softmax(group):
                        add(nodes, rule, False)
                else:
                    add(group, prule, False)
                continue
            if node.name in claimed:
                continue
            if self.join(groups, group_of, node):
                continue
            add([node], "restickify" if node.op == "restickify" else "single", True)
        return groups

    def kernels(self, groups: list[_Group]) -> tuple[list[NodeGroup], dict[str, KernelSpec]]:
        """Name each group's kernel, say how each node reads its inputs, and keep the MLP specs already planned."""
        kernels = []
        planned: dict[str, KernelSpec] = {}
        for i, g in enumerate(groups):
            nodes, rule = g.nodes, (g.rule if len(g.nodes) > 1 or g.rule in ("restickify", "attention") else "single")
            ins, outs, lx = self.dram_tensors(nodes)
            if len(nodes) == 1 and nodes[0].op == "restickify":
                rule = "restickify"
            name = f"k{i}_{rule}_{'_'.join(dict.fromkeys(n.op for n in nodes))}"[:64]
            decision = next((self.decisions[n.name] for n in nodes if n.name in self.decisions), "")
            views = {n.name: self.input_views(n) for n in nodes}
            kernels.append(NodeGroup(name, list(nodes), rule, ins, outs, lx, decision, input_views=views))
            spec = self.estimated.get(tuple(n.name for n in nodes))
            if spec is not None and rule == "mlp" and spec.rule == rule:
                spec.name = spec.tile_kernel.name = name
                planned[name] = spec
        return kernels, planned

    def input_views(self, node: IRNode) -> tuple[InputView | None, ...]:
        access = self.lowered.access.get(node.name)
        return tuple(_view_of(r) for r in access.reads) if access is not None else ()


# --- the attention pattern ---------------------------------------------------------------------------

_MASK_BRANCH_OPS = {"eq", "ne", "logical_not", "any", "all", "isinf", "cast"}
"""Ops of SDPA's "a row with every score masked gives 0" test, which the online softmax answers by ``l == 0``."""


def _region(s: _Scheduler, mm1: MatMul, mm2: MatMul) -> list[IRNode] | None:
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


def match_attention(s: _Scheduler, mm1: IRNode) -> Attention | None:
    """``mm1 = Q @ K^T`` -> pointwise score ops -> softmax (amax, sub, exp, sum, div) -> [casts, SDPA's masked-row
    where] -> ``mm2 = P @ V``, all over one ``[*batch, M, N]`` score space: the Attention node replacing them."""
    if not isinstance(mm1, MatMul):
        return None
    after = s.graph.nodes[s.position[mm1.name] + 1:]
    amax = next((n for n in after if isinstance(n, Reduction) and n.op == "amax"), None)
    soft = s.match_softmax(amax) if amax is not None else None
    if soft is None:
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
    while cur != x:
        nxt = [u for u in s.users_of(s.producer[cur]) if u.name != amax.name and isinstance(u, Pointwise)
               and u.op not in _MASK_BRANCH_OPS - {"cast"} and u.name in {q.name for q in members}
               and u not in soft]
        if len(nxt) != 1 or tuple(s.graph.buffers[nxt[0].output].shape) != tuple(score_shape):
            return None
        if sum(1 for bname in nxt[0].inputs if bname == cur) != 1:
            return None
        chain.append(nxt[0])
        cur = nxt[0].output
    # after the softmax: casts and the masked-row where, up to mm2's A operand
    zero_rows = False
    p_buf = div.output
    soft_names = {q.name for q in soft}
    rest = [q for q in members if q is not mm1 and q is not mm2 and q.name not in soft_names and q not in chain]
    for q in rest:
        if q.op == "where" and p_buf in q.inputs:
            zero = next((c for c in q.inputs if c in s.lowered.constants), None)
            if zero is None or not bool((s.lowered.constants[zero] == 0).all()) or q.inputs[-1] != p_buf:
                return None
            zero_rows, p_buf = True, q.output
        elif q.op == "cast" and q.inputs == (p_buf,) and q.name != "" and s.users_of(q):
            p_buf = q.output
        elif q.op not in _MASK_BRANCH_OPS:
            return None
    if mm2.inputs[0] != p_buf or s.read_of(mm2, p_buf) is None or not _layout_preserving(s.read_of(mm2, p_buf)):
        return None
    if any(s.read_of(c, bname) is not None and not _layout_preserving(s.read_of(c, bname))
           for c in [*chain, amax] for bname in c.inputs if bname in {mm1.output, *(q.output for q in chain)}):
        return None
    return _attention_node(s, mm1, mm2, chain, members, zero_rows, score_shape)


def _attention_node(s: _Scheduler, mm1: MatMul, mm2: MatMul, chain: list[IRNode], members: list[IRNode],
                    zero_rows: bool, score_shape: tuple[int, ...]) -> Attention:
    """Build the node, its reads (Q, K^T, V, then each extra as a [B, M, N] view) and its online-softmax compute."""
    from spyre_lab.compiler.access import Access

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


def _view_of(r: Read) -> InputView | None:
    """What codegen needs of a read through views (None for a plain read of the whole buffer)."""
    if r.is_identity:
        return None
    return InputView(tuple(r.meta.shape), tuple(r.meta.stride()), r.meta.storage_offset(), tuple(r.axes))


@dataclass
class _Group:
    nodes: list[IRNode]
    rule: str
    open: bool                      # pattern groups and staged softmax pieces take no more nodes


def _combine(current: str, joined: str) -> str:
    """A group keeps its most specific rule: matmul_epilogue > reduction_fusion > pointwise_chain."""
    order = ["pointwise_chain", "reduction_fusion", "matmul_epilogue"]
    return max(current, joined, key=order.index)


@dataclass
class Schedule:
    """The scheduler's answer: the kernels in launch order, and the ones a cost estimate already planned."""

    kernels: list[NodeGroup]
    planned: dict[str, KernelSpec]
    """Kernel name -> the KernelSpec its cost estimate planned (a fused MLP), for codegen to reuse."""


def schedule(lowered: Lowered, options: CompileOptions, cfg: SpyreConfig = SPYRE) -> Schedule:
    """Group the lowered nodes into fused kernels, in an order that respects every dependency.

    ``cfg`` is the device the cost-based choices (fused or separate MLP) are modeled on."""
    kernels, planned = _Scheduler(lowered, options, cfg).run()
    return Schedule(kernels, planned)
