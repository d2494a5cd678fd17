"""Fidelity: the plot agrees with its control (markers move with the machine) and its values are the study's."""

import json
import math

import plotly.graph_objects as go
import pytest

from spyre_lab.studies.fidelity import BANDS, fidelity
from spyre_lab.viz import Fidelity
from spyre_lab.viz.fidelity import SCHEMA


@pytest.fixture(scope="module")
def result():
    return fidelity()


def _markers(data):
    return [t for t in data if t.meta and "machine" in t.meta]


def _positions(data):
    """{(machine, key): (x, y)} of every marker drawn."""
    out = {}
    for t in _markers(data):
        for key, x, y in zip(t.meta["keys"], t.x, t.y, strict=True):
            out[(t.meta["machine"], key)] = (x, y)
    return out


def test_markers_are_the_study_values_on_both_machines(result):
    fig = Fidelity(result).figure
    go.Figure(fig.to_dict())   # plotly's validators accept what the view builds unvalidated
    drawn = _positions(fig.data)
    assert len(drawn) == 2 * len(result["points"])
    for row in result["points"]:
        for machine in ("measured", "datasheet"):
            assert drawn[(machine, row["key"])] == (row["reference_us"], row["modeled_us"][machine])


def test_the_machine_toggle_moves_the_markers_and_not_the_axes(result):
    view = Fidelity(result)
    axes = (view.fig_widget.layout.xaxis.range, view.fig_widget.layout.yaxis.range)
    for machine in ("measured", "datasheet"):
        view.controls["machine"].value = machine
        data = view.fig_widget.data
        assert {t.meta["machine"] for t in _markers(data)} == {machine}
        assert machine in view.fig_widget.layout.title.text and machine in view.caption
        drawn = _positions(data)
        assert drawn == {(machine, r["key"]): (r["reference_us"], r["modeled_us"][machine])
                         for r in result["points"]}
        assert (view.fig_widget.layout.xaxis.range, view.fig_widget.layout.yaxis.range) == axes
        assert not any(t.name == "one kernel on both machines" for t in data)
    moved = [r["key"] for r in result["points"] if r["modeled_us"]["measured"] != r["modeled_us"]["datasheet"]]
    assert moved, "the two machines model at least one point differently"
    view.controls["machine"].value = "both"
    assert {t.meta["machine"] for t in _markers(view.fig_widget.data)} == {"measured", "datasheet"}
    assert any(t.name == "one kernel on both machines" for t in view.fig_widget.data)


def test_hover_names_the_point_its_source_and_error(result):
    view = Fidelity(result, machine="datasheet")
    for t in _markers(view.figure.data):
        for key, text in zip(t.meta["keys"], t.hovertext, strict=True):
            row = next(r for r in result["points"] if r["key"] == key)
            assert row["label"] in text
            assert ("measured on the card" if row["kind"] == "measured" else "fitted cost model") in text
            assert f"{row['error_pct']['datasheet']:+.1f}%" in text
    kinds = {r["kind"] for r in result["points"]}
    assert kinds == {"measured", "fitted"}


def test_colored_by_category_with_the_category_band(result):
    view = Fidelity(result)
    fig = view.figure
    by_category = {}
    for t in _markers(fig.data):
        by_category.setdefault(t.meta["category"], set()).add(t.marker.color)
    assert set(by_category) == set(result["categories"])
    assert all(len(colors) == 1 for colors in by_category.values())
    assert len({next(iter(c)) for c in by_category.values()}) == len(by_category), "one color per category"
    bands = {t.meta["category"]: t for t in fig.data if t.meta and "band_pct" in t.meta}
    assert set(bands) == {c for c, v in result["categories"].items() if v["band_pct"] is not None}
    for cat, band in bands.items():
        assert band.meta["band_pct"] == BANDS[cat]
        upper = band.y[0] / band.x[0] - 1
        lower = 1 - band.y[2] / band.x[2]
        assert math.isclose(upper, BANDS[cat] / 100) and math.isclose(lower, BANDS[cat] / 100)
        refs = [r["reference_us"] for r in result["points"] if r["category"] == cat]
        assert min(band.x) < min(refs) and max(band.x) > max(refs)
    diagonal = fig.data[0]
    assert list(diagonal.x) == list(diagonal.y)
    lo, hi = fig.layout.xaxis.range
    every = [v for r in result["points"] for v in (r["reference_us"], *r["modeled_us"].values())]
    assert 10 ** lo < min(every) and 10 ** hi > max(every)


def test_table_and_saved_json(result, tmp_path):
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps(result))
    view = Fidelity.from_json(path, machine="measured")
    assert view.machines == ["measured"]
    table = view.table()
    assert [row["point"] for row in table] == [r["label"] for r in result["points"]]
    assert [row["measured_error_pct"] for row in table] == [r["error_pct"]["measured"] for r in result["points"]]
    assert _positions(view.figure.data) == _positions(Fidelity(result, machine="measured").figure.data)


def test_bad_input_says_what_to_pass(result, tmp_path):
    with pytest.raises(ValueError, match=SCHEMA):
        Fidelity({"schema": "something else"})
    with pytest.raises(ValueError, match="machine must be one of"):
        Fidelity(result, machine="card")
    with pytest.raises(FileNotFoundError, match="spyre-lab fidelity --json"):
        Fidelity(tmp_path / "missing.json")


def test_the_live_figure_is_the_built_one_after_every_toggle_sent_once(result):
    from spyre_lab.viz.base import widget_safe

    view = Fidelity(result, machine="measured")
    sent = []
    view.fig_widget.output.observe(lambda change: sent.append(change["new"]), names="outputs")
    for machine in ("both", "datasheet", "both", "measured"):
        view.controls["machine"].value = machine
        live = [{k: v for k, v in t.items() if k != "uid"} for t in view.fig_widget.to_plotly_json()["data"]]
        assert live == widget_safe(view.build()).to_plotly_json()["data"], machine   # no property left over
    assert len(sent) == 4, "one figure sent per toggle"
