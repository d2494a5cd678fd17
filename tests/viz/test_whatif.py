"""WhatIf: each switch really recompiles / relaunches, and the timeline, roofline and TTFT / TPOT follow."""

import warnings

import plotly.graph_objects as go
import pytest
import torch
from warning_checks import only_warnings

from spyre_lab.compiler.options import FUSION_RULES
from spyre_lab.viz import style
from spyre_lab.viz.records import kernel_records
from spyre_lab.viz.whatif import WhatIf

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def view():
    with only_warnings():                 # the layer's fp32 mask constants stay exact on the card: nothing to say
        return WhatIf.granite_layer("tiny-granite", prompt_len=64)


@pytest.fixture(autouse=True)
def back_to_baseline(view):
    yield
    for rule in FUSION_RULES:
        setattr(view, f"fuse_{rule}", True)
    view.work_division, view.dispatch, view.phase = "planned", "aot_patch", "prefill"
    base = view.baseline_setting  # the default card (measured: 150 GB/s one way)
    view.cores, view.lx_kib, view.dram_gbs = base.cores, base.lx_kib, base.dram_gbs


def _bars(fig):
    return {t.name: t for t in fig.data if t.type == "bar" and t.orientation != "h"}


def _kernel_lane(fig, label):
    return next(t for t in fig.data if t.type == "bar" and t.orientation == "h" and t.y[0] == f"{label} · kernels")


def test_baseline_draws_every_kernel_in_its_color(view):
    fig = view.figure
    program = view.baseline.programs["prefill"]
    lane = _kernel_lane(fig, "now")
    assert len(lane.x) == len(program.device_launches)
    assert list(lane.marker.color) == [style.kernel_color(k.name) for k in program.device_launches]
    bars = _bars(fig)
    assert bars["now"].y == bars["baseline"].y
    assert "(same)" in view.caption and "4 x one layer" in view.caption
    assert view.baseline.ttft_ms == pytest.approx(4 * view.baseline.traces["prefill"].duration_us / 1e3)


def test_fusion_off_means_more_kernels_and_a_longer_ttft(view):
    view.fuse_softmax = False
    view.fuse_reduction_fusion = False
    now = view.current
    assert len(now.programs["prefill"].device_launches) > len(view.baseline.programs["prefill"].device_launches)
    assert now.ttft_ms > view.baseline.ttft_ms
    fig = view.figure
    assert len(_kernel_lane(fig, "now").x) > len(_kernel_lane(fig, "baseline").x)
    assert "without reduction_fusion, softmax" in view.caption


def test_rebuild_dispatch_serialises_host_and_card(view):
    view.dispatch = "rebuild"
    now = view.current
    assert now.programs["prefill"] is view.baseline.programs["prefill"]   # same program: only the launch differs
    assert now.ttft_ms > view.baseline.ttft_ms and now.tpot_ms > view.baseline.tpot_ms
    assert any(e.name.startswith("rebuild graph") for e in now.traces["prefill"])
    assert not any(e.name.startswith("rebuild graph") for e in view.baseline.traces["prefill"])


def test_hardware_switches_reach_the_compiler_and_the_roofline(view):
    view.cores, view.dram_gbs = 4, 25.6
    now = view.current
    program = now.programs["prefill"]
    assert program.cfg.cores == 4 and program.cfg.dram_bandwidth == pytest.approx(25.6e9)
    assert max(len(launch.tile_kernel.active_cores) for launch in program.device_launches) <= 4
    fig = view.figure
    dram = next(t for t in fig.data if (t.name or "").startswith("DRAM"))
    assert dram.name == "DRAM 25.6 GB/s" and dram.y[0] == pytest.approx(25.6e9 * dram.x[0] / 1e12)
    pt = next(t for t in fig.data if (t.name or "").startswith("PT peak"))
    assert max(pt.y) == pytest.approx(program.cfg.peak_flops / 1e12)
    assert next(t for t in fig.data if t.name == "baseline ceilings").visible
    busy = lambda p: sum(r.time_us for r in kernel_records(p) if not r.host)
    assert busy(program) > busy(view.baseline.programs["prefill"])


def test_controls_update_the_live_figure(view):
    before = _bars(view.figure)["now"].y
    view.controls["fuse_attention"].value = False     # (softmax alone changes nothing here: attention holds it)
    after = next(t for t in view.fig_widget.data if t.type == "bar" and t.name == "now").y
    assert after[0] > before[0] * 1.01                 # an unfused attention: more kernels, a longer TTFT
    view.controls["phase"].value = "decode"
    title = view.fig_widget.layout.annotations[0].text
    assert "decode" in title
    view.controls["fuse_attention"].value = True   # cached: the baseline setting again
    assert next(t for t in view.fig_widget.data if t.type == "bar" and t.name == "now").y == before


def test_bad_arguments_name_the_fix():
    fn = lambda x: x * 2
    with pytest.raises(TypeError, match="list of the call's arguments"):
        WhatIf(fn, torch.ones(4, dtype=torch.float16))
    with pytest.raises(ValueError, match="layers must be"):
        WhatIf(fn, [torch.ones(4, dtype=torch.float16)], layers=0)
    with pytest.raises(ValueError, match="dispatch must be"):
        WhatIf(fn, [torch.ones(4, dtype=torch.float16)], dispatch="fast")


def test_a_function_with_in_place_updates_times_its_write_backs():
    """A what-if launch goes through the runtime's timing-only mode, write-back kernels included, without numerics."""

    def step(cache, x):
        cache.add_(x)
        return cache * 2

    cache = torch.zeros(64, 64, dtype=torch.float16, device="spyre")
    x = torch.ones(64, 64, dtype=torch.float16, device="spyre")
    view = WhatIf(step, (cache, x))
    names = [e.name for e in view.baseline.traces["prefill"].events]
    assert any("write back" in n for n in names)
    assert torch.equal(cache.cpu(), torch.zeros(64, 64, dtype=torch.float16))   # timing only: nothing computed


@pytest.mark.parametrize("width", [700, 900, 1300])
def test_panel_titles_stay_inside_the_figure(view, width):
    """Each panel title, at its font size (0.6 em per character, the longest line), lies within the figure."""
    fig = view.figure
    go.Figure(fig.to_plotly_json())                         # built without validation; plotly's validators agree
    m, height = fig.layout.margin, fig.layout.height
    plot_w, plot_h = width - m.l - m.r, height - m.t - m.b
    titles = [a for a in fig.layout.annotations if a.xref == "paper" and a.yref == "paper" and a.name != "note"]
    assert len(titles) == 3 and any("TTFT" in a.text for a in titles)
    for a in titles:
        lines = a.text.split("<br>")
        size = a.font.size or 16
        half = max(len(line) for line in lines) * size * 0.6 / 2
        center = m.l + a.x * plot_w
        assert a.xanchor == "center" and center - half >= 0 and center + half <= width, (a.text, width)
        top = m.t + (1 - a.y) * plot_h - len(lines) * size * 1.3        # bottom-anchored: the text rises from y
        assert a.yanchor == "bottom" and top >= 0, a.text


def test_roofline_kernels_are_the_programs_device_kernels(view):
    fig = view.figure
    (kernels,) = [t for t in fig.data if t.name == "kernels"]
    placed = [r for r in kernel_records(view.current.programs["prefill"]) if not r.host and r.flops and r.time_us
              and r.dram_bytes]
    assert sorted(kernels.meta["kernels"]) == sorted(r.name for r in placed)     # drawn big first
    assert list(kernels.marker.color) == [style.kernel_color(name) for name in kernels.meta["kernels"]]
    labels = [a for a in fig.layout.annotations if a.name == "kernel label"]
    assert sorted(a.text for a in labels) == sorted(f"k{r.index}" for r in placed)    # one label each, on the panel
    assert {(a.xref, a.yref) for a in labels} == {(kernels.xaxis, kernels.yaxis)}
    assert next(t for t in fig.data if t.name == "baseline ceilings").visible is False   # same card: nothing to show


def test_a_switch_recompiles_without_tracing_again(view, monkeypatch):
    """The ATen trace depends on neither the options nor the card: a switch recompiles from the kept trace, and a
    setting seen before comes from the view's cache without compiling."""
    from spyre_lab.compiler import backend, cache

    traced = []
    monkeypatch.setattr(backend, "to_aten", lambda *a: traced.append(a) or pytest.fail("traced again"))
    compiles = cache.stats()["compiles"]
    view.controls["fuse_mlp"].value = not view.fuse_mlp
    assert cache.stats()["compiles"] == compiles + 2 and not traced        # prefill and decode really recompiled
    view.controls["fuse_mlp"].value = not view.fuse_mlp                    # back: cached, nothing compiled
    assert cache.stats()["compiles"] == compiles + 2


@pytest.mark.parametrize(("change", "moves"), [(dict(cores=8), True), (dict(lx_kib=512), False),
                                              (dict(dram_gbs=51.2), True)])
def test_a_card_change_replans_from_the_kept_graph_and_equals_a_fresh_compile(view, monkeypatch, change, moves):
    """Cores, LX and DRAM bandwidth are card numbers the planner reads, so the view replans the kernels (from the
    ATen graph it traced once) rather than re-time the old ones; what it shows equals a view opened on that card,
    which traces and compiles from scratch. Fewer cores and a slower DRAM move the kernels' modeled times;
    tiny-granite's tiles all fit in 512 KiB of LX, so that change keeps the plan (and the times) as they were."""
    from spyre_lab.compiler import backend
    from spyre_lab.device.config import SPYRE

    traced = []
    real = backend.to_aten
    monkeypatch.setattr(backend, "to_aten", lambda *a: traced.append(a) or real(*a))
    for name, value in change.items():
        view.controls[name].value = value
    assert not traced                                                      # the view's path: no new trace
    fast = view.current
    card = {"cores": 8} if "cores" in change else {"lx_bytes": 512 * 1024} if "lx_kib" in change else \
        {"dram_bandwidth": 51.2e9}
    with only_warnings():
        slow = WhatIf.granite_layer("tiny-granite", prompt_len=64, cfg=SPYRE.replace(**card)).baseline
    assert traced                                                          # a new function: traced from scratch
    for phase in ("prefill", "decode"):
        assert fast.cfg == slow.cfg and fast.programs[phase] is not slow.programs[phase]
        assert [(r.name, r.time_us) for r in kernel_records(fast.programs[phase])] == \
            [(r.name, r.time_us) for r in kernel_records(slow.programs[phase])]
        # the same launches on the same card; the clock's origin (earlier tests' launches) moves the last bits
        assert fast.span_us(phase) == pytest.approx(slow.span_us(phase), rel=1e-12)
    assert fast.metrics() == pytest.approx(slow.metrics(), rel=1e-12)
    kernel_times = lambda outcome: [[r.time_us for r in kernel_records(outcome.programs[phase])]
                                    for phase in ("prefill", "decode")]
    assert (kernel_times(fast) != kernel_times(view.baseline)) == moves


def test_a_dispatch_change_relaunches_without_compiling(view):
    """Dispatch is a runtime choice: the same Programs launch again under it, nothing is compiled."""
    from spyre_lab.compiler import cache

    compiles = cache.stats()["compiles"]
    view.controls["dispatch"].value = "rebuild"
    now = view.current
    assert cache.stats()["compiles"] == compiles
    assert all(now.programs[p] is view.baseline.programs[p] for p in now.programs)
    assert now.traces["prefill"] is not view.baseline.traces["prefill"]


@pytest.fixture
def fresh_dtype_warnings():
    """Forget which dtypes the runtime already warned about (a one-time warning), so a test can observe them."""
    from spyre_lab.runtime import process_state

    process_state.reset("warnings")


def test_fp32_intermediates_are_bound_as_the_runtime_binds_them(fresh_dtype_warnings):
    """fp32 values passed between kernels through DRAM stay fp32 on the card (run_program's rule): no warning."""

    def upcast_transpose(x):
        return (x.float().exp().t().contiguous() * 2).half()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        view = WhatIf(upcast_transpose, [torch.randn(64, 128, dtype=torch.float16)])
    program = view.baseline.programs["prefill"]
    assert any(program.buffers[s].dtype == torch.float32 for launch in program.launches for s in launch.address_slots)
    assert [str(c.message) for c in caught] == []


def test_granite_layer_keeps_its_fp32_mask_constants_exact_without_a_warning(fresh_dtype_warnings):
    """SDPA's decomposition computes fp16 attention in fp32 and builds the causal mask (0 / -inf) and a zero fill as
    fp32 constants: compiler-made values nobody outside the program sees, so the runtime keeps them in the card's
    fp32 format, as it keeps fp32 intermediates, and warns about nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        view = WhatIf.granite_layer("tiny-granite", prompt_len=16)
    assert [str(c.message) for c in caught] == []
    constants = [t for p in view.baseline.programs.values() for t in p.constants.values()]
    assert constants and all(t.dtype == torch.float32 for t in constants)
    assert all(x.dtype == torch.float16 for x in view._inputs["prefill"])    # the learner's tensors are fp16


def _mlp(x, wg, wu, wd):
    return (torch.nn.functional.silu(x @ wg) * (x @ wu)) @ wd


def _mlp_inputs(tokens):
    return [torch.randn(tokens, 64, dtype=torch.float16), torch.randn(64, 128, dtype=torch.float16),
            torch.randn(64, 128, dtype=torch.float16), torch.randn(128, 64, dtype=torch.float16)]


def _scores(fig):
    """The score bars drawn: {bar name: {metric: value}}; a nan value would be an untrue bar."""
    return {t.name: dict(zip(t.x, t.y)) for t in fig.data if t.type == "bar" and t.orientation != "h"}


def test_a_decode_only_launch_scores_tpot_from_its_decode_launch_and_no_ttft():
    """A one-token function given as decode inputs is a decode launch: TPOT (layers x that launch), never a TTFT,
    never nan (the caption, the bars and the panel title all say the same)."""
    torch.manual_seed(0)
    view = WhatIf(_mlp, decode_inputs=_mlp_inputs(1), layers=40, name="decode MLP")
    outcome = view.baseline
    assert list(outcome.traces) == ["decode"] and view.phase == "decode"
    assert outcome.tpot_ms == pytest.approx(40 * outcome.traces["decode"].duration_us / 1e3)
    assert outcome.ttft_ms is None
    caption = view.caption
    assert "TPOT" in caption and "TTFT" not in caption and "nan" not in caption
    assert "TPOT from the decode launch" in caption
    fig = view.figure
    assert _scores(fig) == {"baseline": {"TPOT": pytest.approx(outcome.tpot_ms)},
                            "now": {"TPOT": pytest.approx(outcome.tpot_ms)}}
    assert "one decode launch" in fig.layout.annotations[0].text
    assert "phase" not in view.controls                       # one launch: nothing to toggle
    with pytest.raises(KeyError, match="prefill_inputs="):
        outcome.span_us("prefill")


def test_a_prefill_only_launch_never_shows_a_nan_tpot():
    torch.manual_seed(0)
    view = WhatIf(_mlp, _mlp_inputs(16), layers=2)
    assert "nan" not in view.caption and "TPOT" not in view.caption and "TTFT" in view.caption
    scores = _scores(view.figure)
    assert set(scores) == {"baseline", "now"} and all(list(s) == ["TTFT"] for s in scores.values())
    assert all(v == v for s in scores.values() for v in s.values())


def test_with_both_launches_ttft_is_the_prefill_launch_and_tpot_the_decode_launch(view):
    outcome = view.baseline
    assert outcome.ttft_ms == pytest.approx(4 * outcome.traces["prefill"].duration_us / 1e3)
    assert outcome.tpot_ms == pytest.approx(4 * outcome.traces["decode"].duration_us / 1e3)
    assert outcome.ttft_ms != outcome.tpot_ms
    scores = _scores(view.figure)["now"]
    assert scores == {"TTFT": pytest.approx(outcome.ttft_ms), "TPOT": pytest.approx(outcome.tpot_ms)}
    assert "nan" not in view.caption


def test_no_inputs_at_all_names_the_fix():
    with pytest.raises(TypeError, match="decode_inputs="):
        WhatIf(lambda x: x)


def test_a_new_setting_shown_in_the_widget_is_kept_out_of_full_collections(view):
    """What a control change caches lives as long as the view: it is frozen with the long-lived heap, so the next
    changes do not pay full collections over it (benchmarks/bench_viz.py shows the pauses this removes)."""
    import gc

    def collected_generation(obj) -> int | None:     # the generation the collector still walks it in, if any
        return next((g for g in range(3) if any(o is obj for o in gc.get_objects(generation=g))), None)

    view.widget  # noqa: B018
    gc.unfreeze()
    cores = view.baseline_setting.cores
    for new in (cores - 3, cores - 5):                     # cards not seen before: a new compile and launch each
        view.controls["cores"].value = new
        kept = view.current
        assert gc.is_tracked(kept) and collected_generation(kept) is None
        assert collected_generation(kept.traces["prefill"].events) is None
