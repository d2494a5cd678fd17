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
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", str(tmp_path / "nbval_sanitize.cfg"), str(tmp_path / "01_tour.ipynb")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed" in done.stdout and "4,097" in done.stdout, done.stdout[-3000:]
