"""View speed: build time of every spyre_lab.viz view and the time one control change takes to redraw it.

The data is tiny-granite-sized: the engine serving a few prompts on the spyre platform (DecodeTimeline,
KVCacheView), one tiny-granite decoder layer compiled for the card (WhatIf, Roofline, FusionView, ...), and a
softmax kernel event-simulated on 32 cores (DataflowView). Times are process CPU time (the shared machine's load
does not decide them): the first change of each control (a new state; WhatIf recompiles the kernels for a new
card or fusion setting) and the median of ``--repeat`` further changes (each a new notch: a slider step is a new
state until it comes round again); setting up the data (engine warmup, compiles of the baseline) is not counted.
The first row is ``import spyre_lab.viz`` in a fresh interpreter, split into the ``import spyre_lab`` it needs
(torch and the device model) and the views' own part. Every row prints its goal and whether it met it. Run:

    .venv/bin/python benchmarks/bench_viz.py [SECTION ...] [--repeat 5]   (--help lists the views)
"""

from __future__ import annotations

import functools
import gc
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from sections import chosen, parser

GOAL_S = 0.3
"""Every control change, first or repeated, within this much CPU time."""
IMPORT_GOAL_S = 1.0
"""``import spyre_lab.viz`` in a fresh interpreter."""
_IMPORT_PROBE = """
import time
t0 = time.process_time()
import spyre_lab
{preload}
t1 = time.process_time()
import spyre_lab.viz
t2 = time.process_time()
import sys
print(t1 - t0, t2 - t1, int("nbformat" in sys.modules), int("jsonschema" in sys.modules))
"""


def import_times(in_kernel: bool) -> tuple[float, float, bool]:
    """CPU seconds of ``import spyre_lab`` and then of ``spyre_lab.viz`` in a fresh interpreter, and whether
    nbformat / jsonschema came with them (plotly's widget path pulls in their schema format checkers).

    ``in_kernel``: IPython is imported before the clock starts on the views, as a Jupyter kernel has it loaded
    before any cell runs (ipywidgets needs it; in a plain interpreter the views pay for it)."""
    probe = _IMPORT_PROBE.format(preload="import IPython" if in_kernel else "")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                         timeout=300).stdout.split()
    return float(out[0]), float(out[1]), bool(int(out[2]) or int(out[3]))


def print_import_rows() -> None:
    for in_kernel, where in ((False, "fresh interpreter"), (True, "as in a Jupyter kernel (IPython loaded)")):
        base_s, viz_s, schemas = import_times(in_kernel)
        total = base_s + viz_s
        verdict = "met" if total < IMPORT_GOAL_S else f"views part met, {base_s:.2f} s is torch + spyre_lab" \
            if viz_s < IMPORT_GOAL_S else "NOT met"
        print(f"import spyre_lab.viz, {where}: {total:.2f} s CPU = import spyre_lab {base_s:.2f}"
              f"{' + IPython' if in_kernel else ''} + views {viz_s:.2f}; "
              f"{'nbformat/jsonschema imported' if schemas else 'no nbformat/jsonschema'}; "
              f"goal < {IMPORT_GOAL_S} s: {verdict}", flush=True)


def next_value(control: Any) -> None:
    """Move a control one notch: the next option of a selection, the other state of a switch, a slider step."""
    if hasattr(control, "index") and getattr(control, "options", None):
        control.index = (control.index + 1) % len(control.options)
    elif isinstance(control.value, bool):
        control.value = not control.value
    elif hasattr(control, "max"):
        step = getattr(control, "step", 1) or 1
        value = control.value + step
        control.value = control.min if value > control.max else value
    else:
        raise TypeError(f"do not know how to move a {type(control).__name__}")


class FullCollections:
    """CPU time the interpreter spends in full (generation 2) garbage collections while it is active.

    A full collection walks every tracked object (torch, the compiled programs, the views' caches: some 400,000
    in this process), so when one falls inside a control change it adds 0.2 s or so to that change alone; the
    table shows it beside the change so a slow row can be told apart from a slow view."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: Any) -> None:
        gc.callbacks.remove(self)


def measure(name: str, make: Callable[[], Any], repeat: int) -> dict[str, Any]:
    started = time.process_time()
    view = make()
    view.figure  # noqa: B018
    build_s = time.process_time() - started
    started = time.process_time()
    view.widget  # noqa: B018
    widget_s = time.process_time() - started
    changes: dict[str, list[tuple[float, float]]] = {}   # control -> (CPU s, of which full gc s) per change
    for control_name, control in view.controls.items():
        if getattr(control, "disabled", False):
            continue
        runs = []
        for _ in range(1 + repeat):
            with FullCollections() as full:
                started = time.process_time()
                next_value(control)
                spent = time.process_time() - started
            runs.append((spent, full.seconds))
        changes[control_name] = runs
    json_kb = len(view.figure.to_json()) / 1e3
    return {"view": name, "build_s": build_s, "widget_s": widget_s, "changes": changes, "json_kb": json_kb}


# ---- the data ------------------------------------------------------------------------------------------
@functools.cache
def engine_stats() -> Any:
    from spyre_lab.engine import LLM, SamplingParams
    from spyre_lab.engine.platforms.spyre import SpyrePlatform

    llm = LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=[64], batch_buckets=[1, 2, 4]),
              max_model_len=64, max_num_seqs=4, num_kv_blocks=12, block_size=8)
    llm.warmup(show_progress=False)
    prompts = ["count from 5 to 12:", "count from 5 to 9:", "letters from c to h:", "3 + 4 ="]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    return llm.stats


@functools.cache
def layer_program() -> Any:
    from spyre_lab.compiler.backend import compile_graph
    from spyre_lab.compiler.examples import granite_layer, layer_inputs

    torch.manual_seed(0)
    fn = functools.partial(granite_layer, heads=4, kv_heads=2)
    fn.__name__ = "tiny-granite layer"  # type: ignore[attr-defined]
    return compile_graph(fn, layer_inputs(128, 4, 2, 256, 64))


@functools.cache
def softmax_trace() -> Any:
    from spyre_lab.device.config import SPYRE
    from spyre_lab.device.kernels import softmax_kernel
    from spyre_lab.device.sim import simulate

    return simulate(softmax_kernel(1024, 1024, cores=32, cfg=SPYRE, fused=True), SPYRE, mode="event").trace


def _decode_timeline():
    """DecodeTimeline over a few engine steps of tiny-granite on the spyre platform."""
    from spyre_lab import viz

    return viz.DecodeTimeline(engine_stats())


def _kv_cache():
    """KVCacheView over the same engine run, replayed step by step."""
    from spyre_lab import viz

    return viz.KVCacheView(engine_stats())


def _whatif():
    """WhatIf on one tiny-granite decoder layer (each new setting recompiles)."""
    from spyre_lab import viz

    return viz.WhatIf.granite_layer("tiny-granite")


def _roofline():
    """Roofline of the compiled tiny-granite layer."""
    from spyre_lab import viz

    return viz.Roofline(layer_program())


def _dataflow():
    """DataflowView of a 1024x1024 softmax event-simulated on 32 cores."""
    from spyre_lab import viz

    return viz.DataflowView(softmax_trace())


def _fusion():
    """FusionView of the compiled tiny-granite layer (each rule checkbox recompiles)."""
    from spyre_lab import viz

    return viz.FusionView(layer_program())


def _work_division():
    """WorkDivisionView of the layer's first kernel (core slider, naive/planned)."""
    from spyre_lab import viz

    return viz.WorkDivisionView(layer_program(), kernel=0)


def _layout():
    """LayoutView of a (64, 100) fp16 tensor."""
    from spyre_lab import viz

    return viz.LayoutView((64, 100))


SECTIONS: dict[str, Callable[[], Any]] = {
    "DecodeTimeline": _decode_timeline, "KVCacheView": _kv_cache, "WhatIf": _whatif, "Roofline": _roofline,
    "DataflowView": _dataflow, "FusionView": _fusion, "WorkDivisionView": _work_division, "LayoutView": _layout,
}


def _control_detail(name: str, runs: list[tuple[float, float]]) -> str:
    """``cores 0.17/0.18/0.45 (full gc 0.28)``: first, median of the repeats, slowest, and the slowest full gc."""
    times = [t for t, _ in runs]
    median = statistics.median(times[1:]) if len(times) > 1 else times[0]
    gc_s = max(g for _, g in runs)
    return f"{name} {times[0]:.2f}/{median:.2f}/{max(times):.2f}" + (f" (full gc {gc_s:.2f})" if gc_s > 0.02 else "")


def main() -> None:
    cli = parser(__doc__, SECTIONS)
    cli.add_argument("--repeat", type=int, default=3,
                     help="changes per control after the first (their median reported; default 3)")
    args = cli.parse_args()
    wanted = chosen(args.sections, SECTIONS)
    print_import_rows()
    torch.set_num_threads(1)
    import ipywidgets
    import plotly.graph_objects as go

    ipywidgets.Output(), go.Figure()  # the first widget and figure of a process import their machinery; not a view's
    print(f"{'view':>16} {'build s':>8} {'widget s':>9} {'fig KB':>7} {'first chg s':>12} {'median chg s':>13} "
          f"{'max s':>8}  goal every change < {GOAL_S} s CPU; per control: first/median/max s (full gc in a change)")
    for name in wanted:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine_stats() if name in ("DecodeTimeline", "KVCacheView") else None   # data set-up not timed
            row = measure(name, SECTIONS[name], args.repeat)
        runs = row["changes"].values()
        first = max((r[0][0] for r in runs), default=0.0)
        median = max((statistics.median(t for t, _ in r[1:]) if len(r) > 1 else r[0][0] for r in runs), default=0.0)
        worst = max((t for r in runs for t, _ in r), default=0.0)
        worst_no_gc = max((t - g for r in runs for t, g in r), default=0.0)
        verdict = "met" if worst < GOAL_S else "met but for a full gc" if worst_no_gc < GOAL_S else "NOT met"
        detail = ", ".join(_control_detail(k, r) for k, r in row["changes"].items())
        print(f"{name:>16} {row['build_s']:8.2f} {row['widget_s']:9.2f} {row['json_kb']:7.0f} {first:12.3f} "
              f"{median:13.3f} {worst:8.3f}  {verdict}: {detail}", flush=True)


if __name__ == "__main__":
    main()
