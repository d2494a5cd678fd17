"""WhatIf: flip a compiler or hardware switch and see the kernels, the roofline and TTFT / TPOT move together.

Switches: each fusion rule (``CompileOptions.fusion``), work division (planned / naive), runtime dispatch
(``RuntimeOptions(dispatch="aot_patch" | "rebuild")``), and the card itself through ``SpyreConfig.replace``:
cores, LX scratchpad per core, DRAM bandwidth. A change of options or card really recompiles the kernels with
``compile_graph`` (from the ATen graph it traced the first time; cached per configuration: the planner reads the
card's cores, LX and DRAM bandwidth, so re-timing the old kernels on a new card would show a plan the compiler
would not make), and every setting really launches its Programs on ``torch.device("spyre")`` under the chosen
dispatch, recording the modeled events; nothing is interpolated. A dispatch change relaunches the same Programs.
Sliders report on release (``continuous_update=False``), so dragging does not compile every notch.

What is drawn, current configuration against the baseline (the configuration the view was opened with):

* the launch timeline on the modeled clock (host enqueue, program correction, PCIe, kernels in their colors);
* the roofline: each device kernel at its arithmetic intensity and modeled FLOP/s, under the current card's
  compute and DRAM ceilings;
* TTFT and TPOT, **modeled estimates**: ``layers`` x the modeled span of one launch of the prefill-shaped and the
  decode-shaped program (one decoder layer each). Embedding, LM head, sampling and the engine's host work are
  not in it; `DecodeTimeline` shows a real engine run.

Each launch is the phase its inputs are given as, never guessed: ``example_inputs`` (the positional argument)
make the prefill launch and score TTFT, ``decode_inputs`` make the decode launch and score TPOT. Give either or
both; a metric whose launch was not given is left out of the caption and the bars (never drawn as ``nan``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import plotly.graph_objects as go
import torch

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.trace import Trace
from spyre_lab.heap import freeze_new_survivors
from spyre_lab.viz import style
from spyre_lab.viz.base import View, base_layout, cached_subplots, toggle
from spyre_lab.viz.labels import FIT_WIDTH, Box
from spyre_lab.viz.roofline import Roofline
from spyre_lab.viz.sources import fusion_rules
from spyre_lab.viz.step_lanes import step_lanes

if TYPE_CHECKING:
    from spyre_lab.compiler.options import CompileOptions
    from spyre_lab.compiler.program import Program

LX_KIB_CHOICES = (256, 512, 1024, 2048, 4096, 8192)
DRAM_GBS_CHOICES = (25.6, 51.2, 102.4, 204.8, 409.6, 819.2)
_PHASE_OF = {"TTFT": "prefill", "TPOT": "decode"}
"""The launch each score comes from: time to first token is a prefill, time per output token a decode step."""
SUBPLOT_TITLE_SIZE = 14
"""Panel titles a little smaller than the figure title; a panel title never reaches past the figure's edge."""


@dataclass(frozen=True)
class Setting:
    """One point in the what-if space (hashable: results are cached per setting)."""

    fusion: frozenset[str]
    work_division: str
    dispatch: str
    cores: int
    lx_kib: int
    dram_gbs: float

    def options(self, base: CompileOptions) -> CompileOptions:
        return base.replace(fusion=self.fusion, work_division=self.work_division)

    def config(self, base: SpyreConfig) -> SpyreConfig:
        return base.replace(cores=self.cores, lx_bytes=self.lx_kib * 1024, dram_bandwidth=self.dram_gbs * 1e9)

    @property
    def compile_key(self) -> tuple[Any, ...]:
        """What the compiled kernels depend on: the options and the card. Dispatch is a runtime choice (same
        kernels, another launch); cores, LX and DRAM bandwidth are card numbers the planner reads (work division,
        tile plans that fit LX, the matmul cost model), so a new value replans the kernels."""
        return self.fusion, self.work_division, self.cores, self.lx_kib, self.dram_gbs

    def describe(self) -> str:
        off = sorted(set(fusion_rules()) - self.fusion)
        return (f"fusion {'all' if not off else 'without ' + ', '.join(off)}, {self.work_division} division, "
                f"{self.dispatch}, {self.cores} cores, LX {self.lx_kib} KiB, DRAM {self.dram_gbs:g} GB/s")


@dataclass
class Outcome:
    """What one setting gives: per pass (prefill / decode) the Program, its launch trace and its kernels."""

    setting: Setting
    cfg: SpyreConfig
    programs: dict[str, Program]
    traces: dict[str, Trace]
    layers: int
    _spans: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _lanes: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def span_us(self, phase: str) -> float:
        """Modeled µs of one launch of the ``phase`` program (a phase whose inputs were not given is an error)."""
        if phase not in self.traces:
            raise KeyError(f"no {phase} launch in this WhatIf: it was opened with inputs for "
                           f"{' and '.join(self.traces)} only (pass {phase}_inputs= to add one)")
        if phase not in self._spans:             # a trace's span walks all its events: once per outcome
            self._spans[phase] = self.traces[phase].duration_us
        return self._spans[phase]

    def lanes(self, phase: str) -> Any:
        """The ``phase`` launch's events as the timeline's lanes (``step_lanes``), built once per outcome."""
        if phase not in self._lanes:
            self._lanes[phase] = step_lanes(self.traces[phase])
        return self._lanes[phase]

    @property
    def ttft_ms(self) -> float | None:
        """``layers`` x one prefill launch (ms); None without prefill inputs."""
        return self.layers * self.span_us("prefill") / 1e3 if "prefill" in self.traces else None

    @property
    def tpot_ms(self) -> float | None:
        """``layers`` x one decode launch (ms); None without decode inputs."""
        return self.layers * self.span_us("decode") / 1e3 if "decode" in self.traces else None

    def metrics(self) -> dict[str, float]:
        """The scores this outcome has, in order: TTFT from the prefill launch, TPOT from the decode launch."""
        out = {"TTFT": self.ttft_ms, "TPOT": self.tpot_ms}
        return {name: value for name, value in out.items() if value is not None}


def launch_trace(program: Program, inputs: Sequence[torch.Tensor], dispatch: str) -> Trace:
    """One launch of ``program`` on the card under ``dispatch``: its modeled events, host waits included.

    The launch goes through the runtime's one launch path (``runtime.launch.launch``: real DRAM buffers, correction
    blobs, the same JobPlan steps as ``run_program``) in the runtime's ``timing_only()`` mode, which leaves each
    kernel's numerics out because no modeled time depends on them; that keeps a what-if change fast.
    """
    from spyre_lab.runtime.launch import RuntimeOptions, launch, timing_only
    from spyre_lab.runtime.programs import load
    from spyre_lab.runtime.stream import current_stream, synchronize
    from spyre_lab.runtime.timeline import recording

    options = RuntimeOptions(dispatch=dispatch)  # type: ignore[arg-type]
    index = inputs[0].device.index or 0
    loaded = load(program, program.options.timing)
    bound = dict(zip(program.inputs, inputs))
    bound.update(loaded.constants(index))
    loaded.binding_plan(index)[1].bind_made(bound, index)    # as run_program binds: new outputs, intermediates
    synchronize()
    with timing_only(), recording() as trace:
        launch(loaded, bound, stream=current_stream(index), options=options)
        synchronize()
    return trace


class WhatIf(View):
    """Compiler and hardware switches against the kernel timeline, the roofline and modeled TTFT / TPOT.

    ``WhatIf(fn, prefill_inputs, decode_inputs=..., layers=N)`` for any function or module (one decoder layer is
    the usual choice), or ``WhatIf.granite_layer("tiny-granite")`` for the engine model's own layer shapes. A
    decode-only function (one token per sequence) is ``WhatIf(fn, decode_inputs=inputs)``: its launch is a decode
    launch and scores TPOT.
    """

    figure_height = 820

    def __init__(self, model: Callable | torch.nn.Module, example_inputs: Sequence[torch.Tensor] | None = None,
                 decode_inputs: Sequence[torch.Tensor] | None = None, layers: int = 1,
                 cfg: SpyreConfig = SPYRE, options: CompileOptions | None = None, dispatch: str = "aot_patch",
                 name: str | None = None) -> None:
        super().__init__()
        if example_inputs is None and decode_inputs is None:
            raise TypeError("WhatIf needs the call's arguments: example_inputs=[x] for a prefill launch (TTFT), "
                            "decode_inputs=[x] for a decode launch (TPOT), or both")
        for what, given in (("example_inputs", example_inputs), ("decode_inputs", decode_inputs)):
            if given is not None and (isinstance(given, torch.Tensor) or not isinstance(given, (list, tuple))):
                raise TypeError(f"{what} must be a list of the call's arguments, e.g. [x]")
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        if dispatch not in ("aot_patch", "rebuild"):
            raise ValueError(f"dispatch must be 'aot_patch' or 'rebuild', got {dispatch!r}")
        self.model, self.layers, self.base_cfg = model, layers, cfg
        if options is None:
            from spyre_lab.compiler.options import CompileOptions

            options = CompileOptions()
        self.base_options = options
        self.name = name or getattr(model, "__name__", type(model).__name__)
        self._inputs: dict[str, list[Any]] = {}
        if example_inputs is not None:
            self._inputs["prefill"] = list(example_inputs)
        if decode_inputs is not None:
            self._inputs["decode"] = list(decode_inputs)
        self._device_inputs: dict[str, list[torch.Tensor]] = {}
        self._cache: dict[Setting, Outcome] = {}
        self._programs: dict[tuple[Any, ...], dict[str, Program]] = {}
        self.phase = next(iter(self._inputs))
        self.work_division = self.base_options.work_division
        self.dispatch = dispatch
        self.cores = cfg.cores
        self.lx_kib = cfg.lx_bytes // 1024
        self.dram_gbs = round(cfg.dram_bandwidth / 1e9, 1)
        for rule in fusion_rules():
            setattr(self, f"fuse_{rule}", rule in self.base_options.fusion)
        self._grid: dict[str, Any] = {}
        self._labels: list[dict[str, Any]] = []
        self.baseline_setting = self.setting
        self.baseline = self.evaluate(self.baseline_setting)

    @classmethod
    def granite_layer(cls, model: str = "tiny-granite", prompt_len: int = 64, **kwargs: Any) -> WhatIf:
        """One decoder layer of an engine model (its config.json shapes, random fp16 weights), prefill of
        ``prompt_len`` tokens and a one-token decode; TTFT / TPOT scale by the model's layer count."""
        from spyre_lab.compiler.examples import granite_layer, layer_inputs
        from spyre_lab.engine.loader import read_config, resolve_model_path

        config = read_config(resolve_model_path(model))
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        fn = functools.partial(granite_layer, heads=heads, kv_heads=kv_heads)
        fn.__name__ = f"{model} layer"  # type: ignore[attr-defined]
        torch.manual_seed(0)
        shapes = (config.hidden_size, heads, kv_heads, config.intermediate_size)
        return cls(fn, layer_inputs(*shapes, prompt_len), layer_inputs(*shapes, 1),
                   layers=config.num_hidden_layers, name=f"{model} decoder layer", **kwargs)

    # ---- the model -------------------------------------------------------------------------------------
    @property
    def setting(self) -> Setting:
        fusion = frozenset(r for r in fusion_rules() if getattr(self, f"fuse_{r}"))
        return Setting(fusion, self.work_division, self.dispatch, int(self.cores), int(self.lx_kib),
                       float(self.dram_gbs))

    def evaluate(self, setting: Setting) -> Outcome:
        """The kernels for ``setting`` launched once per pass on the card (cached per setting).

        Kernels are compiled once per :attr:`Setting.compile_key` with ``compile_graph``, which reuses the ATen
        graph it traced the first time (no new trace for another card or other options: only lowering, fusion
        and planning run again); a dispatch change relaunches the same programs.
        """
        hit = self._cache.get(setting)
        if hit is not None:
            return hit
        cfg = setting.config(self.base_cfg)
        programs = self._programs.get(setting.compile_key)
        if programs is None:
            from spyre_lab.compiler.backend import compile_graph

            options = setting.options(self.base_options)
            programs = {phase: compile_graph(self.model, inputs, options, cfg)
                        for phase, inputs in self._inputs.items()}
            self._programs[setting.compile_key] = programs
        traces = {phase: launch_trace(program, self._on_device(phase), setting.dispatch)
                  for phase, program in programs.items()}
        outcome = Outcome(setting, cfg, programs, traces, self.layers)
        self._cache[setting] = outcome
        if self.freeze_heap_when_shown and self._box is not None:
            freeze_new_survivors()               # cached for the view's life: keep it out of full collections
        return outcome

    def _on_device(self, phase: str) -> list[torch.Tensor]:
        if phase not in self._device_inputs:
            self._device_inputs[phase] = [x.to("spyre") if isinstance(x, torch.Tensor) else x
                                          for x in self._inputs[phase]]
        return self._device_inputs[phase]

    @property
    def current(self) -> Outcome:
        return self.evaluate(self.setting)

    @property
    def caption(self) -> str:  # type: ignore[override]
        now, base = self.current, self.baseline
        was = base.metrics()
        scores = ", ".join(f"{name} {value:.3f} ms ({_delta(value, was[name])})"
                           for name, value in now.metrics().items())
        sources = ", ".join(f"{name} from the {_PHASE_OF[name]} launch" for name in now.metrics())
        return (f"What if — {self.name}: {now.setting.describe()}. Modeled {scores} vs baseline; estimates: "
                f"{self.layers} x one layer's launch ({sources}).")

    # ---- controls --------------------------------------------------------------------------------------
    def make_controls(self) -> list[W.Widget]:
        controls: list[W.Widget] = []
        for rule in fusion_rules():
            button = W.ToggleButton(value=getattr(self, f"fuse_{rule}"), description=rule,
                                    tooltip=f"fusion rule {rule}", layout=W.Layout(width="auto"))
            controls.append(self.bind(f"fuse_{rule}", button))
        controls.append(self.bind("work_division", toggle(["planned", "naive"], self.work_division, "division")))
        controls.append(self.bind("dispatch", toggle(["aot_patch", "rebuild"], self.dispatch, "dispatch")))
        controls.append(self.bind("cores", W.IntSlider(value=self.cores, min=1, max=64, description="cores",
                                                       continuous_update=False, layout=W.Layout(width="260px"))))
        lx = sorted({*LX_KIB_CHOICES, self.lx_kib})
        controls.append(self.bind("lx_kib", W.SelectionSlider(options=lx, value=self.lx_kib, description="LX KiB",
                                                              continuous_update=False,
                                                              layout=W.Layout(width="260px"))))
        dram = sorted({*DRAM_GBS_CHOICES, self.dram_gbs})
        controls.append(self.bind("dram_gbs", W.SelectionSlider(options=dram, value=self.dram_gbs,
                                                                description="DRAM GB/s", continuous_update=False,
                                                                layout=W.Layout(width="280px"))))
        if len(self._inputs) > 1:
            controls.append(self.bind("phase", toggle(["prefill", "decode"], self.phase, "timeline")))
        return controls

    # ---- the figure ----------------------------------------------------------------------------------------
    def build(self) -> go.Figure:
        now, base = self.current, self.baseline
        phase = self.phase
        layout, axes = cached_subplots(
            rows=2, cols=2, specs=[[{"colspan": 2}, None], [{}, {}]], row_heights=[0.5, 0.5],
            column_widths=[0.62, 0.38], vertical_spacing=0.13, horizontal_spacing=0.1,
            subplot_titles=[f"one {phase} launch, now vs baseline ({style.MODELED_TIME_AXIS})",
                            f"roofline of the {phase} kernels (modeled)",
                            " / ".join(now.metrics()) + "<br>modeled estimates (ms)"],
            template="plotly_white", height=self.figure_height, margin=dict(l=70, r=30, t=70, b=50))
        data: list[dict[str, Any]] = []
        axis_updates: dict[str, dict[str, Any]] = {}
        self._grid, self._labels = layout, []
        self._timeline(data, axis_updates, axes[(1, 1)], now, base, phase)
        self._roofline(data, axis_updates, axes[(2, 1)], now, base, phase)
        self._bars(data, axis_updates, axes[(2, 2)], now, base)
        titles = [a | {"font": {**a.get("font", {}), "size": SUBPLOT_TITLE_SIZE}}
                  for a in layout.get("annotations", [])]
        frame = base_layout(f"WhatIf — {self.name}: switches vs kernels, roofline and TTFT / TPOT",
                            height=self.figure_height)
        layout = {**layout, **{k: frame[k] for k in ("title", "font", "showlegend")},
                  "annotations": [*titles, *self._labels],
                  "legend": dict(orientation="h", y=-0.1, x=0, xanchor="left"), "barmode": "group"}
        for key, update in axis_updates.items():
            layout[key] = {**layout.get(key, {}), **update}
        return go.Figure(dict(data=data, layout=layout), _validate=False)

    def _timeline(self, data: list[dict], axis: dict[str, dict], refs: tuple[str, str], now: Outcome, base: Outcome,
                  phase: str) -> None:
        order_all: list[str] = []
        for label, outcome in (("baseline", base), ("now", now)):
            lanes, order = outcome.lanes(phase)
            merged: dict[str, list] = {}
            for name in order:
                key = f"{label} · " + ("kernels" if name not in ("host", "program correction", "PCIe") else name)
                merged.setdefault(key, []).extend(lanes[name])
            for key, events in merged.items():
                data.append(dict(type="bar", x=[e.dur_us for e, _ in events], y=[key] * len(events),
                                 base=[e.start_us for e, _ in events], orientation="h", showlegend=False,
                                 marker=dict(color=[c for _, c in events], line=dict(width=0),
                                             opacity=0.55 if label == "baseline" else 1.0),
                                 customdata=[[e.name] for e, _ in events],
                                 hovertemplate="%{customdata[0]}<br>%{base:.2f} + %{x:.2f} µs (modeled)<extra>"
                                               + key + "</extra>", xaxis=refs[0], yaxis=refs[1]))
                order_all.append(key)
        span = max(now.span_us(phase), base.span_us(phase))
        axis[_axis_key(refs[1])] = dict(categoryorder="array", categoryarray=list(reversed(order_all)))
        axis[_axis_key(refs[0])] = dict(range=[0, span * 1.02], title=dict(text=style.MODELED_TIME_AXIS))

    def _roofline(self, data: list[dict], axis: dict[str, dict], refs: tuple[str, str], now: Outcome, base: Outcome,
                  phase: str) -> None:
        """The current program's Roofline (ceilings and kernels), with the baseline's kernels and ceilings in grey."""
        roofline = Roofline(now.programs[phase])
        drawn = roofline.trace_dicts()
        ceilings = [t for t in drawn if t["mode"] == "lines"]
        kernels = [t for t in drawn if t["mode"] != "lines"]
        for trace in ceilings:
            data.append(trace | dict(xaxis=refs[0], yaxis=refs[1]))
        # the kernels as one trace (each says its name on hover), so a switch that changes the kernel count
        # updates that trace in place instead of adding and removing traces in the live widget
        # (labelled by annotations placed apart, as Roofline does: text on the markers would stack at one point)
        data.append(dict(type="scatter", mode="markers", name="kernels", showlegend=False, hoverinfo="text",
                         x=[t["x"][0] for t in kernels], y=[t["y"][0] for t in kernels],
                         hovertext=[t["hovertext"][0] for t in kernels],
                         marker={key: [t["marker"][key] for t in kernels] for key in ("color", "size", "symbol")}
                         | dict(line=dict(color=style.NEUTRAL["white"], width=1)),
                         meta={"kernels": [t["meta"]["kernel"] for t in kernels]}, xaxis=refs[0], yaxis=refs[1]))
        baseline = Roofline(base.programs[phase])
        points = [(r, p) for r in baseline.records() if (p := baseline.point(r)) is not None]
        xs = list(ceilings[0]["x"])
        data.append(dict(type="scatter", x=xs, y=[min(base.cfg.dram_bandwidth * x, base.cfg.peak_flops) / 1e12
                                                  for x in xs],
                         mode="lines", name="baseline ceilings", line=dict(color=style.BASELINE_COLOR, dash="dash"),
                         visible=base.cfg != now.cfg, hoverinfo="skip", xaxis=refs[0], yaxis=refs[1]))
        data.append(dict(type="scatter", x=[p[0] for _, p in points], y=[p[1] / 1e12 for _, p in points],
                         mode="markers", name="baseline kernels",
                         marker=dict(symbol="circle-open", size=9, color=style.BASELINE_COLOR),
                         hovertext=[f"baseline {r.name}: {r.time_us:.2f} µs" for r, _ in points], hoverinfo="text",
                         xaxis=refs[0], yaxis=refs[1]))
        (x0, x1), (y0, y1) = roofline.axis_ranges()
        for x, y in ((p[0], p[1] / 1e12) for _, p in points):     # the baseline's kernels stay on the axes too
            x0, x1 = min(x0, math.floor(math.log10(x))), max(x1, math.ceil(math.log10(x)))
            y0, y1 = min(y0, math.floor(math.log10(y))), max(y1, math.log10(y) + 0.5)
        ranges = ((x0, x1), (y0, y1))
        self._labels.extend(roofline.label_annotations(self._panel_area(refs), refs, ranges=ranges))
        axis[_axis_key(refs[0])] = dict(type="log", title=dict(text="FLOP per DRAM byte"), range=[x0, x1])
        axis[_axis_key(refs[1])] = dict(type="log", title=dict(text="modeled TFLOP/s"), range=[y0, y1])

    def _panel_area(self, refs: tuple[str, str]) -> Box:
        """A subplot's plotting area in figure pixels at the width labels are fitted to."""
        m = self._grid["margin"]
        width, height = FIT_WIDTH - m["l"] - m["r"], self.figure_height - m["t"] - m["b"]
        (x0, x1), (y0, y1) = (self._grid[_axis_key(ref)]["domain"] for ref in refs)
        return Box(m["l"] + x0 * width, m["t"] + (1 - y1) * height, m["l"] + x1 * width, m["t"] + (1 - y0) * height)

    def _bars(self, data: list[dict], axis: dict[str, dict], refs: tuple[str, str], now: Outcome,
              base: Outcome) -> None:
        was = base.metrics()
        names = list(was)
        for label, outcome, color in (("baseline", base, style.BASELINE_COLOR), ("now", now, style.CHANGED_COLOR)):
            scores = outcome.metrics()
            ys = [scores[name] for name in names]
            text = [f"{y:.3f}" if label == "baseline" else f"{y:.3f}<br>({_delta(y, was[name])})"
                    for y, name in zip(ys, names)]
            data.append(dict(type="bar", x=names, y=ys, name=label, marker=dict(color=color), text=text,
                             textposition="outside", constraintext="none", cliponaxis=False,
                             hovertemplate="%{x}: %{y:.3f} ms (modeled estimate)<extra>" + label + "</extra>",
                             xaxis=refs[0], yaxis=refs[1]))
        top = max([*now.metrics().values(), *was.values()])
        axis[_axis_key(refs[1])] = dict(title=dict(text="ms (modeled)"), range=[0, top * 1.25])


def _axis_key(ref: str) -> str:
    return ("xaxis" if ref.startswith("x") else "yaxis") + ref[1:]


def _delta(now: float, base: float) -> str:
    if not base or base != base:
        return "n/a"
    change = (now - base) / base
    return "same" if abs(change) < 5e-4 else f"{change:+.1%}"
