"""``make nbval`` really compares outputs: a tutorial whose stored number was changed fails it.

The sanitize file must only normalise run-to-run noise (widget ids, uuids, addresses, wall times); if it
masked digits in general, this test would pass the tampered notebook and fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def test_a_tampered_stored_output_fails_nbval(tmp_path):
    source = ROOT / "tutorials" / "01_tour.ipynb"
    nb = nbformat.read(source, as_version=4)
    target = next(c for c in nb.cells if c.cell_type == "code" and "layout.describe()" in c.source)
    stream = next(o for o in target.outputs if o.output_type == "stream")
    assert "the layout says 4,096" in stream.text
    stream.text = stream.text.replace("the layout says 4,096", "the layout says 4,097")
    nbformat.write(nb, tmp_path / "01_tour.ipynb")
    shutil.copy(ROOT / "tutorials" / "nbval_sanitize.cfg", tmp_path)
    # the environment the notebooks were committed in: one card (other tests may have set SPYRE_LAB_DEVICES)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPYRE_LAB")}
    env.update(OMP_NUM_THREADS="1", PLOTLY_RENDERER="plotly_mimetype")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--nbval",
         "--nbval-current-env",
         "--nbval-sanitize-with", str(tmp_path / "nbval_sanitize.cfg"), str(tmp_path / "01_tour.ipynb")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed" in done.stdout and "4,097" in done.stdout, done.stdout[-3000:]


def test_a_notebook_with_views_as_run_notebooks_writes_it_passes_strict_nbval(tmp_path):
    """What ``make notebooks`` adds for readers without a kernel (saved widget state, a static picture after each
    view) keeps strict nbval deterministic: nbval compares the view's text, not its picture or its widget ids."""
    import pytest

    sys.path.insert(0, str(ROOT / "scripts"))
    import run_notebooks

    if not Path(run_notebooks.CHROMIUM).exists() and os.environ.get("SPYRE_LAB_REQUIRE_BROWSER") != "1":
        pytest.skip(f"no Chromium at {run_notebooks.CHROMIUM} for the static pictures")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from spyre_lab import viz\nview = viz.LayoutView((8, 100))\nview"),
                nbformat.v4.new_code_cell("view.controls['element'].value = 5\nview")]
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "views.ipynb"
    nbformat.write(nb, path)
    nbformat.write(run_notebooks.execute(path), path)
    assert sum("image/png" in o.get("data", {}) for c in nbformat.read(path, 4).cells for o in c.outputs) == 2
    shutil.copy(ROOT / "tutorials" / "nbval_sanitize.cfg", tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPYRE_LAB")}
    env.update(OMP_NUM_THREADS="1", PLOTLY_RENDERER="plotly_mimetype", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--nbval",
         "--nbval-current-env",
         "--nbval-sanitize-with", str(tmp_path / "nbval_sanitize.cfg"), str(path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:]
