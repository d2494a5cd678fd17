"""A committed notebook opens showing its figures, wherever it is read without a kernel.

How each reader draws a widget output (``application/vnd.jupyter.widget-view+json``):

* JupyterLab (a fresh Binder, a clone opened before running): the widget renderer outranks every other mime type
  in the output and, when the model is neither in a kernel nor in ``metadata.widgets``, shows "Error displaying
  widget: model not found" (``WidgetRenderer.renderModel`` in @jupyter-widgets/jupyterlab-manager). So every model a
  displayed widget uses must be in the saved state.
* nbconvert (nbviewer; GitHub renders with nbconvert too): uses the widget output only if its model is in the saved
  state (``WidgetsDataTypeFilter``), and draws it with JavaScript that GitHub does not run. So a view's figure also
  needs a static picture (``image/png``) beside the widget output, which every reader draws.
* GitHub refuses the whole notebook when ``metadata.widgets`` lacks the ``state`` key ("Invalid Notebook").

``scripts/run_notebooks.py`` (``make notebooks``) writes notebooks this way.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from nbrun import ALL_NOTEBOOKS, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import run_notebooks

WIDGET_VIEW = run_notebooks.WIDGET_VIEW
WIDGET_STATE = run_notebooks.WIDGET_STATE


def _png_size(b64: str) -> tuple[int, int]:
    raw = base64.b64decode(b64)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "image/png that is not a PNG"
    return struct.unpack(">II", raw[16:24])


def problems(nb) -> list[str]:
    """What a reader without a kernel would see broken, one line per output (empty: the notebook opens fine)."""
    found: list[str] = []
    widgets = nb.metadata.get("widgets")
    state: dict = {}
    if widgets is not None:
        saved = widgets.get(WIDGET_STATE, {})
        if "state" not in saved or saved.get("version_major") != 2:
            found.append("metadata.widgets has no 'state' (version 2): GitHub shows 'Invalid Notebook'")
        state = saved.get("state", {})
        for mid, model in state.items():
            if "_esm" in model.get("state", {}):
                found.append(f"model {mid} ({model.get('model_name')}) needs its own front-end module (_esm)")
    for c, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        line = next((s for s in reversed(cell.source.splitlines()) if s.strip()), "")[:70]
        for o, out in enumerate(cell.get("outputs", [])):
            if WIDGET_VIEW not in out.get("data", {}):
                continue
            where = f"cell {c} ({line!r}) output {o}"
            root = out["data"][WIDGET_VIEW]["model_id"]
            if root not in state:
                found.append(f"{where}: model not found (no saved widget state for {root})")
                continue
            uses = run_notebooks.closure(state, root)
            lost = sorted({ref for mid in uses for ref in run_notebooks.model_refs(state[mid]["state"])} - set(state))
            if lost:
                found.append(f"{where}: uses models not in the saved state: {lost}")
            if run_notebooks.VIEW_CLASS not in state[root]["state"].get("_dom_classes", []):
                continue
            pictures = [p for p in cell.outputs[o + 1:] if "image/png" in p.get("data", {})]
            if not pictures and "image/png" not in out["data"]:
                found.append(f"{where}: a view with no static picture (GitHub and nbviewer would show no figure)")
            for picture in pictures[:1]:
                width, height = _png_size(picture["data"]["image/png"])
                if width < 300 or height < 150:
                    found.append(f"{where}: its static picture is {width}x{height} px")
    return found


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_committed_notebook_opens_with_its_figures(path):
    nb = nbformat.read(path, as_version=4)
    assert not problems(nb), "\n".join([f"{path.relative_to(ROOT)} (re-run it: make notebooks):", *problems(nb)])
    assert path.stat().st_size <= run_notebooks.MAX_BYTES


def test_the_check_sees_each_way_a_widget_output_opens_broken():
    """The checker itself: a widget output without state, with a lost child, a view without its picture, and a
    widget state GitHub rejects, each reported; the complete form passes."""
    box, child, fig = "a" * 32, "b" * 32, "c" * 32
    view = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
            "data": {WIDGET_VIEW: {"model_id": box, "version_major": 2, "version_minor": 0}, "text/plain": "V"}}
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + struct.pack(">II", 700, 420) + b"\0" * 5).decode()
    picture = {"output_type": "display_data", "metadata": {}, "data": {"image/png": png}}
    state = {box: {"model_name": "VBoxModel", "state": {"children": [f"IPY_MODEL_{fig}"],
                                                        "_dom_classes": [run_notebooks.VIEW_CLASS]}},
             fig: {"model_name": "OutputModel", "state": {"layout": f"IPY_MODEL_{child}", "outputs": []}},
             child: {"model_name": "LayoutModel", "state": {}}}

    def notebook(outputs, saved):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("viz.FusionView(program)", outputs=outputs)]
        if saved is not None:
            nb.metadata.widgets = saved
        return nbformat.from_dict(nb)

    complete = {WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    assert problems(notebook([view, picture], complete)) == []
    assert "model not found" in problems(notebook([view, picture], None))[0]
    partial = {WIDGET_STATE: {"state": {k: v for k, v in state.items() if k != child}, "version_major": 2}}
    assert "not in the saved state" in problems(notebook([view, picture], partial))[0]
    assert "no static picture" in problems(notebook([view], complete))[0]
    assert "Invalid Notebook" in problems(notebook([view, picture], {WIDGET_STATE: state}))[0]


def test_run_notebooks_writes_a_notebook_that_opens_with_its_figures(tmp_path):
    """The writer the committed notebooks come from: a notebook with a view, displayed twice and changed between,
    executed by scripts/run_notebooks.py passes the check, keeps only displayed models, and its pictures are the
    figure (not the note) while the saved Output points at them."""
    if not Path(run_notebooks.CHROMIUM).exists() and os.environ.get("SPYRE_LAB_REQUIRE_BROWSER") != "1":
        pytest.skip(f"no Chromium at {run_notebooks.CHROMIUM} for the static pictures")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from spyre_lab import viz\nhidden = viz.LayoutView((4, 64)).widget\n"
                                          "view = viz.LayoutView((8, 100))\nview"),
                nbformat.v4.new_code_cell("view.controls['element'].value = 5\nview")]
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "one_view.ipynb"
    nbformat.write(nb, path)
    done = run_notebooks.execute(path)
    assert problems(done) == []
    state = done.metadata.widgets[WIDGET_STATE]["state"]
    assert sum(m["model_name"] == "VBoxModel" for m in state.values()) == 1       # the hidden view is dropped
    (figure,) = [m for m in state.values() if run_notebooks.FIGURE_CLASS in m["state"].get("_dom_classes", [])]
    assert figure["state"]["outputs"][0]["text"] == run_notebooks.SAVED_NOTE
    pictures = [o for c in done.cells for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(pictures) == 2 and _png_size(pictures[0]["data"]["image/png"])[0] == run_notebooks.STATIC_WIDTH
    text = [o["data"]["text/plain"] for c in done.cells for o in c.outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(text) == 2 and text[0] != text[1] and all(t.startswith("LayoutView: ") for t in text)
    assert len(json.dumps(done)) < 400_000
