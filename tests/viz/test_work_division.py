"""WorkDivisionView: slices tile the iteration space in core colors; sliders and switches replan the kernel."""

import functools
import re

import plotly.graph_objects as go
import pytest
import torch

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.examples import granite_layer, layer_inputs
from spyre_lab.compiler.work_division import matmul_cost
from spyre_lab.viz import WorkDivisionView
from spyre_lab.viz.style import UNIT_COLORS, core_color


@pytest.fixture(scope="module")
def view():
    return WorkDivisionView.matmul(256, 2048, 1024)


def _slices(fig):
    return [t for t in fig.data if t.meta and "core" in t.meta]


def _area(t):
    xs, ys = t.x, t.y
    return (max(xs) - min(xs)) * (max(ys) - min(ys))


def _panel(fig, name):
    return [t for t in fig.data if t.meta and t.meta.get("panel") == name]


def test_slices_tile_the_iteration_space_in_core_colors(view):
    spec = view.spec()
    fig = view.figure
    rects = _slices(fig)
    assert len(rects) == spec.division.cores_used == len(spec.tile_kernel.active_cores)
    assert all(t.fillcolor == core_color(t.meta["core"], view.cores) for t in rects)
    facets = spec.division.splits.get("K", 1)
    assert sum(_area(t) for t in rects) == facets * spec.dims["M"] * spec.dims["N"]
    go.Figure(fig.to_plotly_json())                                    # valid for plotly's validators


def test_utilization_and_cost_terms_are_the_models(view):
    spec = view.spec()
    fig = view.figure
    (util,) = _panel(fig, "utilization")
    sim = spec.simulate("analytic")
    busy = sorted(spec.tile_kernel.active_cores)
    assert list(util.x) == busy
    phase = sim.time_us - sim.launch_us
    assert list(util.y) == pytest.approx([max(sim.busy_us.get((c, u), 0.0) for u in ("load", "pt", "sfu", "store",
                                                                                     "ring")) / phase for c in busy])
    (compute,) = _panel(fig, "compute")                     # PT / SFU computing: core_utilization over the tile phase
    assert list(compute.y) == pytest.approx([sim.core_utilization[c] * sim.time_us / phase for c in busy])
    bars = _panel(fig, "cost")
    assert [b.marker.color for b in bars] == [UNIT_COLORS[u] for u in ("pt", "load", "ring", "engine")]
    assert bars[0].x[0].startswith("chosen")
    chosen = sum(b.y[0] for b in bars)
    assert chosen == pytest.approx(spec.division.cost.total_us)        # planned: the cost model's own total
    used = spec.division.cores_used
    others = [sum(b.y[i] for b in bars) for i in range(1, len(bars[0].x))
              if int(re.search(r"\((\d+)\)", bars[0].x[i]).group(1)) >= used]
    if not others:  # the plan uses every core (so on the measured card): it must beat every split shown
        others = [sum(b.y[i] for b in bars) for i in range(1, len(bars[0].x))]
    assert others and all(chosen <= o + 1e-9 for o in others)          # cheapest of the splits on as many cores
    assert any(a.name == "reason" and "cheapest" in a.text for a in fig.layout.annotations)


def test_controls_replan(view):
    fw = view.fig_widget
    view.controls["cores"].value = 8
    rects = [t for t in fw.data if t.meta and "core" in t.meta]
    assert len(rects) == view.spec().division.cores_used <= 8
    per_core = [c for t in fw.data if t.meta and t.meta.get("panel") in ("utilization", "idle") for c in t.x]
    assert sorted(per_core) == list(range(8))
    assert "on 8 cores" in fw.layout.title.text
    view.controls["cores"].value = 32
    view.controls["strategy"].value = "naive"
    splits = view.spec().division.splits
    assert sum(1 for v in splits.values() if v > 1) == 1               # naive splits one output dim
    bars = [t for t in fw.data if t.meta and t.meta.get("panel") == "cost"]
    b, m, n, k = (splits.get(d, 1) for d in "BMNK")
    spec = view.spec()
    cfg = view.cfg
    assert sum(t.y[0] for t in bars) == pytest.approx(
        matmul_cost(b, m, n, k, 1, spec.dims["M"], spec.dims["N"], spec.dims["K"], cfg).total_us)
    assert "naive" in view.caption
    view.controls["strategy"].value = "planned"


def test_row_kernels_show_unit_busy_time():
    fn = functools.partial(granite_layer, heads=4, kv_heads=2)
    program = compile_graph(fn, layer_inputs(64, 4, 2, 128, 16))
    view = WorkDivisionView(program)
    assert "matmul" in view.kernel or "mlp" in view.kernel              # default: the kernel with most FLOPs
    norm = next(name for name in view.controls["kernel"].options if "reduction" in name)
    view.controls["kernel"].value = norm
    fig = view.fig_widget
    (busy,) = [t for t in fig.data if t.meta and t.meta.get("panel") == "busy"]
    sim = view.spec().simulate("analytic")
    core = sim.busiest()[0]
    assert list(busy.y) == [sim.busy_us.get((core, u), 0.0) for u in ("load", "pt", "sfu", "store", "ring")]
    with pytest.raises(ValueError, match="no planned kernel"):
        WorkDivisionView(program, kernel="nope")


def test_saved_program_draws_the_same_slices(tmp_path, view):
    path = tmp_path / "p.json"
    view.program.save_json(str(path))
    saved = WorkDivisionView.from_json(path)
    live = WorkDivisionView(view.program)
    assert saved.kernel == live.kernel
    a = sorted((t.meta["core"], tuple(t.x), tuple(t.y)) for t in _slices(saved.figure))
    b = sorted((t.meta["core"], tuple(t.x), tuple(t.y)) for t in _slices(live.figure))
    assert a == b and len(a) == live.spec().division.cores_used
    assert saved.controls["cores"].disabled and saved.controls["strategy"].disabled
    assert "saved" in saved.caption


def _causal(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.fixture(scope="module")
def sdpa():
    torch.manual_seed(0)
    program = compile_graph(_causal, [torch.randn(1, 8, 128, 64, dtype=torch.float16) for _ in range(3)])
    (name,) = [launch.name for launch, k in zip(program.launches, program.kernels) if k.rule == "attention"]
    return program, name


def test_attention_kernel_shows_heads_by_query_rows(sdpa, tmp_path):
    program, name = sdpa
    view = WorkDivisionView(program, kernel=name)
    spec = view.spec()
    assert set(spec.division.splits) == {"B", "M"}                     # the attention planner's own split
    fig = view.figure
    rects = _slices(fig)
    assert len(rects) == spec.division.cores_used
    covered = sum(_area(t) for t in rects)
    assert covered == spec.dims["B"] * spec.dims["M"]                  # heads x query rows, each cell once
    for t in rects:                                                    # x: query rows, y: heads
        ranges = spec.slices[t.meta["core"]]
        assert (min(t.x), max(t.x)) == ranges["M"] and (min(t.y), max(t.y)) == ranges["B"]
    assert not _panel(fig, "cost")                                     # no matmul cost model for attention
    (work,) = _panel(fig, "attention")
    keys = [min(r + 1, spec.dims["N"]) for r in range(spec.dims["M"])]   # causal: row r scores keys 0..r
    want = [(s["B"][1] - s["B"][0]) * sum(keys[s["M"][0]:s["M"][1]]) for s in spec.slices if s]
    assert list(work.y) == want and sum(want) == spec.dims["B"] * sum(keys)
    assert any(a.name == "reason" and "query rows" in a.text for a in fig.layout.annotations)
    assert "attention" in fig.layout.annotations[2].text
    path = tmp_path / "sdpa.json"
    program.save_json(str(path))
    saved = WorkDivisionView.from_json(path, kernel=name)
    assert sorted((t.meta["core"], tuple(t.x), tuple(t.y)) for t in _slices(saved.figure)) == \
        sorted((t.meta["core"], tuple(t.x), tuple(t.y)) for t in rects)
    assert not _panel(saved.figure, "cost") and _panel(saved.figure, "attention")


def _facet_of(t, width):
    """The panel a slice rectangle sits in (panels are ``width`` wide with a gap of 6% between them)."""
    return int(min(t.x) // (1.06 * width))


def test_every_slice_of_an_uneven_k_split_is_drawn_in_its_panel():
    """K 1024 over 3 cores is 384 + 384 + 256: the short last slice has its own panel, filled like the others."""
    view = WorkDivisionView.matmul(16, 2816, 1024)
    spec = view.spec()
    assert spec.division.splits["K"] == 3 and len({r["K"] for r in spec.slices if r}) == 3
    n, m = spec.dims["N"], spec.dims["M"]
    per_panel: dict[int, float] = {}
    for t in _slices(view.figure):
        per_panel[_facet_of(t, n)] = per_panel.get(_facet_of(t, n), 0) + _area(t)
    assert per_panel == {0: n * m, 1: n * m, 2: n * m}
    labels = [a.text for a in view.figure.layout.annotations if (a.text or "").startswith("K slice")]
    assert labels == ["K slice 0", "K slice 1", "K slice 2"]


def test_idle_cores_of_a_24_of_32_division_are_drawn():
    """48 sticks over 32 cores: 24 cores take 2 sticks, 8 sit idle, and both kinds are visible bars."""
    def exp_tanh(x):
        return torch.tanh(torch.exp(x))

    view = WorkDivisionView(compile_graph(exp_tanh, [torch.randn(48 * 64, dtype=torch.float16)]))
    fig = view.figure
    (busy,) = _panel(fig, "utilization")
    (idle,) = _panel(fig, "idle")
    assert list(busy.x) == list(range(24)) and list(idle.x) == list(range(24, 32))
    top = fig.layout[_axis_of(busy.yaxis)].range[1]
    assert all(y > 0.25 * top for y in busy.y)             # a busy core is a visible bar, not a sliver near 0
    assert all(y == top for y in idle.y) and idle.marker.pattern.shape  # an idle core: a hatched full-height bar
    note = next(a.text for a in fig.layout.annotations if a.name == "idle")
    assert note.startswith("8 of 32 cores idle") and "24–31" in note
    view.cores = 24
    assert not _panel(view.figure, "idle")[0].x            # on 24 cores every core is busy


def _axis_of(ref):
    return "yaxis" + ref[1:]
