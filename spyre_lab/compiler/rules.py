"""The fusion rules as data: one :class:`Rule` record per rule, the scheduler a driver over this table.

Every rule the compiler knows is a row of :data:`RULES` -- its name, its kind, how it recognises its
nodes, which tiling family plans its kernels, and one line saying what it does -- the way tinygrad keeps
its rewrite rules as a list of patterns. :data:`~spyre_lab.compiler.options.FUSION_RULES` (the switchable
names) and :data:`~spyre_lab.compiler.codegen.KNOWN_RULES` (every name a kernel may carry) are read off it.

Three kinds:

* ``pattern``: a matcher recognises a whole group (attention, softmax, MLP) before bundling; the group
  lands as one kernel at its last member. A pattern rule that is off either matches nothing or, with an
  ``expand_off`` hook (softmax), lands as the smaller kernels the other rules form.
* ``join``: greedy bundling in program order. A node may join a group when the first join rule that
  ``claims`` the pair ``admits`` it, the rule is on and the bundle limit holds; a ``priced`` rule also
  asks the cost model (the fused kernel must be modeled no slower than the two apart).
* ``kernel``: names the scheduler gives kernels no rule fused (``single``, ``restickify``); not switchable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from spyre_lab.compiler import patterns
from spyre_lab.compiler.ir import MatMul
from spyre_lab.compiler.pattern_attention import match_attention_group

if TYPE_CHECKING:
    from spyre_lab.compiler.ir import IRNode, NodeGroup

RuleKind = Literal["pattern", "join", "kernel"]
TilingFamily = Literal["rows", "matmul", "mlp", "attention", "by content"]


@dataclass(frozen=True)
class Rule:
    """One fusion rule: what it is called, how it finds its nodes, and which tiler plans what it forms."""

    name: str
    kind: RuleKind
    tiling: TilingFamily
    """The family whose tiler plans this rule's kernels ("by content": a matmul, else rows)."""
    doc: str
    switchable: bool = True
    # pattern rules: the matcher, whether the group must wait for its last member, and the cost-based chooser
    matcher: Callable[..., patterns.Match | None] | None = None
    stage: int = 1                          # pattern passes run in stage order (attention claims its nodes first)
    ordered: bool = True                    # the group runs at its last member: outside users must come later
    chooser: Callable[..., list[IRNode] | None] | None = None
    expand_off: Callable[..., list[tuple[list[IRNode], str]]] | None = None
    reuses_estimate: bool = False           # the kernel its chooser planned is the kernel codegen keeps
    # join rules: which (group, node) pairs are this rule's to judge, whether it lets them fuse, its rank
    claims: Callable[..., bool] | None = None
    admits: Callable[..., bool] | None = None
    rank: int = 0                           # a group joined under several rules keeps the highest-ranked name
    priced: bool = False
    alone_keeps_name: bool = False          # a one-node kernel keeps this name (otherwise it is "single")


RULES: tuple[Rule, ...] = (
    Rule("single", "kernel", "by content", "one node, one kernel (nothing fused)", switchable=False),
    Rule("pointwise_chain", "join", "rows", "producer -> consumer pointwise ops in one kernel",
         claims=patterns.always, admits=patterns.always, rank=0),
    Rule("reduction_fusion", "join", "rows",
         "a pointwise prologue into a reduction and its epilogue after it (RMSNorm, LayerNorm)",
         claims=patterns.has_reduction, admits=patterns.always, rank=1),
    Rule("matmul_epilogue", "join", "matmul",
         "pointwise ops on a matmul's output (bias, residual add, scale) in the matmul kernel, where the model "
         "prices the fused kernel no slower than the matmul and the op apart",
         claims=patterns.has_matmul, admits=patterns.epilogue_admits, rank=2, priced=True),
    Rule("softmax", "pattern", "rows", "amax -> sub -> exp -> sum -> div over one row in one kernel (off: the "
         "staged max | sub-exp-sum | div of the torch-spyre study)",
         matcher=patterns.match_softmax, expand_off=patterns.staged_softmax),
    Rule("mlp", "pattern", "mlp", "gate and up matmuls sharing their input, SiLU, multiply and the down matmul, "
         "kept only where the model prices it below the kernels the other rules form",
         matcher=patterns.match_mlp, chooser=patterns.choose_mlp, reuses_estimate=True),
    Rule("restickify", "kernel", "rows", "a layout change between two kernels (load and store, no compute)",
         switchable=False, alone_keeps_name=True),
    Rule("attention", "pattern", "attention", "Q K^T -> score ops -> softmax -> P V as one online-softmax kernel "
         "whose scores stay in LX", matcher=match_attention_group, stage=0, ordered=False, alone_keeps_name=True),
)
"""Every rule, in the order the names are listed (and FusionView shows its switches)."""

BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
KNOWN_RULES: tuple[str, ...] = tuple(r.name for r in RULES)
FUSION_RULES: tuple[str, ...] = tuple(r.name for r in RULES if r.switchable)
PATTERN_RULES: tuple[Rule, ...] = tuple(sorted((r for r in RULES if r.kind == "pattern"), key=lambda r: r.stage))
JOIN_RULES: tuple[Rule, ...] = tuple(sorted((r for r in RULES if r.kind == "join"), key=lambda r: -r.rank))
"""Join rules, most specific first: the first that claims a (group, node) pair judges it."""


def rule(name: str) -> Rule:
    """The rule called ``name``, or an error listing the rules."""
    if name not in BY_NAME:
        raise ValueError(f"unknown fusion rule {name!r}; rules are {KNOWN_RULES}")
    return BY_NAME[name]


def tiling_family(kernel: NodeGroup) -> str:
    """Which tiler plans ``kernel``: the rule's own family for attention and MLP kernels, else the content
    decides (two matmuls: the MLP tiler, one: the matmul tiler, none: the row tiler)."""
    family = rule(kernel.rule).tiling
    if family in ("attention", "mlp"):
        return family
    matmuls = sum(isinstance(n, MatMul) for n in kernel.nodes)
    return "mlp" if matmuls >= 2 else "matmul" if matmuls else "rows"


def combine(current: str, joined: str) -> str:
    """A group keeps its most specific join rule's name: matmul_epilogue > reduction_fusion > pointwise_chain."""
    return max(current, joined, key=lambda name: BY_NAME[name].rank)
