"""The scheduler's prices: modeled kernel times for the choices a fusion rule weighs, and the record of each.

A rule that may cost time (the fused MLP, a matmul epilogue) asks codegen to plan every option and the
analytic simulator to time it; the scheduler takes the cheapest (ties fuse). Each choice is kept as a
:class:`FusionChoice` so a test (and a learner) can check that no fusion was taken at a higher price.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from spyre_lab.compiler.ir import IRNode, NodeGroup
from spyre_lab.compiler.patterns import FusionChoice
from spyre_lab.device.isa import LXOverflowError


def estimate_us(s, parts: Sequence[tuple[list[IRNode], str]], views: bool = False) -> float:
    """Modeled time (analytic, launch included) of running ``parts`` as kernels, inf if one cannot be planned;
    each plan is kept on ``s`` so the kernel that wins is not planned twice.
    ``views``: plan each part with the views its nodes read through, as the final kernel will be."""
    from spyre_lab.compiler.codegen import generate_kernel

    total = 0.0
    for nodes, rule in parts:
        key = tuple(n.name for n in nodes) + (("+views",) if views else ())
        if key in s.unplannable:
            return math.inf
        if key not in s.estimated:
            ins, outs, lx = s.dram_tensors(nodes)
            seen = {n.name: s.input_views(n) for n in nodes} if views else {}
            kernel = NodeGroup(f"{rule}_{nodes[0].output}", list(nodes), rule, ins, outs, lx, input_views=seen)
            try:
                s.estimated[key] = generate_kernel(kernel, s.graph.buffers, s.cfg, s.options)
            except (LXOverflowError, ValueError, NotImplementedError) as e:
                s.unplannable[key] = f"{kernel.name} cannot be planned ({type(e).__name__}: {e})"
                return math.inf
        total += s.estimated[key].simulate("analytic").time_us
    return total


def choose_join(s, rule: str, group: Sequence[IRNode], group_rule: str, node: IRNode) -> bool:
    """Take ``node`` into ``group``'s kernel only where the model prices that no higher than the kernel as it
    is plus ``node`` in a kernel of its own (ties fuse; a fused kernel that cannot be planned is taken only
    when the pair apart cannot be planned either). A matmul epilogue saves a DRAM round trip, but it can cost
    the matmul its best division: at decode (M = 1) a SiLU reading one half of a merged gate_up output ties
    the matmul's split to the epilogue's."""
    fused = estimate_us(s, [([*group, node], rule)], views=True)
    apart = estimate_us(s, [(list(group), group_rule), ([node], "single")], views=True)
    take = fused <= apart or math.isinf(apart)
    s.choices.append(FusionChoice(rule, tuple(n.name for n in [*group, node]), "fused" if take else "separate",
                                  {"fused": fused, "separate": apart}))
    if not take:
        s.join_notes[node.name] = (f"{rule}: fused {fused:.1f} us vs separate {apart:.1f} us "
                                   f"-> {node.op} in a kernel of its own (modeled)")
    return take
