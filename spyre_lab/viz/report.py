"""The run report: one self-contained HTML file with the static figure of every view of a run.

``spyre-lab report --out DIR`` (and ``make demo``) writes ``DIR/report.html``. plotly.js is inlined once, so
the file opens offline in any browser and can be mailed or attached to a workshop page. The run is what a
``make demo`` left in ``DIR`` (``engine_stats.json``, ``trace.json``); when nothing is there, the report runs a
small job of its own first (tiny-granite served on the spyre platform) and saves it in the same place.

Each section is a view's ``.figure`` with the view's one-line caption above it; a section that cannot be drawn
(a missing file, a view that failed) says why instead of disappearing.
"""

from __future__ import annotations

import datetime
import html
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

STATS_FILE = "engine_stats.json"
DEVICE_TRACE_FILE = "trace.json"
FIDELITY_FILE = "fidelity.json"
REPORT_FILE = "report.html"
REPORT_PROMPTS = ("count from 5 to 12:", "count from 5 to 9:", "letters from c to h:", "3 + 4 =")


@dataclass
class Section:
    """One figure of the report: a heading, the caption (what the reader is looking at), the figure."""

    title: str
    caption: str
    figure: go.Figure | None = None
    error: str = ""


def section(title: str, make: Callable[[], Any]) -> Section:
    """Build a view (or figure) for the report; a failure becomes a visible note, never a missing section."""
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run already printed its warnings; the report shows figures
            view = make()
        figure = view if isinstance(view, go.Figure) else view.figure
        caption = getattr(view, "caption", "")
        return Section(title, f"{caption} (built in {time.perf_counter() - started:.1f} s)", figure)
    except Exception as error:  # a report with one broken section is still worth writing
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()
        return Section(title, "", None, f"could not draw this section: {detail}")


def write_html(sections: list[Section], path: str | Path, title: str = "spyre_lab run report",
               intro: str = "") -> Path:
    """Write the sections as one HTML file with plotly.js inlined once (opens offline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:Inter,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1500px}"
        "h2{margin-top:36px;border-bottom:1px solid #ddd;padding-bottom:4px}.caption{color:#444;margin:6px 0}"
        ".error{color:#a33}.toc a{margin-right:14px}</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='caption'>{intro}</p>" if intro else "",
        "<p class='toc'>" + "".join(f"<a href='#s{i}'>{html.escape(s.title)}</a>" for i, s in enumerate(sections))
        + "</p>",
    ]
    for i, s in enumerate(sections):
        parts.append(f"<h2 id='s{i}'>{html.escape(s.title)}</h2>")
        if s.caption:
            parts.append(f"<p class='caption'>{html.escape(s.caption)}</p>")
        if s.figure is not None:
            parts.append(pio.to_html(s.figure, full_html=False, include_plotlyjs=False, div_id=f"fig{i}",
                                     config={"displaylogo": False, "responsive": True}))
        else:
            parts.append(f"<p class='error'>{html.escape(s.error)}</p>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def run_small_job(out: Path, show_progress: bool = True) -> Path:
    """Serve a few prompts with tiny-granite on the spyre platform and save its stats (for a report from scratch)."""
    from spyre_lab.engine import LLM, SamplingParams
    from spyre_lab.engine.platforms.spyre import SpyrePlatform

    llm = LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=[64], batch_buckets=[1, 2, 4]),
              max_model_len=64, max_num_seqs=4, num_kv_blocks=12, block_size=8)
    llm.warmup(show_progress=show_progress)
    llm.generate(list(REPORT_PROMPTS), SamplingParams(temperature=0, max_tokens=12), use_tqdm=show_progress)
    return llm.stats.save_json(out / STATS_FILE)


def build_sections(out: Path) -> list[Section]:
    """Every view this run's files can feed, in the workshop's order (device -> compiler -> engine)."""
    from spyre_lab import viz

    sections: list[Section] = [section("Layout: a host tensor beside its stickified device layout",
                                       lambda: viz.LayoutView((64, 100)))]
    device_trace = out / DEVICE_TRACE_FILE
    if device_trace.exists():
        sections.append(section("Dataflow: cores x units over modeled time (device section of the demo)",
                                lambda: viz.DataflowView.from_json(device_trace)))
    sections.append(section("Fusion: the decoder layer's LoopIR before and after fusion",
                            lambda: viz.FusionView(_layer_program())))
    sections.append(section("Work division: the decoder layer's biggest kernel over the cores",
                            lambda: viz.WorkDivisionView(_layer_program())))
    sections.append(section("Roofline: the decoder layer's prefill kernels", lambda: viz.Roofline(_layer_program())))
    sections.append(section("What if: one tiny-granite decoder layer, compiled and launched (baseline configuration)",
                            lambda: viz.WhatIf.granite_layer("tiny-granite")))
    fidelity = out / FIDELITY_FILE
    if fidelity.exists():
        sections.append(section("Fidelity: modeled vs reference time per kernel, on both machines",
                                lambda: viz.Fidelity.from_json(fidelity)))
    else:
        sections.append(Section("Fidelity", "", None, f"no {FIDELITY_FILE} in {out}: run `spyre-lab report` "
                                                      f"without --no-run, or `spyre-lab fidelity --json > "
                                                      f"{out / FIDELITY_FILE}`"))
    stats = out / STATS_FILE
    if stats.exists():
        sections.append(section("Decode timeline: every engine step, and one step's modeled lanes",
                                lambda: viz.DecodeTimeline(stats)))
        sections.append(section("KV cache: blocks, block tables and block counts over the run",
                                lambda: viz.KVCacheView(stats)))
    else:
        sections.append(Section("Engine", "", None, f"no {STATS_FILE} in {out}: run `make demo` or "
                                                    "`spyre-lab report` without --no-run"))
    return sections


def _layer_program() -> Any:
    """One tiny-granite decoder layer (its shapes, random fp16 weights) compiled for the card, prefill of 64."""
    import functools

    import torch

    from spyre_lab.compiler.backend import compile_graph
    from spyre_lab.compiler.examples import granite_layer, layer_inputs

    torch.manual_seed(0)
    fn = functools.partial(granite_layer, heads=4, kv_heads=2)
    fn.__name__ = "tiny-granite layer"  # type: ignore[attr-defined]
    return compile_graph(fn, layer_inputs(128, 4, 2, 256, 64))   # cached: every section gets the same Program


def write_report(out_dir: str | Path = "out", run: bool = True, show_progress: bool = True,
                 fidelity: dict[str, Any] | None = None) -> Path:
    """``out_dir/report.html`` from the run saved in ``out_dir`` (running a small one first if there is none).

    ``fidelity`` is the fidelity study's result (``spyre_lab.studies.fidelity.fidelity()``, which lives above the
    views, so the caller computes it); given, it is saved as ``out_dir/fidelity.json`` for the Fidelity section."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if fidelity is not None:
        import json

        (out / FIDELITY_FILE).write_text(json.dumps(fidelity, indent=1))
    if run and not (out / STATS_FILE).exists():
        print(f"no {STATS_FILE} in {out}: serving a small tiny-granite job on the spyre platform first", flush=True)
        run_small_job(out, show_progress)
    started = time.perf_counter()
    sections = build_sections(out)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    intro = (f"Written {stamp} from the run in <code>{html.escape(str(out))}</code>. Every device time is "
             "<b>modeled</b> by spyre_lab's device model; host times marked <i>measured</i> are wall-clock on the "
             "machine that ran it. Each figure is the static form of a <code>spyre_lab.viz</code> view; open the "
             "views in JupyterLab to move their controls.")
    path = write_html(sections, out / REPORT_FILE, intro=intro)
    broken = [s.title for s in sections if s.figure is None]
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {len(sections) - len(broken)} figures, "
          f"{time.perf_counter() - started:.1f} s)" + (f"; not drawn: {', '.join(broken)}" if broken else ""))
    return path
