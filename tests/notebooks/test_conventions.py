"""The notebook rules every committed tutorial and exploration notebook follows (cheap checks, no kernel)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from nbrun import ALL_NOTEBOOKS, ROOT, TUTORIALS

MAX_BYTES = 1_500_000
_ids = {"ids": lambda p: f"{p.parent.name}/{p.name}"}


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 5, [p.name for p in TUTORIALS]
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", p.name) for p in TUTORIALS), [p.name for p in TUTORIALS]


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, **_ids)
def test_committed_executed_small_and_seeded(path):
    size = path.stat().st_size
    raw = path.read_text()
    assert size < MAX_BYTES, f"{path.name} is {size / 1e6:.2f} MB"
    assert "plotly.min.js" not in raw and "window.PlotlyConfig" not in raw, \
        f"{path.name} embeds plotly.js: keep the plotly_mimetype renderer"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = code[0].source
    assert "import spyre_lab" in first and "manual_seed(" in first, f"{path.name}: first code cell imports and seeds"
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: run it top to bottom (make notebooks): {counts}"
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{path.name} cell {index} stored an error"


@pytest.mark.parametrize("path", TUTORIALS, **_ids)
def test_tutorial_shape(path):
    """Opens with what the learner will be able to do, links the code it explains, ends with a recap."""
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "You will be able to" in nb.cells[0].source, f"{path.name}: open with what the learner will be able to do"
    links = re.findall(r"\]\((\.\./spyre_lab/[^)#]+)\)", text)
    assert links, f"{path.name}: link the files that implement each mechanism"
    for link in links:
        assert (path.parent / link).resolve().exists(), f"{path.name} links to a missing file {link}"
    assert "## Recap" in text and "Where this shows up in the real stack" in text, f"{path.name}: end with the recap"
    assert "/work/" not in nbformat.writes(nb), f"{path.name} points outside the project"
    assert (ROOT / "tutorials" / "nbval_sanitize.cfg").exists()
