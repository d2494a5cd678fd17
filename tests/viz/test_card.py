"""The card picture is the config it is drawn from: every core, corelet and link, with the config's numbers."""

import plotly.graph_objects as go
import pytest

from spyre_lab import SPYRE
from spyre_lab.viz.card import card_figure, core_positions
from spyre_lab.viz.style import UNIT_COLORS


def _part(fig, name):
    return next(t for t in fig.data if t.meta and t.meta.get("part") == name)


def _polygons(trace) -> int:
    return sum(v is None for v in trace.x)


@pytest.mark.parametrize("cfg", [SPYRE, SPYRE.replace(cores=8, corelets_per_core=1), SPYRE.replace(cores=5)],
                         ids=["spyre", "8x1", "5 cores"])
def test_every_core_and_corelet_is_drawn(cfg):
    fig = card_figure(cfg)
    assert _polygons(_part(fig, "core")) == len(_part(fig, "core").meta["ids"]) == cfg.cores
    assert _polygons(_part(fig, "lx")) == cfg.cores
    for unit in ("pt", "sfu"):
        trace = _part(fig, unit)
        assert _polygons(trace) == cfg.cores * cfg.corelets_per_core
        assert trace.fillcolor == UNIT_COLORS[unit]
    detail = [t for t in fig.data if t.meta and t.meta["part"] == "detail corelet"]
    assert len(detail) == cfg.corelets_per_core
    assert f"{cfg.cores} cores x {cfg.corelets_per_core} corelets" in fig.layout.title.text
    go.Figure(fig.to_plotly_json())


def test_ring_visits_the_cores_in_order_and_closes():
    fig = card_figure(SPYRE)
    ring = _part(fig, "ring")
    spots = core_positions(SPYRE.cores)
    assert list(zip(ring.x, ring.y, strict=True)) == [*spots, spots[0]]
    assert ring.line.color == UNIT_COLORS["ring"]
    # neighbours on the ring are neighbours in the picture: no hop jumps across the card
    hops = [abs(ax - bx) + abs(ay - by) for (ax, ay), (bx, by) in zip(spots, spots[1:] + spots[:1], strict=True)]
    assert max(hops) <= (_part(fig, "dram").y[2] - _part(fig, "dram").y[0]) * 4


def test_labels_carry_the_configs_numbers():
    cfg = SPYRE.replace(lx_bytes=4 * 2**20, dram_bandwidth=100e9, pcie_bandwidth=25e9, ring_bytes_per_cycle=64)
    fig = card_figure(cfg)
    assert "4,096 KiB" in _part(fig, "lx").text and f"{cfg.lx_budget_bytes:,} B" in _part(fig, "lx").text
    assert "100.0 GB/s" in _part(fig, "dram").text
    assert "25 GB/s" in _part(fig, "pcie").text and _part(fig, "pcie").line.color == UNIT_COLORS["pcie"]
    assert "64 B/cycle" in _part(fig, "ring").text
    assert _part(fig, "host").fillcolor == UNIT_COLORS["host"]
    names = {a.text for a in fig.layout.annotations}
    assert {"host", "PCIe", "ring", "core 0", f"core {cfg.cores - 1}"} <= names
