"""docs/fidelity.md is what `spyre-lab fidelity --markdown` prints today, and the measured machine keeps its goals."""

from pathlib import Path

import pytest

from spyre_lab.studies.fidelity import GOALS, SCHEMA, fidelity, fitted_us, spearman, to_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"


@pytest.fixture(scope="module")
def result():
    return fidelity()


def test_docs_fidelity_md_is_current(result):
    assert DOC.read_text() == to_markdown(result), (
        "docs/fidelity.md is stale: regenerate it with `spyre-lab fidelity --markdown > docs/fidelity.md`")


def test_fitted_reference_restates_the_worked_example():
    tensor = 4096 * 2048 * 2  # the softmax example moves one 16.8 MB read and one 16.8 MB write
    assert fitted_us(tensor, tensor) == pytest.approx(320.0, rel=0.005)
    assert 2 * tensor / (fitted_us(tensor, tensor) * 1e3) == pytest.approx(105, rel=0.01)  # GB/s balanced


def test_measured_machine_meets_the_goals_where_its_mechanisms_reach(result):
    cats = result["categories"]
    for cat in ("pointwise", "broadcast", "transport", "matmul, row-tiled"):
        assert cats[cat]["rms_pct"]["measured"] <= GOALS[cat], cat
        assert cats[cat]["rms_pct"]["measured"] < cats[cat]["rms_pct"]["datasheet"], cat
    assert result["schema"] == SCHEMA and result["modeled"] is True
    rungs = {r["key"]: r for r in result["points"]}
    for key in ("ladder_3", "ladder_4"):  # the rungs whose bytes a fused softmax must move
        assert abs(rungs[key]["error_pct"]["measured"]) < abs(rungs[key]["error_pct"]["datasheet"])


def test_spearman_orders_and_ties():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)
