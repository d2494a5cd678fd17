"""The scheduler: LoopIR nodes -> ``NodeGroup``s (Inductor's ``Scheduler`` + torch-spyre's ``spyre_fuse_nodes``).

A fused kernel is one SuperDSC bundle: its inputs and outputs travel through DRAM, everything it
produces and consumes itself stays in the cores' LX scratchpads. The rules are data: one row each in
:data:`~spyre_lab.compiler.rules.RULES` (name, kind, matcher, tiling family, what it does), each
switchable through ``CompileOptions.fusion``. This module is the driver that runs them:

1. pattern rules, stage by stage (``attention`` first, then ``softmax`` and ``mlp``): a matcher claims a
   whole group, which lands as one kernel at its last member (the MLP only where the model prices it lowest);
2. join rules, node by node in program order (``matmul_epilogue``, ``reduction_fusion``, ``pointwise_chain``):
   a node joins the latest group producing one of its inputs when the first rule that claims the pair
   admits it (a matmul epilogue only where the model prices the fused kernel no higher than the two apart);
3. naming: each group becomes a :class:`~spyre_lab.compiler.ir.NodeGroup` with its rule and its views.

Every priced choice is kept in :attr:`Schedule.choices`.

Hard boundaries: host fallbacks, restickify kernels, the bundle limit of
``max_bundle_tensors`` unique DRAM tensors, and iteration spaces that do not share rows.
Nodes join in program order, like torch-spyre's consecutive bundling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spyre_lab.compiler.access import Lowered, Read
from spyre_lab.compiler.fusion_cost import choose_join, estimate_us
from spyre_lab.compiler.ir import Fallback, Graph, InputView, IRNode, MatMul, NodeGroup, Pointwise, Reduction
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.patterns import FusionChoice, layout_preserving, rows
from spyre_lab.compiler.rules import BY_NAME, JOIN_RULES, PATTERN_RULES, combine
from spyre_lab.device.config import SPYRE, SpyreConfig

if TYPE_CHECKING:
    from spyre_lab.compiler.kernel_spec import KernelSpec


class _Scheduler:
    """The driver: runs the pattern rules of :data:`~spyre_lab.compiler.rules.RULES`, then bundles every other
    node under the join rules, and names the kernels. The rules themselves are rows of that table."""

    def __init__(self, lowered: Lowered, options: CompileOptions, cfg: SpyreConfig) -> None:
        self.lowered = lowered
        self.graph: Graph = lowered.graph
        self.options = options
        self.cfg = cfg
        self.decisions: dict[str, str] = {}                    # node name -> why its kernel looks the way it does
        self.join_notes: dict[str, str] = {}                   # node name -> why it left a priced join
        self.estimated: dict[tuple[str, ...], KernelSpec] = {}  # node names -> the spec a cost estimate planned
        self.unplannable: dict[tuple[str, ...], str] = {}       # node names -> why codegen could not plan them
        self.choices: list[FusionChoice] = []                   # every priced choice, in the order it was made
        self.rules = options.fusion
        self.producer = {n.output: n for n in self.graph.nodes}
        self.users: dict[str, list[IRNode]] = {}
        for n in self.graph.nodes:
            for b in dict.fromkeys(n.inputs):
                self.users.setdefault(b, []).append(n)
        self.graph_outputs = {r.buffer for r in lowered.outputs} | {v.buffer for _, v in lowered.mutations}
        self.position = {n.name: i for i, n in enumerate(self.graph.nodes)}

    # --- what the matchers read -------------------------------------------------------------------
    def reads(self, node: IRNode) -> list[Read]:
        return self.lowered.access[node.name].reads

    def only_user(self, buffer: str, user: IRNode) -> bool:
        return buffer not in self.graph_outputs and all(u is user for u in self.users.get(buffer, []))

    def read_of(self, node: IRNode, buffer: str) -> Read | None:
        return next((r for r in self.reads(node) if r.buffer == buffer), None)

    def internal_edge(self, consumer: IRNode, buffer: str) -> bool:
        r = self.read_of(consumer, buffer)
        return r is not None and layout_preserving(r)

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

    def feeds_reduction(self, node: IRNode, depth: int = 4) -> bool:
        """Does ``node`` lead (through pointwise ops) into a reduction? Then it is that reduction's prologue."""
        frontier = [node]
        for _ in range(depth):
            frontier = [u for n in frontier for u in self.users_of(n) if isinstance(u, (Pointwise, Reduction))]
            if any(isinstance(u, Reduction) for u in frontier):
                return True
        return False

    def schedulable(self, group: list[IRNode]) -> bool:
        """A pattern group runs at its last member's position: outside users of its outputs must come later."""
        last = max(self.position[n.name] for n in group)
        members = {n.name for n in group}
        for n in group:
            for u in self.users_of(n):
                if u.name not in members and self.position[u.name] < last:
                    return False
        return True

    # --- prices (fusion_cost) -----------------------------------------------------------------------
    def estimate_us(self, parts: Sequence[tuple[list[IRNode], str]], views: bool = False) -> float:
        return estimate_us(self, parts, views)

    def separate_groups(self, nodes: Sequence[IRNode]) -> list[tuple[list[IRNode], str]]:
        """The kernels the join rules form from ``nodes`` alone (greedy bundling in program order)."""
        groups: list[_Group] = []
        group_of: dict[str, int] = {}
        for n in sorted(nodes, key=lambda n: self.position[n.name]):
            if not self.join(groups, group_of, n):
                groups.append(_Group([n], "single", True))
                group_of[n.output] = len(groups) - 1
        return [(g.nodes, g.rule) for g in groups]

    # --- pattern rules --------------------------------------------------------------------------------
    def match_patterns(self) -> tuple[dict[str, tuple[list[IRNode], str]], set[str]]:
        """Every pattern rule's groups, stage by stage, keyed by the member they run at (their last), and every
        node they claim. Within a stage a node is offered to the rules in table order; the first match wins."""
        patterns: dict[str, tuple[list[IRNode], str]] = {}
        claimed: set[str] = set()
        for stage in sorted({r.stage for r in PATTERN_RULES}):
            rules = [r for r in PATTERN_RULES if r.stage == stage and (r.name in self.rules or r.expand_off)]
            for node in list(self.graph.nodes):
                if node.name in claimed:
                    continue
                for r in rules:
                    found = r.matcher(self, node)
                    if found is None or any(n.name in claimed for n in found.members):
                        continue
                    if r.ordered and not self.schedulable(found.members):
                        continue
                    members, kernel_nodes = found.members, found.kernel_nodes
                    if r.chooser is not None:
                        members = kernel_nodes = r.chooser(self, members)
                        if members is None:
                            continue
                    last = max(members, key=lambda n: self.position[n.name])
                    patterns[last.name] = (kernel_nodes, r.name)
                    claimed |= {n.name for n in members}
                    break
        return patterns, claimed

    # --- join rules -------------------------------------------------------------------------------------
    def join_rule(self, group: list[IRNode], node: IRNode) -> str | None:
        """The rule under which ``node`` may join ``group`` (None: start a new kernel). Hard boundaries first
        (host fallbacks, restickify, matmuls start kernels, rows must agree, the read must be in place), then
        the first join rule that claims the pair decides."""
        if isinstance(node, (Fallback, MatMul)) or node.op == "restickify":
            return None
        if any(isinstance(n, Fallback) or n.op == "restickify" for n in group):
            return None
        if not any(b in {n.output for n in group} and self.internal_edge(node, b) for b in node.inputs):
            return None
        if rows(node) != rows(group[0]) and not isinstance(group[0], MatMul):
            return None
        r = next(r for r in JOIN_RULES if r.claims(self, group, node))
        if not r.admits(self, group, node) or r.name not in self.rules or not self.fits_bundle([*group, node]):
            return None
        return r.name

    def join(self, groups: list[_Group], group_of: dict[str, int], node: IRNode) -> bool:
        """Join ``node`` to the latest open group that produces one of its inputs, if a rule allows it (and, for a
        priced rule, the model prices it no higher) and every other input is ready by then (the node moves up)."""
        candidates = sorted({group_of[b] for b in node.inputs if b in group_of}, reverse=True)
        for gi in candidates:
            g = groups[gi]
            if not g.open:
                continue
            if any(group_of.get(b, -1) > gi for b in node.inputs):
                continue
            name = self.join_rule(g.nodes, node)
            if name is None or (BY_NAME[name].priced and not choose_join(self, name, g.nodes, g.rule, node)):
                continue
            g.nodes.append(node)
            g.rule = name if g.rule == "single" else combine(g.rule, name)
            group_of[node.output] = gi
            return True
        return False

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
                if prule not in self.rules and BY_NAME[prule].expand_off is not None:
                    for nodes, rule in BY_NAME[prule].expand_off(self, group):
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

    # --- the kernels ------------------------------------------------------------------------------------
    def run(self) -> tuple[list[NodeGroup], dict[str, KernelSpec]]:
        """The kernels in launch order, and the specs cost estimates already planned for some of them."""
        patterns, claimed = self.match_patterns()
        groups = self.bundle(patterns, claimed)
        for g in groups:
            if g.rule == "matmul_epilogue":
                self.align_epilogue_dims(g.nodes)
        return self.kernels(groups)

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

    def kernels(self, groups: list[_Group]) -> tuple[list[NodeGroup], dict[str, KernelSpec]]:
        """Name each group's kernel, say how each node reads its inputs, and keep the specs a chooser planned."""
        kernels = []
        planned: dict[str, KernelSpec] = {}
        for i, g in enumerate(groups):
            nodes = g.nodes
            rule = g.rule if len(nodes) > 1 or BY_NAME[g.rule].alone_keeps_name else "single"
            ins, outs, lx = self.dram_tensors(nodes)
            if len(nodes) == 1 and nodes[0].op == "restickify":
                rule = "restickify"
            name = f"k{i}_{rule}_{'_'.join(dict.fromkeys(n.op for n in nodes))}"[:64]
            decision = next((self.decisions[n.name] for n in nodes if n.name in self.decisions), "")
            if not decision and not any(isinstance(n, MatMul) for n in nodes):
                decision = next((self.join_notes[n.name] for n in nodes if n.name in self.join_notes), "")
            views = {n.name: self.input_views(n) for n in nodes}
            kernels.append(NodeGroup(name, list(nodes), rule, ins, outs, lx, decision, input_views=views))
            spec = self.estimated.get(tuple(n.name for n in nodes))
            if spec is not None and BY_NAME[rule].reuses_estimate and spec.rule == rule:
                spec.name = spec.tile_kernel.name = name
                planned[name] = spec
        return kernels, planned

    def input_views(self, node: IRNode) -> tuple[InputView | None, ...]:
        access = self.lowered.access.get(node.name)
        return tuple(_view_of(r) for r in access.reads) if access is not None else ()


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


@dataclass
class Schedule:
    """The scheduler's answer: the kernels in launch order, and the ones a cost estimate already planned."""

    kernels: list[NodeGroup]
    planned: dict[str, KernelSpec]
    """Kernel name -> the KernelSpec its cost estimate planned (a fused MLP), for codegen to reuse."""
    choices: list[FusionChoice] = field(default_factory=list)
    """Every cost-based choice the scheduler made (fused or separate MLP, each matmul epilogue), with its prices."""


def schedule(lowered: Lowered, options: CompileOptions, cfg: SpyreConfig = SPYRE) -> Schedule:
    """Group the lowered nodes into fused kernels, in an order that respects every dependency.

    ``cfg`` is the device the cost-based choices (fused or separate MLP) are modeled on."""
    scheduler = _Scheduler(lowered, options, cfg)
    kernels, planned = scheduler.run()
    return Schedule(kernels, planned, scheduler.choices)
