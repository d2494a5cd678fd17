"""No planner reads an option in ``NOT_READ_BY_PLANNERS``: the plan memo keys plans without them.

``plan_memo.planning_options`` sets the fusion rules, the timing mode and the bundle limit to one value before a
plan is keyed and planned, so a planner that started to read one would be handed that fixed value and the memo
would hide it. These tests call the planners directly with the options each schedule was made under, and
check that kernels with one key get one plan under every rule set.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from spyre_lab.compiler import codegen, plan_memo
from spyre_lab.compiler.backend import to_aten
from spyre_lab.compiler.codegen_matmul import plan_matmul
from spyre_lab.compiler.examples import granite_layer, layer_inputs
from spyre_lab.compiler.fusion import schedule
from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.layout_propagation import propagate_layouts
from spyre_lab.compiler.lowering import lower
from spyre_lab.compiler.options import FUSION_RULES, CompileOptions
from spyre_lab.device.config import SPYRE
from spyre_lab.device.isa import LXOverflowError

RULE_SETS = [frozenset(c) for r in range(len(FUSION_RULES) + 1) for c in itertools.combinations(FUSION_RULES, r)]
VARIANTS = {"fusion": RULE_SETS, "timing": ("analytic", "event"), "max_bundle_tensors": (6, 3, 2)}
"""Values each unread option takes across the schedules (cycled, so every value meets many rule sets)."""


def variant_options(rule_sets: list[frozenset[str]]) -> list[CompileOptions]:
    """Each fusion rule set under one of the other unread options' values (cycling through them)."""
    others = {f: itertools.cycle(v) for f, v in VARIANTS.items() if f != "fusion"}
    return [CompileOptions(fusion=rules, **{f: next(c) for f, c in others.items()}) for rules in rule_sets]


def plan_digest(spec: KernelSpec) -> tuple:
    """Everything a plan decides, without a buffer or kernel name: division, tiles, LX sizes and every core's ops
    (kinds, sizes, dependencies, peers, broadcasts), which are all the simulator reads."""
    ops = tuple(tuple((op.kind, op.deps, op.out_bytes, op.nbytes, op.m, op.n, op.k, op.elements, op.peer, op.hops,
                       op.share) for op in p) for p in spec.tile_kernel.programs)
    d = spec.division
    return (spec.rule, tuple(spec.ops), d.strategy, tuple(d.splits.items()), d.split_reduction_dim, d.cores_used,
            tuple(spec.tiles.items()), tuple(spec.dims.items()), tuple(tuple(s.items()) for s in spec.slices),
            spec.lx_plan.peak, spec.lx_plan.strategy, tuple(spec.lx_plan.sizes.values()),
            tuple(spec.lx_plan.offsets.values()), ops)


def plans_by_key(fn, inputs: list[torch.Tensor],
                 rule_sets: list[frozenset[str]]) -> dict[tuple, dict[frozenset, tuple]]:
    """Schedule ``fn`` under each rule set; plan each kernel with that schedule's own options, past the memo.
    Returns signature key -> {rule set: plan digest (or the planning error's type)}."""
    aten = to_aten(fn, inputs)
    found: dict[tuple, dict[frozenset, tuple]] = {}
    for options in variant_options(rule_sets):
        lowered = lower(aten)
        propagate_layouts(lowered, SPYRE)
        buffers = lowered.graph.buffers
        for kernel in schedule(lowered, options, SPYRE).kernels:
            if kernel.is_fallback:
                continue
            key = plan_memo.signature(kernel, buffers, SPYRE, plan_memo.planning_options(options))[0]
            try:
                digest = plan_digest(codegen._plan_family(kernel, buffers, SPYRE, options))
            except (LXOverflowError, ValueError, NotImplementedError) as e:
                digest = ("cannot be planned", type(e).__name__)
            found.setdefault(key, {})[options.fusion] = digest
    return found


def disagreements(found: dict[tuple, dict[frozenset, tuple]]) -> list[tuple[frozenset, frozenset, str]]:
    """(rule set, rule set, rule) for each key whose kernels got different plans under two rule sets."""
    bad = []
    for plans in found.values():
        first_rules, first = next(iter(plans.items()))
        bad += [(first_rules, rules, first[0]) for rules, digest in plans.items() if digest != first]
    return bad


def small_layer():
    inputs = layer_inputs(128, 2, 1, 256, 32, "meta")
    return (lambda *a: granite_layer(*a, heads=2, kv_heads=1)), inputs


def test_the_variants_cover_every_option_planners_do_not_read():
    """An option added to NOT_READ_BY_PLANNERS must get values here, or the test below would not vary it."""
    assert set(VARIANTS) == {name for name, _ in plan_memo.NOT_READ_BY_PLANNERS}
    assert all(len(values) > 1 for values in VARIANTS.values())


@pytest.fixture(scope="module")
def layer_plans():
    plan_memo.clear()
    return plans_by_key(*small_layer(), RULE_SETS)


def test_kernels_with_one_key_get_one_plan_under_every_rule_set(layer_plans):
    shared = [plans for plans in layer_plans.values() if len(plans) > 1]
    assert len(shared) >= 5                        # many kernels recur across the rule sets
    assert any(len(plans) == len(RULE_SETS) for plans in shared)    # some appear under every one
    assert disagreements(layer_plans) == []


def test_a_planner_that_reads_a_fusion_rule_is_caught(monkeypatch):
    """The check above is not vacuous: a matmul planner whose double buffering follows the ``mlp`` rule is found,
    and only between rule sets that differ in ``mlp``."""
    def reads_fusion(kernel, buffers, cfg, options):
        return plan_matmul(kernel, buffers, cfg, options.replace(double_buffer="mlp" in options.fusion))

    monkeypatch.setitem(codegen._PLANNERS, "matmul", reads_fusion)
    plan_memo.clear()
    every = frozenset(FUSION_RULES)
    rule_sets = [every, every - {"mlp"}, every - {"softmax"}, frozenset()]
    bad = disagreements(plans_by_key(*small_layer(), rule_sets))
    assert bad and all(("mlp" in a) != ("mlp" in b) for a, b, _ in bad)
