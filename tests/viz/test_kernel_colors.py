"""One color per kernel: within a view no two kernels share one, and a kernel keeps its color from view to view."""

import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.viz import DataflowView, FusionView, Roofline
from spyre_lab.viz.style import KERNEL_PALETTE, UNIT_COLORS, kernel_color


def _mlp(x, wg, wu, wd):
    return (torch.nn.functional.silu(x @ wg) * (x @ wu)) @ wd


@pytest.fixture(scope="module", params=["unfused softmax", "unfused mlp"])
def program(request):
    """Tutorial 5's and 6's unfused programs (five one-op kernels each; a name hash gave two of the softmax's
    kernels one color)."""
    torch.manual_seed(0)
    if request.param == "unfused softmax":
        x = torch.randn(64, 1024, dtype=torch.float16)
        return compile_graph(lambda t: torch.softmax(t, dim=-1), [x], CompileOptions(fusion=frozenset()))
    inputs = [torch.randn(16, 256, dtype=torch.float16), torch.randn(256, 512, dtype=torch.float16),
              torch.randn(256, 512, dtype=torch.float16), torch.randn(512, 256, dtype=torch.float16)]
    return compile_graph(_mlp, inputs, CompileOptions(fusion=frozenset()))


def _fusion_colors(fig):
    boxes = [s for s in fig.layout.shapes if s.name and s.name.startswith("kernel ")]
    return [s.fillcolor for s in boxes]


def test_no_two_kernels_share_a_color_and_each_keeps_it_across_views(program):
    names = [launch.name for launch in program.device_launches]
    assert 2 < len(names) <= len(KERNEL_PALETTE)
    fusion = _fusion_colors(FusionView(program).figure)
    assert len(set(fusion)) == len(fusion) == len(program.launches)
    roof = {t.meta["kernel"]: t.marker.color for t in Roofline(program).figure.data if t.meta and "kernel" in t.meta}
    assert len(set(roof.values())) == len(roof)
    view = DataflowView(program, mode="analytic")
    strip = {t.meta["kernel"]: t.line.color for t in view.figure.data if t.meta and "kernel" in t.meta}
    assert len(set(strip.values())) == len(strip)
    by_fusion = dict(zip([launch.name for launch in program.launches], fusion))
    for name in roof:
        assert roof[name] == by_fusion[name] == strip.get(name, roof[name]) == kernel_color(name)


def test_the_first_kernels_do_not_wear_a_unit_color():
    """A kernel beside a DRAM ceiling or a load lane must not look like one: the first six avoid the unit hues."""
    units = {UNIT_COLORS[u].upper() for u in ("load", "pt", "sfu", "store")}
    tableau_like = {"#1F77B4": "load", "#D62728": "pt", "#FF7F0E": "sfu", "#2CA02C": "store"}
    first = [kernel_color(f"k{i}_x") for i in range(6)]
    assert not (set(first) & units) and not (set(first) & set(tableau_like))
