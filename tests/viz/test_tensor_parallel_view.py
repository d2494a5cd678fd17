"""TensorParallelView draws each TP size's compute under its collectives, per bucket, from the study's rows.

The rows are the study's own ``TPRow`` with the modeled collectives of ``step_collectives`` (the card link in
force) and compute values given here (timing the 8B shape would take the study's half a minute)."""

from __future__ import annotations

import pytest

from spyre_lab.distributed import card_link, set_card_link
from spyre_lab.studies.granite8b import GRANITE_3_3_8B
from spyre_lab.studies.tensor_parallel import TPRow, step_collectives
from spyre_lab.viz import TensorParallelView, style

COMPUTE_US = {("decode", 1): 90_000.0, ("prefill", 256): 120_000.0}


def _rows() -> list[TPRow]:
    latency = card_link().latency_us
    rows = []
    for k in (1, 2, 4, 8):
        for (kind, size), compute in COMPUTE_US.items():
            costs = step_collectives(GRANITE_3_3_8B, k, kind, size)
            rows.append(TPRow(k, kind, size, compute / k, sum(c.us for c in costs), len(costs), 0,
                              sum(c.rounds * latency for c in costs)))
    return rows


def test_bars_are_compute_under_collectives_per_tp_in_the_unit_colors() -> None:
    rows = _rows()
    view = TensorParallelView(rows)
    assert view.bucket == "decode 1" and view.buckets == ["decode 1", "prefill 256"]
    compute, collectives = view.figure.data
    assert list(compute.x) == ["TP 1", "TP 2", "TP 4", "TP 8"]
    decode = [r for r in rows if r.kind == "decode"]
    assert list(compute.y) == pytest.approx([r.compute_us / 1e3 for r in decode])
    assert list(collectives.y) == pytest.approx([r.collective_us / 1e3 for r in decode])
    assert collectives.marker.color == style.UNIT_COLORS["link"]
    assert compute.marker.color == style.STEP_KIND_COLORS["decode"]
    shares = [a.text for a in view.figure.layout.annotations if a.name == "share"]
    assert shares[0] == "0.0% collectives, 1.00x faster" and shares[-1].startswith(f"{decode[-1].collective_share:.1%}")
    assert "(estimate)" in view.caption and "fastest at TP 8" in view.caption


def test_the_bucket_toggle_redraws_the_live_figure() -> None:
    view = TensorParallelView(_rows())
    view.controls["bucket"].value = "prefill 256"
    assert list(view.fig_widget.data[0].y) == pytest.approx([120.0 / k for k in (1, 2, 4, 8)])
    assert view.fig_widget.data[0].marker.color == style.STEP_KIND_COLORS["prefill"]
    compute, collectives = view.fig_widget.data
    if compute.marker.color == collectives.marker.color:   # prefill's color is the link's: the hatch tells them apart
        assert collectives.marker.pattern.shape and not compute.marker.pattern.shape


def test_caption_names_the_link_the_rows_were_made_with_and_bad_input_is_named() -> None:
    previous = set_card_link(latency_us=50.0)
    try:
        slow = _rows()
        view = TensorParallelView(slow)
    finally:
        set_card_link(latency_us=previous.latency_us)
    assert "50.0 us per message" in view.caption and "fastest at TP 1" not in TensorParallelView(_rows()).caption
    with pytest.raises(ValueError, match="needs rows"):
        TensorParallelView([])
    with pytest.raises(ValueError, match="no bucket 'decode 4'"):
        TensorParallelView(slow, bucket="decode 4")
