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


# --- the learner's loop: predict cells, hints, wrong answers, glossary, time estimate, shut-down line -------

GLOSSARY = ROOT / "docs" / "glossary.md"
GLOSSARY_TERMS = ("stick", "LX", "PT", "SFU", "corelet", "restickify", "SuperDSC", "correction", "psum", "bucket",
                  "TTFT", "TPOT", "ring", "work division", "fusion", "prefill", "decode", "KV block", "dataflow",
                  "roofline")
_GLOSSARY_LINK = re.compile(r"\[([^\]]+)\]\((?:\.\./)+docs/glossary\.md#([\w-]+)\)")
_ANY_LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def glossary_anchors() -> dict[str, str]:
    """Anchor -> term for every ``### term`` heading of docs/glossary.md."""
    headings = re.findall(r"^### (.+)$", GLOSSARY.read_text(), re.MULTILINE)
    return {github_anchor(h): h.strip() for h in headings}


def _code_sources(nb) -> list[tuple[int, str]]:
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def _top_level_guesses(source: str) -> list[str]:
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name) and t.id.startswith("guess_")]


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, **_ids)
def test_predict_cells_hold_only_guesses_each_revealed_later(path):
    import ast

    nb = nbformat.read(path, as_version=4)
    code = _code_sources(nb)
    for position, (index, source) in enumerate(code):
        guesses = _top_level_guesses(source)
        is_predict = source.lstrip().startswith("# PREDICT")
        if guesses and not is_predict:
            pytest.fail(f"{path.name} cell {index} assigns {guesses}: a guess lives in its own cell whose first "
                        "line is '# PREDICT' (the student copy empties it)")
        if not is_predict:
            continue
        body = ast.parse(source).body
        assert body and all(isinstance(n, ast.Assign) and _top_level_guesses(ast.unparse(n)) for n in body), \
            f"{path.name} cell {index}: a predict cell holds only 'guess_<name> = <value>  # your guess' lines"
        later = "\n".join(s for _, s in code[position + 1:])
        for name in guesses:
            assert re.search(rf'reveal\(\s*"{name}"\s*,\s*{name}\s*,', later), \
                f"{path.name} cell {index}: reveal {name} with reveal(\"{name}\", {name}, actual, unit) in a later cell"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, **_ids)
def test_every_exercise_has_a_hint_and_three_wrong_answers(path):
    from spyre_lab import workshop

    nb = nbformat.read(path, as_version=4)
    for solution, _ in workshop.check_conventions(nb, path.name):
        before = nb.cells[solution - 1] if solution else None
        assert before is not None and workshop.is_hint_cell(before), \
            f"{path.name} cell {solution}: put a markdown cell with <details><summary>Hint</summary>...</details> " \
            "right before the solution cell"
        meta = nb.cells[solution].metadata.get("spyre_lab", {})
        assert "wrong_answer" not in meta, f"{path.name} cell {solution}: 'wrong_answer' is now a list, 'wrong_answers'"
        wrongs = meta.get("wrong_answers", [])
        assert len(wrongs) >= workshop.MIN_WRONG_ANSWERS, \
            f"{path.name} cell {solution}: {len(wrongs)} wrong answers, need {workshop.MIN_WRONG_ANSWERS}"
        for wrong in wrongs:
            assert set(wrong) == {"code", "why"} and wrong["code"].strip() and wrong["why"].strip(), \
                f"{path.name} cell {solution}: each wrong answer is {{'code': ..., 'why': ...}}, got {wrong}"
        assert len({w["code"] for w in wrongs}) == len(wrongs), f"{path.name} cell {solution}: repeated wrong answer"


def test_glossary_defines_every_term():
    anchors = glossary_anchors()
    missing = [t for t in GLOSSARY_TERMS if github_anchor(t) not in anchors]
    assert not missing, f"docs/glossary.md needs a '### term' entry for {missing}"
    text = GLOSSARY.read_text()
    for link in re.findall(r"\]\((\.\./[^)#]+)", text):
        assert (GLOSSARY.parent / link).resolve().exists(), f"docs/glossary.md links to a missing file {link}"


def _prose(nb) -> str:
    """The tutorial's markdown without headings and inline code, where a term counts as used."""
    cells = [c.source for c in nb.cells if c.cell_type == "markdown"]
    text = "\n".join(cells)
    text = re.sub(r"^#.*$", "", text, flags=re.MULTILINE)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), text)


def _term_pattern(term: str) -> re.Pattern:
    flags = 0 if term.isupper() or term[:2].isupper() else re.IGNORECASE
    words = r"\s+".join(re.escape(w) for w in term.split())
    return re.compile(rf"(?<![\w/#.-]){words}(s|es)?(?![\w/])", flags)


@pytest.mark.parametrize("path", TUTORIALS, **_ids)
def test_tutorial_links_glossary_terms_at_first_use(path):
    anchors = glossary_anchors()
    nb = nbformat.read(path, as_version=4)
    prose = _prose(nb)
    linked = _GLOSSARY_LINK.findall(prose)
    assert len({a for _, a in linked}) >= 3, f"{path.name}: link at least three glossary terms at their first use"
    for _, anchor in linked:
        assert anchor in anchors, f"{path.name} links ../docs/glossary.md#{anchor}, which has no '### ' entry"
    # where each linked term first appears, it is the text of its glossary link
    spans = {}
    for match in _GLOSSARY_LINK.finditer(prose):
        spans.setdefault(match.group(2), []).append(match.span(1))
    plain = _ANY_LINK.sub(lambda m: "[" + m.group(1) + "]" + " " * (len(m.group(0)) - len(m.group(1)) - 2), prose)
    for anchor, places in spans.items():
        first = _term_pattern(anchors[anchor]).search(plain)
        assert first is not None, f"{path.name}: the glossary link to #{anchor} is not on the term's own word"
        context = plain[max(0, first.start() - 40):first.end() + 20]
        assert any(start <= first.start() < end for start, end in places), \
            f"{path.name}: '{anchors[anchor]}' first appears in {context!r} " \
            "without its glossary link; link the first use"


@pytest.mark.parametrize("path", TUTORIALS, **_ids)
def test_tutorial_states_time_prerequisites_self_check_and_shut_down(path):
    nb = nbformat.read(path, as_version=4)
    top = nb.cells[0].source
    assert re.search(r"\b\d+\s*(?:[–-]\s*\d+\s*)?min", top), f"{path.name}: say how long it takes (e.g. '15 min')"
    assert re.search(r"(?i)prerequisite", top), f"{path.name}: say what to know first ('Prerequisites: ...')"
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and "Shut Down Kernel" in last.source, \
        f"{path.name}: end with a line telling the learner to shut the kernel down (Kernel > Shut Down Kernel)"
    from spyre_lab import workshop

    pairs = workshop.check_conventions(nb, path.name)
    self_checks = [s for s, _ in pairs if any(re.search(r"(?i)self-check", c.source)
                                               for c in nb.cells[max(0, s - 3):s] if c.cell_type == "markdown")]
    assert len(self_checks) == 1, f"{path.name}: one conceptual 'Self-check' question, checked by code, found " \
                                  f"{len(self_checks)}"
