"""Each claim is an ablation that changes only its named options, and each effect points the documented way."""

import itertools

import pytest

from spyre_lab.studies import claims as C
from spyre_lab.studies.granite8b import StepConfig


def _option_names(changed):
    return set(changed)


@pytest.fixture(scope="module")
def softmax():
    return C.softmax_claim()


def test_softmax_ladder_changes_only_the_lx_planning_options(softmax):
    assert _option_names(softmax.changed) == {"compile.lx_pin_reductions", "compile.lx_in_place",
                                              "compile.lx_clone_inputs"}


def test_each_lx_planning_step_makes_softmax_no_slower(softmax):
    ladder = [r["time_us"] for r in softmax.rows[:len(C.SOFTMAX_LADDER)]]
    assert all(a >= b for a, b in itertools.pairwise(ladder))
    assert ladder[0] > ladder[-1]                                  # planning as a whole helps
    staged = next(r for r in softmax.rows if "not fused" in r["point"])
    assert staged["kernels"] > 1 and staged["time_us"] > ladder[-1]
    assert "4 cores" in softmax.note and softmax.rows[-1]["point"].startswith("4 cores")


def test_claims_are_deterministic(softmax):
    assert C.softmax_claim().to_dict() == softmax.to_dict()


def test_matmul_claim_changes_only_the_work_division():
    claim = C.matmul_claim()
    assert _option_names(claim.changed) == {"compile.work_division"}
    prefill = [r for r in claim.rows if not r["shape"].split()[1].startswith("1x")]
    assert prefill and all(r["planned_us"] <= r["naive_us"] * 1.0001 for r in prefill)
    assert claim.ratio > 1 and "DRAM" in claim.note


def test_mlp_scheduler_never_picks_a_slower_option():
    claim = C.mlp_claim()
    assert _option_names(claim.changed) == {"compile.fusion"}
    assert claim.before_options["compile.fusion"] == sorted(set(claim.after_options["compile.fusion"]) - {"mlp"})
    for r in claim.rows:
        assert r["chosen_us"] <= r["unfused_us"] * 1.0001
        assert r["choice"].startswith("mlp:") and "->" in r["choice"]


def test_waterfall_switches_one_mechanism_per_stage():
    stages = [step for _, step in C.WATERFALL]
    assert stages[-1] == StepConfig()
    assert stages[0] == StepConfig(compile_blocks=False, transpose_weights=False, dispatch="rebuild", overlap=False,
                                   attention_kernel=False)
    for before, after in itertools.pairwise(stages):
        assert len(after.differs_from(before)) == 1


def test_engine_claims_from_a_waterfall_change_only_the_step_options():
    from spyre_lab.studies.granite8b import StepTiming

    fake = [(label, step, {b: StepTiming(100.0 - 10 * i, 50.0, 40.0, 10, 40) for b in C.ENGINE_BUCKETS})
            for i, (label, step) in enumerate(C.WATERFALL)]
    end = C.PUBLISHED_STACK - 1
    assert 0 < end < len(C.WATERFALL) - 1 and not C.WATERFALL[end][1].attention_kernel
    for claim in C.engine_claims(fake):
        # the claim is all off vs the published stack: the attention kernel beyond it is an extra row
        assert _option_names(claim.changed) == {"step.compile_blocks", "step.transpose_weights", "step.dispatch",
                                                "step.overlap"}
        assert claim.ratio == pytest.approx(100.0 / (100.0 - 10 * end))
        assert sum(r["share"] for r in claim.rows[:end + 1]) == pytest.approx(1.0)
        assert len(claim.rows) == len(C.WATERFALL) and "beyond the published stack" in claim.rows[-1]["stage"]


def test_portable_study_runs_the_same_engine_with_native_layers():
    from spyre_lab.studies.portable import portable_overhead

    result = portable_overhead(repeats=1, new_tokens=4, sizes={"tiny": (64, 1, 4, 2, 128)})
    (size,) = result.sizes
    assert size.same_tokens                                         # same weights, same greedy tokens
    assert size.portable_tok_s > 0 and size.native_fwd_us > 0
    assert result.forward_overhead == pytest.approx(size.forward_ratio - 1)
