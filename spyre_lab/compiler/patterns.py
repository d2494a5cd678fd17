"""The matchers and join tests the rules table (:mod:`~spyre_lab.compiler.rules`) points at.

Each function reads the graph through the scheduler ``s`` (its producer/user maps and reads) and answers
one question: is this node the start of a softmax or an MLP, may this node join this group. None of them
changes the graph; the scheduler (:mod:`~spyre_lab.compiler.fusion`) acts on their answers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spyre_lab.compiler.access import Read
from spyre_lab.compiler.ir import IRNode, MatMul, Reduction


@dataclass
class Match:
    """What a pattern matcher found: the graph nodes it claims, and the nodes its kernel holds (for attention,
    one Attention node standing for all its members)."""

    members: list[IRNode]
    kernel_nodes: list[IRNode]


@dataclass(frozen=True)
class FusionChoice:
    """One cost-based choice: the nodes a rule could fuse, the modeled price of each option, and the one taken."""

    rule: str
    nodes: tuple[str, ...]
    taken: str
    prices_us: dict[str, float]

    @property
    def taken_us(self) -> float:
        return self.prices_us[self.taken]

    @property
    def cheapest_rejected_us(self) -> float:
        return min((t for name, t in self.prices_us.items() if name != self.taken), default=math.inf)


# --- join tests: which pairs a join rule judges, and whether it lets them fuse ---------------------

def always(s, group: Sequence[IRNode], node: IRNode) -> bool:
    return True


def has_matmul(s, group: Sequence[IRNode], node: IRNode) -> bool:
    return any(isinstance(n, MatMul) for n in group)


def has_reduction(s, group: Sequence[IRNode], node: IRNode) -> bool:
    return any(isinstance(n, Reduction) for n in [*group, node])


def epilogue_admits(s, group: Sequence[IRNode], node: IRNode) -> bool:
    """A pointwise op over the matmul's output rows, unless it leads into a reduction (then it is that
    reduction's prologue, when ``reduction_fusion`` is on)."""
    if isinstance(node, Reduction) or rows(node) != rows(group[0]):
        return False
    return not ("reduction_fusion" in s.rules and s.feeds_reduction(node))


def layout_preserving(r: Read) -> bool:
    """A view that only regroups outer dims keeps the sticks where they are: safe inside a kernel."""
    if r.is_identity:
        return True
    m = r.meta
    return m.is_contiguous() and m.storage_offset() == 0 and m.dim() > 0


def rows(node: IRNode) -> int:
    """Rows of a node's iteration space (everything but the innermost dim): fused nodes must agree."""
    if isinstance(node, MatMul):
        return node.b * node.m
    sizes = list(node.dims.values())
    return math.prod(sizes[:-1]) if sizes else 1


# --- softmax -----------------------------------------------------------------------------------------

def softmax_nodes(s, amax: IRNode) -> list[IRNode] | None:
    """amax -> sub -> exp -> sum -> div over one row (the exp and sum not read elsewhere), or None."""
    if not (isinstance(amax, Reduction) and amax.op == "amax"):
        return None
    x = s.reads(amax)[0]
    sub = next((u for u in s.users_of(amax) if u.op == "sub" and u.inputs == (x.buffer, amax.output)
                and s.read_of(u, x.buffer) == x), None)                # x - max, not max - x
    if sub is None or not s.only_user(amax.output, sub):
        return None
    exp = single_user(s, sub, "exp")
    red = single_user(s, exp, "sum", allow_more=True) if exp else None
    if red is None or red.reduction_dims != amax.reduction_dims:
        return None
    div = next((u for u in s.users_of(red) if u.op == "div"), None)
    if div is None or div.inputs != (exp.output, red.output):          # exp / sum, not sum / exp
        return None
    if not {u.name for u in s.users_of(exp)} <= {red.name, div.name}:
        return None
    if exp.output in s.graph_outputs or red.output in s.graph_outputs:
        return None
    return [amax, sub, exp, red, div]


def match_softmax(s, node: IRNode) -> Match | None:
    group = softmax_nodes(s, node)
    return Match(group, group) if group is not None else None


def staged_softmax(s, group: list[IRNode]) -> list[tuple[list[IRNode], str]]:
    """The softmax with its rule off: max | sub-exp-sum | div, as the other rules that are on allow."""
    amax, sub, exp, red, div = group
    middle: list[tuple[list[IRNode], str]]
    if "reduction_fusion" in s.rules:
        middle = [([sub, exp, red], "reduction_fusion")]
    elif "pointwise_chain" in s.rules:
        middle = [([sub, exp], "pointwise_chain"), ([red], "single")]
    else:
        middle = [([sub], "single"), ([exp], "single"), ([red], "single")]
    return [([amax], "single"), *middle, ([div], "single")]


def single_user(s, node: IRNode, op: str, allow_more: bool = False) -> IRNode | None:
    """The user of ``node`` running ``op`` that reads it in place (and its only user unless ``allow_more``)."""
    users = s.users_of(node)
    hit = [u for u in users if u.op == op and s.internal_edge(u, node.output)]
    if not hit or (len(users) != 1 and not allow_more) or node.output in s.graph_outputs:
        return None
    return hit[0]


# --- the MLP -------------------------------------------------------------------------------------------

def match_mlp(s, gate: IRNode) -> Match | None:
    """gate and up matmuls reading one input, SiLU(gate) * up, and the down matmul when it follows and fits."""
    if not isinstance(gate, MatMul):
        return None
    silu = single_user(s, gate, "silu")
    mul = single_user(s, silu, "mul") if silu is not None else None
    if mul is None:
        return None
    other = next((b for b in mul.inputs if b != silu.output), None)
    up = s.producer.get(other)
    a_gate = s.reads(gate)[0]
    if not isinstance(up, MatMul) or up is gate or s.reads(up)[0].buffer != a_gate.buffer:
        return None
    if not (s.only_user(up.output, mul) and s.internal_edge(mul, up.output)):
        return None
    group = [gate, up, silu, mul]
    down = next((u for u in s.users_of(mul) if isinstance(u, MatMul)), None)
    if (down is not None and s.only_user(mul.output, down) and s.reads(down)[0].buffer == mul.output
            and s.internal_edge(down, mul.output) and s.fits_bundle([*group, down])):
        group.append(down)
    return Match(group, group) if s.fits_bundle(group) else None


def choose_mlp(s, group: list[IRNode]) -> list[IRNode] | None:
    """Keep the fused MLP only where the model says it is faster than the kernels the other rules would form.

    Fusion keeps gate, up and their product in LX, but LX caps the rows a tile holds, and every row tile
    re-reads the core's weight slice: at large M separate matmuls (each reading its weight once per
    row tile of its own, larger tiles) win. With a down projection a third option is weighed: gate, up,
    SiLU and mul fused, the down matmul on its own. Returns the nodes to fuse under ``mlp`` (None: none).
    """
    options: dict[str, tuple[list[IRNode], list[tuple[list[IRNode], str]]]] = {"fused": (group, [(group, "mlp")])}
    if len(group) == 5:
        options["fused without down"] = (group[:4], [(group[:4], "mlp"), *s.separate_groups(group[4:])])
    options["separate"] = ([], s.separate_groups(group))
    times = {name: s.estimate_us(parts) for name, (_, parts) in options.items()}
    best = min(times, key=lambda name: times[name])             # ties keep the more fused option
    why_not = [s.unplannable[key] for _, parts in options.values() for nodes, _ in parts
               if (key := tuple(n.name for n in nodes)) in s.unplannable]
    s.decisions[group[0].name] = ("mlp: " + " vs ".join(f"{name} {t:.0f} us" for name, t in times.items())
                                  + f" -> {best} (modeled)" + "".join(f"; {w}" for w in why_not))
    s.choices.append(FusionChoice("mlp", tuple(n.name for n in group), best, times))
    return options[best][0] or None
