"""Re-execute notebooks in place, deterministically, so they are ready to commit (``make notebooks``).

Each notebook runs top to bottom in a fresh kernel started in its own folder, with one thread and plotly's
mimetype renderer (no plotly.js embedded), the same environment ``pytest --nbval`` checks them in. Cell
timing metadata is not stored (it changes on every run and would only add noise to a diff).

A committed notebook is read more often than it is run (GitHub, nbviewer, a Binder whose kernel is starting), so
each widget output is stored so that it opens showing its figure:

* the widget state of every model a displayed widget uses goes into ``metadata.widgets`` (JupyterLab draws a widget
  output only from a live kernel or that state, and shows "Error displaying widget: model not found" otherwise,
  whatever else the output holds); models nothing displays are dropped;
* after each view's widget output comes a static picture of its figure (``image/png``, drawn by plotly.js in
  headless Chromium), which GitHub and nbviewer show; nbval does not compare images, so the strict check stays
  deterministic. The view's figure in the saved state is replaced by a line pointing at that picture, so
  JupyterLab does not draw the figure twice.

Static pictures need Chromium (``apt-get install chromium``) and the ``playwright`` package.

    python scripts/run_notebooks.py                   # every notebook in tutorials/ and notebooks/
    python scripts/run_notebooks.py tutorials/01_tour.ipynb
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tutorials", "notebooks")
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PLOTLY_RENDERER": "plotly_mimetype",
              "PYTHONHASHSEED": "0"}
MAX_BYTES = 1_500_000
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
VIEW_CLASS, FIGURE_CLASS = "spyre-lab-view", "spyre-lab-figure"   # spyre_lab.viz.base marks its widgets with these
STATIC_WIDTH = 700            # px: the width the views' labels are fitted to
CHROMIUM = os.environ.get("SPYRE_LAB_CHROMIUM", "/usr/bin/chromium")
SAVED_NOTE = ("The picture below was saved with the notebook; run this cell to make the view live.")


def find_notebooks(args: list[str]) -> list[Path]:
    """The notebooks named (files or folders), or every one in tutorials/ and notebooks/."""
    paths = [Path(a) for a in args] or [ROOT / f for f in FOLDERS]
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(path.glob("*.ipynb")))
        elif path.suffix == ".ipynb" and path.exists():
            found.append(path)
        else:
            raise SystemExit(f"not a notebook or a folder of notebooks: {path}")
    return found


def execute(path: Path, timeout: int = 300):
    """The notebook at ``path`` executed in a fresh kernel (raises on the first failing cell)."""
    import nbformat
    from nbclient import NotebookClient

    os.environ.update(KERNEL_ENV)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            store_widget_state=True, resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    merge = CoalesceStreamsPreprocessor()
    for index, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            merge.preprocess_cell(cell, {}, index)  # one stdout block per cell, however the kernel flushed it
    keep_displayed_widgets(nb)
    add_static_pictures(nb)
    return nb


def model_refs(value: Any) -> set[str]:
    """The widget models a state refers to: ``IPY_MODEL_<id>`` (a child, a layout) or a widget output inside an
    Output (``"model_id": "<id>"``)."""
    return set(re.findall(r'(?:IPY_MODEL_|"model_id": ")([0-9a-f]{32})', json.dumps(value)))


def closure(state: dict[str, Any], model_id: str) -> list[str]:
    """``model_id`` and every model it uses, in the order found (a view: its box first)."""
    found, todo = [], [model_id]
    while todo:
        mid = todo.pop(0)
        if mid in found or mid not in state:
            continue
        found.append(mid)
        todo.extend(sorted(model_refs(state[mid]["state"])))
    return found


def widget_outputs(nb) -> list[tuple[int, int, str]]:
    """(cell index, output index, model id) of every widget output."""
    return [(c, o, out["data"][WIDGET_VIEW]["model_id"])
            for c, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for o, out in enumerate(cell.get("outputs", [])) if WIDGET_VIEW in out.get("data", {})]


def keep_displayed_widgets(nb) -> None:
    """Keep the saved state of the models some output displays (and what they use); drop the rest."""
    saved = nb.metadata.get("widgets", {}).get(WIDGET_STATE)
    if not saved:
        nb.metadata.pop("widgets", None)
        return
    state = saved["state"]
    keep = {mid for _, _, root in widget_outputs(nb) for mid in closure(state, root)}
    saved["state"] = {mid: state[mid] for mid in sorted(keep)}
    if not keep:
        nb.metadata.pop("widgets", None)


def _view_figure(state: dict[str, Any], root: str) -> str | None:
    """The model id of the figure Output of the view displayed as ``root`` (None if ``root`` is no view)."""
    ids = closure(state, root)
    if VIEW_CLASS not in state.get(root, {}).get("state", {}).get("_dom_classes", []):
        return None
    return next((m for m in ids if FIGURE_CLASS in state[m]["state"].get("_dom_classes", [])), None)


def add_static_pictures(nb) -> None:
    """After each view's widget output, a static picture of its figure; the saved figure becomes a pointer to it."""
    saved = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    wanted: list[tuple[int, int, str]] = []
    figures: dict[str, dict] = {}
    for c, o, root in widget_outputs(nb):
        figure_id = _view_figure(saved, root)
        if figure_id is None:
            continue
        outputs = saved[figure_id]["state"].get("outputs", [])
        shown = next((out["data"][PLOTLY_MIME] for out in outputs if PLOTLY_MIME in out.get("data", {})), None)
        if shown is not None:
            figures[figure_id] = shown
        if figure_id in figures:
            wanted.append((c, o, figure_id))
    if not wanted:
        return
    pictures = render_pngs([figures[f] for f in dict.fromkeys(f for _, _, f in wanted)])
    picture_of = dict(zip(dict.fromkeys(f for _, _, f in wanted), pictures))
    for c, o, figure_id in reversed(wanted):        # from the end, so earlier output indices stay valid
        picture = {"output_type": "display_data", "data": {"image/png": picture_of[figure_id]},
                   "metadata": {"spyre_lab": {"static_picture_of": figure_id}}}
        nb.cells[c].outputs.insert(o + 1, nbformat_node(picture))
    for figure_id in picture_of:
        saved[figure_id]["state"]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": SAVED_NOTE}]


def nbformat_node(value: dict) -> Any:
    import nbformat

    return nbformat.from_dict(value)


def render_pngs(figures: list[dict], width: int = STATIC_WIDTH) -> list[str]:
    """Each plotly figure (as JSON) drawn by plotly.js in headless Chromium: base64 PNGs."""
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"static pictures of the views need Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        raise SystemExit("static pictures of the views need the playwright package (pip install playwright; "
                         "no browser download needed)") from error
    import plotly

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    pictures = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.set_content("<!doctype html><html><body></body></html>")
        page.add_script_tag(path=str(plotly_js))
        for figure in figures:
            url = page.evaluate(
                "([fig, width]) => Plotly.toImage({data: fig.data, layout: fig.layout, config: fig.config || {}},"
                " {format: 'png', width: width, height: (fig.layout && fig.layout.height) || 420})",
                [figure, width])
            png = url.split(",", 1)[1]
            assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
            pictures.append(png)
        browser.close()
    return pictures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="notebooks or folders (default: tutorials/ and notebooks/)")
    args = parser.parse_args(argv)
    import nbformat

    for path in find_notebooks(args.paths):
        start = time.perf_counter()
        nb = execute(path)
        nbformat.write(nb, path)
        size = path.stat().st_size
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{time.perf_counter() - start:.1f} s wall, {size / 1e3:.0f} kB")
        if size > MAX_BYTES:
            print(f"  {path.name} is {size / 1e6:.1f} MB: over the {MAX_BYTES / 1e6:.1f} MB budget "
                  "(is plotly.js embedded? keep the plotly_mimetype renderer)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
