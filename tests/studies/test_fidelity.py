"""docs/fidelity.md is what `spyre-lab fidelity --markdown` prints today, and the measured machine keeps its goals."""

from pathlib import Path

import pytest

from spyre_lab.studies import fidelity as F
from spyre_lab.studies import fidelity_mechanisms
from spyre_lab.studies.fidelity import GOALS, SCHEMA, fidelity, fitted_us, spearman, to_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
PROBE_CALLS: list[int] = []


@pytest.fixture(scope="module")
def result():
    """A plain fidelity() (as the demo, the report and the view call it), counting mechanism-probe runs."""
    real = fidelity_mechanisms.probes
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fidelity_mechanisms, "probes", lambda: PROBE_CALLS.append(1) or real())
        return fidelity()


def test_a_plain_fidelity_call_runs_no_mechanism_probe(result):
    assert PROBE_CALLS == [] and "mechanisms" not in result
    assert "## Mechanisms tried" not in to_markdown(result)


@pytest.mark.parametrize(("flags", "probed"), [((False, False), False), ((True, False), True), ((False, True), True)])
def test_the_command_probes_only_where_it_shows_the_probes(monkeypatch, capsys, result, flags, probed):
    asked = []
    monkeypatch.setattr(F, "fidelity", lambda mechanisms=False: asked.append(mechanisms) or
                        {**result, **({"mechanisms": []} if mechanisms else {})})
    monkeypatch.setattr(fidelity_mechanisms, "to_markdown", lambda rows: ["## Mechanisms tried"])
    assert F.main(*flags) == 0
    out = capsys.readouterr().out
    assert asked == [probed]
    assert ('"mechanisms"' in out or "## Mechanisms tried" in out) == probed


def test_docs_fidelity_md_is_current(result):
    shown = {**result, "mechanisms": fidelity_mechanisms.probes()}    # what `--markdown` adds
    assert DOC.read_text() == to_markdown(shown), (
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
