"""FusionView: LoopIR nodes colored by their kernel, a box and a rule per kernel, the table, and rule checkboxes."""

import functools

import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.examples import granite_layer, layer_inputs
from spyre_lab.compiler.options import FUSION_RULES
from spyre_lab.viz import FusionView
from spyre_lab.viz.fusion import _short_rule
from spyre_lab.viz.style import kernel_color


@pytest.fixture(scope="module")
def layer():
    fn = functools.partial(granite_layer, heads=4, kv_heads=2)
    inputs = layer_inputs(64, 4, 2, 128, 16)
    return fn, inputs, compile_graph(fn, inputs)


def _nodes(fig, row):
    return next(t for t in fig.data if t.meta and t.meta.get("row") == row)


def test_nodes_colored_by_their_kernel_and_boxes_named_by_rule(layer):
    _, _, program = layer
    fig = FusionView(program).figure
    landed = [kernel_color(launch.name) for launch, k in zip(program.launches, program.kernels)
              for n in k.nodes for _ in (getattr(n, "members", None) or [n])]   # attention: the nodes it replaced
    for row in ("before", "after"):
        nodes = _nodes(fig, row)
        assert len(nodes.x) == program.unfused_kernels
        assert list(nodes.marker.color) == landed
    boxes = [s for s in fig.layout.shapes if s.name and s.name.startswith("kernel ")]
    assert [s.fillcolor for s in boxes] == [kernel_color(launch.name) for launch in program.launches]
    rules = [a.text for a in fig.layout.annotations if a.name == "rule"]
    assert rules == [_short_rule(k.rule) for k in program.kernels]
    assert "mlp" in rules or "smax" in rules


def test_table_holds_the_modeled_numbers(layer):
    _, _, program = layer
    fig = FusionView(program).figure
    table = next(t for t in fig.data if t.type == "table")
    cols = table.cells.values
    assert len(cols[0]) == program.num_kernels + 1 and cols[0][-1] == "total"
    times = [launch.simulate("analytic").time_us for launch in program.launches]
    assert [float(v) for v in cols[4][:-1]] == pytest.approx(times, abs=0.006)
    assert float(cols[4][-1]) == pytest.approx(program.modeled_time_us("analytic"), abs=0.006)
    assert list(table.cells.fill.color[0][:-1]) == [kernel_color(launch.name) for launch in program.launches]


def test_rule_checkbox_recompiles_and_redraws(layer):
    _, _, program = layer
    view = FusionView(program)
    assert view.can_recompile
    fw = view.fig_widget
    kernels_before = sum(1 for s in fw.layout.shapes if s.name.startswith("kernel "))
    view.controls["attention"].value = False          # the layer's softmax sits inside its attention pattern
    assert "attention" not in view.program.options.fusion
    after = sum(1 for s in fw.layout.shapes if s.name.startswith("kernel "))
    assert after == view.program.num_kernels > kernels_before
    assert "without attention" in fw.layout.title.text
    table = next(t for t in fw.data if t.type == "table")
    assert len(table.cells.values[0]) == after + 1
    for rule in FUSION_RULES:
        view.controls[rule].value = False
    assert view.program.num_kernels >= program.unfused_kernels - 1    # ~one kernel per node, restickifies folded
    assert "no fusion" in fw.layout.title.text
    view.controls["softmax"].value = True
    assert "smax" in [a.text for a in fw.layout.annotations if a.name == "rule"]


def test_from_callable_and_saved_program(tmp_path, layer):
    fn, inputs, program = layer
    view = FusionView(fn, inputs)
    assert view.program is program                                     # the program cache answers
    path = tmp_path / "p.json"
    program.save_json(str(path))
    saved = FusionView.from_json(path)
    fig = saved.figure
    assert all(c.disabled for c in saved.controls.values())
    table = next(t for t in fig.data if t.type == "table")
    assert len(table.cells.values[0]) == program.num_kernels + 1
    assert any("not saved" in a.text for a in fig.layout.annotations if a.name == "note")


def test_compiled_module():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).half()
    compiled = torch.compile(model.to("spyre"), backend="spyre")
    compiled(torch.randn(32, 64, dtype=torch.float16).to("spyre"))
    view = FusionView(compiled)
    assert view.can_recompile
    n = view.program.num_kernels
    view.controls["matmul_epilogue"].value = False
    assert view.program.num_kernels > n
    with pytest.raises(ValueError, match="nothing compiled"):
        FusionView(torch.compile(torch.nn.Linear(8, 8), backend="spyre"))


def test_figure_is_valid_plotly(layer):
    import plotly.graph_objects as go

    fig = FusionView(layer[2]).figure
    go.Figure(fig.to_plotly_json())                 # built without validation for speed; plotly's validators agree


# --- readable labels when many small kernels sit side by side ------------------------------------------------
FIT_WIDTH = 700         # the width a FigureWidget draws at in JupyterLab (out/browser/FusionView.png)
CHAR = 0.6              # glyph width / font size, an average for Helvetica / Arial


def _transposes(*xs):
    return [x.t().contiguous() for x in xs]


@pytest.fixture(scope="module")
def side_by_side():
    """38 restickify kernels in a row and two pointwise ones: one-node kernels a column apart."""
    torch.manual_seed(0)
    xs = [torch.randn(64, 128, dtype=torch.float16) for _ in range(40)]
    return compile_graph(lambda *a: [*_transposes(*a[:-2]), a[-2] * 2 + 1, a[-1].relu()], xs)


def _px_per_unit(fig):
    boxes = [s for s in fig.layout.shapes if (s.name or "").startswith("kernel ")] or [dict(x0=-0.5, x1=0.5)]
    lo, hi = fig.layout.xaxis2.range or (min(b["x0"] for b in boxes), max(b["x1"] for b in boxes))  # else: autorange
    d0, d1 = fig.layout.xaxis2.domain
    m = fig.layout.margin
    return (FIT_WIDTH - m.l - m.r) * (d1 - d0) / (hi - lo), lo


def _boxes(fig):
    """Every visible label and marker of the after-fusion row as (kind, row, left px, right px)."""
    u, lo = _px_per_unit(fig)
    nodes = _nodes(fig, "after")
    size = nodes.textfont.size
    out = []
    for x, y, text in zip(nodes.x, nodes.y, nodes.text):
        cx = (x - lo) * u
        out.append(("marker", f"node {y}", cx - 6, cx + 6))
        if text:
            out.append(("label", f"node {y}", cx + 8, cx + 8 + len(text) * size * CHAR))
    for a in fig.layout.annotations:
        if a.name == "rule" and a.visible is not False and a.text:
            cx, half = (a.x - lo) * u, len(a.text) * a.font.size * CHAR / 2
            out.append(("label", f"rule {a.yshift or 0}", cx - half, cx + half))
    return out


def _overlaps(boxes):
    hits = []
    for i, (k1, r1, a1, b1) in enumerate(boxes):
        for k2, r2, a2, b2 in boxes[i + 1:]:
            if r1 == r2 and "label" in (k1, k2) and a1 < b2 and a2 < b1:
                hits.append(((k1, r1, round(a1), round(b1)), (k2, r2, round(a2), round(b2))))
    return hits


def test_labels_of_kernels_side_by_side_do_not_overlap(side_by_side):
    program = side_by_side
    assert sum(k.rule == "restickify" for k in program.kernels) >= 38
    fig = FusionView(program).figure
    boxes = _boxes(fig)
    assert not _overlaps(boxes), _overlaps(boxes)[:5]
    nodes = _nodes(fig, "after")
    shown = [t for t in nodes.text if t]
    assert shown and all(len(t) <= len("restickify") for t in shown)     # shortened or left out, never widened
    assert all(op in hover for op, hover in zip([t.rstrip("…") for t in nodes.text], nodes.hovertext))
    assert sum("<b>restickify</b>" in h for h in nodes.hovertext) >= 38    # the full name stays in the hover
    rules = [a for a in fig.layout.annotations if a.name == "rule"]
    assert len(rules) == program.num_kernels and all(a.hovertext.endswith(k.rule)
                                                    for a, k in zip(rules, program.kernels))
    assert sum(a.visible is not False for a in rules) >= program.num_kernels // 2   # staggered, most still shown
    saved = FusionView(program.to_json()).figure                       # a saved program draws the same way
    assert not _overlaps(_boxes(saved))


def test_labels_with_room_stay_whole(layer):
    fig = FusionView(layer[2]).figure
    assert not _overlaps(_boxes(fig))
    nodes = _nodes(fig, "after")
    assert "logical_not" in nodes.text                                 # inside the tall attention column: room
    assert all(a.visible is not False for a in fig.layout.annotations if a.name == "rule")


def test_the_kept_function_comes_from_the_public_cache_accessor(layer):
    from spyre_lab.compiler import cache

    fn, _, program = layer
    program_again, kept = cache.peek(program.cache_key)
    assert program_again is program and kept is fn
    before = cache.stats()
    view = FusionView(program)
    assert view.can_recompile and view._fn is fn
    assert cache.stats() == before                                       # a peek counts no hit or miss
    assert cache.peek("no such key") is None
