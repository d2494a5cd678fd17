"""Every exercise is real and every prediction is the learner's own.

One kernel per notebook runs the committed cells in order, each twice (a learner re-runs cells; a second run
must not break anything). At each exercise it first runs the student copy written by ``spyre-lab workshop
build`` (the stub must raise NotImplementedError and the check cell must then fail), then each wrong answer
kept in the solution cell's metadata (it must run, and the check must fail on its assertion with a message
saying what is off), then the solution (the check must pass). At each predict cell it first runs the student
copy (the guess is empty, so the reveal must refuse), then the committed one. At the end the kernel's
``spyre_lab.teach.revealed()`` proves that no committed guess is the answer its reveal computed.

Both tests below read one run per notebook (cached), so a notebook executes once for the two of them.
"""

from __future__ import annotations

import ast
import csv
import functools
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from spyre_lab import workshop
from spyre_lab.workshop_grade import grade_folder

sys.path.insert(0, str(Path(__file__).parent))
from nbrun import ALL_NOTEBOOKS, ROOT, TUTORIALS, kernel_for

_ids = {"ids": lambda p: f"{p.parent.name}/{p.name}"}


def _source(cell) -> str:
    return "".join(cell.source) if isinstance(cell.source, list) else cell.source


def _guess_names(source: str) -> list[str]:
    assigns = [n for n in ast.parse(source).body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)]
    return [n.targets[0].id for n in assigns if n.targets[0].id.startswith("guess_")]


def _reads(code: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@dataclass
class NotebookRun:
    exercise_problems: list[str] = field(default_factory=list)
    predict_problems: list[str] = field(default_factory=list)
    wrong_stored: int = 0
    wrong_caught: int = 0


def _reveal_cell_after(nb, index: int, names: list[str]) -> int | None:
    for later in range(index + 1, len(nb.cells)):
        cell = nb.cells[later]
        if cell.cell_type == "code" and any(f'reveal("{n}"' in _source(cell) for n in names):
            return later
    return None


@functools.cache
def _run(path: Path) -> NotebookRun:
    report = NotebookRun()
    nb = nbformat.read(path, as_version=4)
    pairs = workshop.check_conventions(nb, path.name)
    check_of = dict(pairs)
    with tempfile.TemporaryDirectory() as tmp:
        workshop.build(tmp, [path.parent], root=path.parent.parent, instructor=False)
        student = nbformat.read(Path(tmp) / path.name, as_version=4)
    assert len(student.cells) == len(nb.cells)
    guesses: dict[str, int] = {}
    with kernel_for(path) as kernel:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or workshop.is_check_cell(cell):
                continue
            where = f"{path.name} cell {index}"
            if workshop.is_predict_cell(cell):
                names = _guess_names(_source(cell))
                guesses.update(dict.fromkeys(names, index))
                reveal_at = _reveal_cell_after(nb, index, names)
                if reveal_at is None:
                    report.predict_problems.append(f"{where}: no later cell calls reveal(\"{names[0]}\", ...)")
                else:
                    if kernel.run(_source(student.cells[index]))[0] is not None:
                        report.predict_problems.append(f"{where}: the student's empty predict cell fails to run")
                    ename, _ = kernel.run(_source(nb.cells[reveal_at]))
                    if ename != "GuessMissing":
                        report.predict_problems.append(
                            f"{path.name} cell {reveal_at}: with the guess empty the reveal must refuse "
                            f"(GuessMissing), got {ename}")
                    shown = [o for o in kernel.last_outputs
                             if o.get("output_type") in ("display_data", "execute_result")
                             or (o.get("output_type") == "stream" and o.get("name") == "stdout")]
                    if shown:
                        report.predict_problems.append(
                            f"{path.name} cell {reveal_at}: shows output before refusing an empty guess (it may give "
                            "the answer away); call reveal(...) before printing anything")
            if index in check_of:
                check = _source(nb.cells[check_of[index]])
                stub = _source(student.cells[index])
                if workshop.STUB not in stub and workshop.STUB_AFTER_NAMES not in stub:
                    report.exercise_problems.append(f"{where}: the student copy has no stub")
                for block in workshop.solution_blocks(_source(cell)):
                    defined, _ = workshop._top_level_definitions(block)
                    missing = [n for n in defined if n in _reads(check) and n not in stub]
                    if missing:
                        report.exercise_problems.append(f"{where}: the stub never names {missing}, read by the check")
                if kernel.run(stub)[0] != "NotImplementedError":
                    report.exercise_problems.append(f"{where}: the student stub must raise NotImplementedError")
                if kernel.run(check)[0] is None:
                    report.exercise_problems.append(f"{where}: the check passed on the student copy")
                wrongs = workshop.wrong_answers(cell)
                report.wrong_stored += len(wrongs)
                if len(wrongs) < workshop.MIN_WRONG_ANSWERS:
                    report.exercise_problems.append(
                        f"{where}: {len(wrongs)} wrong answers in metadata.spyre_lab.wrong_answers, "
                        f"need {workshop.MIN_WRONG_ANSWERS} (each a misconception the check must catch)")
                for number, wrong in enumerate(wrongs, 1):
                    label = f"{where} wrong answer {number} ({wrong.get('why', '?')})"
                    wrong_source = workshop.replace_solutions(_source(cell), wrong["code"], where)
                    ename, text = kernel.run(wrong_source)
                    if ename is not None:
                        report.exercise_problems.append(f"{label}: the wrong answer itself must run:\n{text}")
                        continue
                    ename, text = kernel.run(check)
                    if ename != "AssertionError":
                        report.exercise_problems.append(f"{label}: must fail the check's assertion, got {ename}:\n"
                                                        f"{text[-1500:]}")
                    elif not kernel.last_evalue.strip():
                        report.exercise_problems.append(f"{label}: the assertion fails without a message")
                    else:
                        report.wrong_caught += 1
                for attempt in (1, 2):
                    ename, text = kernel.run(_source(cell))
                    if ename is None:
                        ename, text = kernel.run(check)
                    if ename is not None:
                        report.exercise_problems.append(f"{where} (run {attempt}): the solution fails:\n{text}")
                        return report
            else:
                for attempt in (1, 2):
                    ename, text = kernel.run(_source(cell))
                    if ename is not None:
                        report.exercise_problems.append(f"{where} (run {attempt}) fails:\n{text}")
                        report.predict_problems.append(f"{where} fails, so the reveals after it were not checked")
                        return report
        printed = kernel.stdout("import json\nfrom spyre_lab.teach import revealed\n"
                                "print(json.dumps([[r.name, repr(r.guess), repr(r.actual), r.matches] "
                                "for r in revealed()]))")
    records = json.loads(printed.strip().splitlines()[-1])
    for name, index in guesses.items():
        mine = [r for r in records if r[0] == name]
        if not mine:
            report.predict_problems.append(f"{path.name} cell {index}: {name} is never revealed")
        for _, guess, actual, matches in mine:
            if matches:
                report.predict_problems.append(
                    f"{path.name} cell {index}: {name} = {guess} is the answer its reveal computes ({actual}); "
                    "commit a plausible guess that is not the answer")
    return report


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, **_ids)
def test_exercises_fail_unsolved_and_wrong_and_pass_solved(path):
    nb = nbformat.read(path, as_version=4)
    pairs = workshop.check_conventions(nb, path.name)
    if path in TUTORIALS:
        assert 2 <= len(pairs) <= 4, f"{path.name}: a tutorial has 2-3 exercises and a self-check, found {len(pairs)}"
    report = _run(path)
    assert not report.exercise_problems, "\n".join(report.exercise_problems)
    assert report.wrong_caught == report.wrong_stored >= workshop.MIN_WRONG_ANSWERS * len(pairs)


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, **_ids)
def test_no_predict_cell_holds_its_answer_and_the_student_copy_empties_them(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    workshop.build(tmp_path, [path.parent], root=path.parent.parent, instructor=False)
    student = nbformat.read(tmp_path / path.name, as_version=4)
    for index, (mine, theirs) in enumerate(zip(nb.cells, student.cells, strict=True)):
        if not workshop.is_predict_cell(mine):
            continue
        assert workshop.is_predict_cell(theirs), f"{path.name} cell {index}"
        committed = [n for n in ast.parse(_source(mine)).body if isinstance(n, ast.Assign)]
        emptied = [n for n in ast.parse(_source(theirs)).body if isinstance(n, ast.Assign)]
        assert committed and len(committed) == len(emptied), f"{path.name} cell {index}: one guess per line"
        for before, after in zip(committed, emptied, strict=True):
            name = before.targets[0].id
            assert not (isinstance(before.value, ast.Constant) and before.value.value is None), \
                f"{path.name} cell {index}: commit a plausible (wrong) guess in {name}, not None"
            assert isinstance(after.value, ast.Constant) and after.value.value is None, \
                f"{path.name} cell {index}: the student copy must write {name} = None"
    report = _run(path)
    assert not report.predict_problems, "\n".join(report.predict_problems)


# --- the workshop build and grader, on made-up notebooks -------------------------------------------------

def _exercise_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import math\nfrom spyre_lab.teach import reveal\n"),
        nbformat.v4.new_markdown_cell("See [the layout code](../pkg/layout.py) and [LX](../docs/terms.md#lx)."),
        nbformat.v4.new_code_cell("# PREDICT\nguess_area = 12  # your guess\n"),
        nbformat.v4.new_code_cell('area = 2 * 3\nreveal("guess_area", guess_area, area, "cm2")\n'),
        nbformat.v4.new_markdown_cell("<details><summary>Hint</summary>multiply</details>"),
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\nside = 2\nanswer = side * 3\n### END SOLUTION\n"),
        nbformat.v4.new_code_cell("# CHECK exercise 1\nassert answer == 6, f'{answer} is not 2 x 3'\n"),
        nbformat.v4.new_markdown_cell("<details><summary>Hint</summary>square it</details>"),
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION\n"),
        nbformat.v4.new_code_cell("# CHECK exercise 2\nassert f(3) == 9, f'f(3) is {f(3)}, should be 9'\n"),
        nbformat.v4.new_markdown_cell("Next: [two](02_two.ipynb)"),
    ]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="hello")]
    nb.cells[0].execution_count = 1
    nb.cells[5].metadata["spyre_lab"] = {"wrong_answers": [{"code": "answer = 5", "why": "off by one"}]}
    return nb


def _project(tmp_path: Path) -> Path:
    """A made-up checkout: two notebooks, a linked source file and a linked glossary page that links onwards."""
    root = tmp_path / "proj"
    (root / "tutorials").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "docs").mkdir()
    (root / "pkg" / "layout.py").write_text("x = 1\n")
    (root / "pkg" / "lx.py").write_text("y = 1\n")
    (root / "docs" / "terms.md").write_text("### LX\nsee [lx.py](../pkg/lx.py)\n")
    nbformat.write(_exercise_notebook(), root / "tutorials" / "01_one.ipynb")
    two = nbformat.v4.new_notebook()
    two.cells = [nbformat.v4.new_markdown_cell("Back to [one](01_one.ipynb)")]
    nbformat.write(two, root / "tutorials" / "02_two.ipynb")
    (root / "tutorials" / "data.txt").write_text("kept")
    return root


def _links(nb) -> list[str]:
    return [m for c in nb.cells if c.cell_type == "markdown" for m in workshop._LINK.findall(_source(c))]


def test_student_copy_strips_solutions_empties_guesses_and_names_the_answers(tmp_path):
    root = _project(tmp_path)
    out = tmp_path / "out"
    workshop.build(out, [root / "tutorials"], root=root)
    nb = nbformat.read(out / "01_one.ipynb", as_version=4)
    assert nb.cells[0].outputs == [] and nb.cells[0].execution_count is None
    assert nb.cells[2].source == "# PREDICT\nguess_area = None  # your guess\n"
    assert nb.cells[5].source == f"answer = ...  # your answer\n{workshop.STUB_AFTER_NAMES}\n"   # not `side`
    assert nb.cells[8].source == f"def f(x):\n    {workshop.STUB}\n"
    assert "spyre_lab" not in nb.cells[5].metadata
    assert "side * 3" not in nbformat.writes(nb) and "x * x" not in nbformat.writes(nb)
    assert (out / "data.txt").read_text() == "kept"
    wrong = workshop.replace_solutions(_exercise_notebook().cells[8].source, "return x")
    assert wrong == "def f(x):\n    return x\n"


def test_built_links_resolve_outside_the_checkout(tmp_path):
    root = _project(tmp_path)
    out = tmp_path / "elsewhere"
    workshop.build(out, [root / "tutorials"], root=root)
    for folder in (out, out / workshop.INSTRUCTOR):
        for path in folder.glob("*.ipynb"):
            for _, target, _ in _links(nbformat.read(path, as_version=4)):
                assert (path.parent / target.partition("#")[0]).exists(), f"{path}: {target} does not resolve"
    page = out / workshop.REFERENCE / "docs" / "terms.md"
    assert (page.parent / "../pkg/lx.py").resolve().exists(), "a copied page's own links must resolve too"
    student_links = [t for _, t, _ in _links(nbformat.read(out / "01_one.ipynb", as_version=4))]
    assert student_links == ["reference/pkg/layout.py", "reference/docs/terms.md#lx", "02_two.ipynb"]


def test_instructor_copy_keeps_solutions_hints_and_wrong_answers(tmp_path):
    root = _project(tmp_path)
    out = tmp_path / "out"
    workshop.build(out, [root / "tutorials"], root=root)
    teacher = nbformat.read(out / workshop.INSTRUCTOR / "01_one.ipynb", as_version=4)
    text = nbformat.writes(teacher)
    assert "side * 3" in text and "guess_area = 12" in text and "<summary>Hint</summary>" in text
    note = next(c for c in teacher.cells if c.metadata.get("spyre_lab", {}).get("instructor_note"))
    assert "off by one" in note.source and "answer = 5" in note.source
    assert next(t for _, t, _ in _links(teacher)) == "../reference/pkg/layout.py"


def test_broken_markers_and_links_are_named(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n")]
    with pytest.raises(workshop.WorkshopError, match="END SOLUTION"):
        workshop.student_copy(nb, "bad.ipynb")
    nb.cells = [nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n")]
    with pytest.raises(workshop.WorkshopError, match="no '# CHECK' cell"):
        workshop.student_copy(nb, "bad.ipynb")
    nb.cells = [nbformat.v4.new_code_cell("# CHECK\nassert x == 1\n")]
    with pytest.raises(workshop.WorkshopError, match="no exercise"):
        workshop.student_copy(nb, "bad.ipynb")
    nb.cells = [nbformat.v4.new_code_cell("# PREDICT\nprint('no guess here')\n")]
    with pytest.raises(workshop.WorkshopError, match="guess_"):
        workshop.student_copy(nb, "bad.ipynb")
    root = _project(tmp_path)
    (root / "pkg" / "layout.py").unlink()
    with pytest.raises(workshop.WorkshopError, match="missing file"):
        workshop.build(tmp_path / "out", [root / "tutorials"], root=root)


def test_cli_workshop_build(tmp_path, capsys):
    from spyre_lab.cli import main

    assert main(["workshop", "build", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    assert written == sorted(p.name for p in TUTORIALS)
    assert sorted(p.name for p in (tmp_path / workshop.INSTRUCTOR).glob("*.ipynb")) == written
    assert "student notebooks" in capsys.readouterr().out
    for path in [*tmp_path.glob("*.ipynb"), *(tmp_path / workshop.INSTRUCTOR).glob("*.ipynb")]:
        for _, target, _ in _links(nbformat.read(path, as_version=4)):
            if workshop._is_relative_link(target):
                assert (path.parent / target.partition("#")[0]).exists(), f"{path.name}: {target} does not resolve"
    assert "/work/" not in "".join(p.read_text() for p in tmp_path.glob("*.ipynb"))
    with pytest.raises(FileNotFoundError, match="--src"):
        main(["workshop", "build", str(tmp_path / "x"), "--src", str(tmp_path / "missing")])


def test_grade_made_up_submissions(tmp_path):
    """Right, wrong, unanswered, erroring, check-edited and check-deleted submissions, one CSV row per exercise."""
    root = _project(tmp_path)
    src = root / "tutorials"
    built = tmp_path / "student"
    workshop.build(built, [src], root=root, instructor=False)
    blank = nbformat.read(built / "01_one.ipynb", as_version=4)
    solved = nbformat.read(src / "01_one.ipynb", as_version=4)

    def submit(student: str, nb) -> None:
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / student / "01_one.ipynb")

    submit("right", solved)
    submit("unanswered", blank)
    wrong = nbformat.from_dict(blank)
    wrong.cells[2].source = "# PREDICT\nguess_area = 5\n"
    wrong.cells[5].source = "answer = 5\n"
    wrong.cells[8].source = "def f(x):\n    return x + x\n"
    submit("wrong", wrong)
    errors = nbformat.from_dict(solved)
    errors.cells[5].source = "answer = 1 / 0\n"
    submit("errors", errors)
    cheat = nbformat.from_dict(wrong)
    cheat.cells[6].source = "# CHECK exercise 1\nassert True\n"
    submit("edited_check", cheat)
    deleted = nbformat.from_dict(solved)
    del deleted.cells[9]
    submit("deleted_check", deleted)

    _, csv_path = grade_folder(tmp_path / "subs", [src])
    rows = list(csv.DictReader(csv_path.open()))
    assert list(rows[0]) == ["student", "notebook", "exercise", "result", "message"]
    got = {(r["student"], r["exercise"]): (r["result"], r["message"]) for r in rows}
    assert len(rows) == 12
    assert got["right", "exercise 1"] == got["right", "exercise 2"] == ("pass", "")
    assert got["wrong", "exercise 1"] == ("fail", "5 is not 2 x 3")
    assert got["wrong", "exercise 2"] == ("fail", "f(3) is 6, should be 9")
    for exercise in ("exercise 1", "exercise 2"):
        result, message = got["unanswered", exercise]
        assert result == "fail" and message.startswith("not answered"), message
        assert got["deleted_check", exercise][0] == "fail" and "deleted" in got["deleted_check", exercise][1]
    assert got["errors", "exercise 1"][0] == "fail" and "ZeroDivisionError" in got["errors", "exercise 1"][1]
    assert got["errors", "exercise 2"] == ("pass", "")
    assert got["edited_check", "exercise 1"] == ("fail", "5 is not 2 x 3"), "the original check must be the one run"


def test_cli_workshop_grade(tmp_path, capsys):
    from spyre_lab.cli import main

    root = _project(tmp_path)
    (tmp_path / "subs" / "ana").mkdir(parents=True)
    nbformat.write(nbformat.read(root / "tutorials" / "01_one.ipynb", as_version=4),
                   tmp_path / "subs" / "ana" / "01_one.ipynb")
    out = tmp_path / "grades.csv"
    assert main(["workshop", "grade", str(tmp_path / "subs"), "--src", str(root / "tutorials"),
                 "--out", str(out)]) == 0
    assert "2 exercises (2 passed)" in capsys.readouterr().out
    assert [r["result"] for r in csv.DictReader(out.open())] == ["pass", "pass"]
    with pytest.raises(FileNotFoundError, match="one subfolder per student"):
        main(["workshop", "grade", str(tmp_path / "nothing")])


def test_the_notebook_run_catches_a_pre_answered_guess_a_leaky_reveal_and_a_passing_wrong_answer(tmp_path):
    """The two notebook tests above fail on the bugs they exist for (checked on a made-up notebook)."""
    root = _project(tmp_path)
    path = root / "tutorials" / "01_one.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source = "# PREDICT\nguess_area = 6  # your guess\n"                       # the answer itself
    nb.cells[3].source = 'area = 2 * 3\nprint(area)\nreveal("guess_area", guess_area, area, "cm2")\n'  # leaks it
    nb.cells[5].metadata["spyre_lab"]["wrong_answers"].append({"code": "answer = 3 * 2", "why": "same number"})
    nbformat.write(nb, path)
    report = _run(path)
    assert any("is the answer its reveal computes" in p for p in report.predict_problems), report.predict_problems
    assert any("shows output before refusing" in p for p in report.predict_problems), report.predict_problems
    assert any("same number" in p and "got None" in p for p in report.exercise_problems), report.exercise_problems
    assert any("need 3" in p for p in report.exercise_problems), report.exercise_problems


def test_repo_notebooks_follow_the_exercise_conventions():
    for path in ALL_NOTEBOOKS:
        workshop.check_conventions(nbformat.read(path, as_version=4), path.name)
    assert (ROOT / "tutorials").is_dir()
