"""Every exercise is real: the student copy's check fails, a wrong answer's check fails, the solution's passes.

One kernel per notebook runs the committed cells in order, each twice (a learner re-runs cells; a second run
must not break anything). At each exercise it first runs the student copy written by ``spyre-lab workshop
build`` (the stub must raise NotImplementedError and the check cell must then fail), then the wrong answer
kept in the solution cell's metadata (the check must fail on its assertion, not on a missing name), then the
solution (the check must pass).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from spyre_lab import workshop

sys.path.insert(0, str(Path(__file__).parent))
from nbrun import ALL_NOTEBOOKS, TUTORIALS, kernel_for


def _source(cell) -> str:
    return "".join(cell.source) if isinstance(cell.source, list) else cell.source


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_exercises_fail_unsolved_and_wrong_and_pass_solved(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    pairs = workshop.check_conventions(nb, path.name)
    if path in TUTORIALS:
        assert 2 <= len(pairs) <= 3, f"{path.name}: a tutorial has 2-3 exercises, found {len(pairs)}"
    student_path = workshop.build(tmp_path, [path.parent])
    student = nbformat.read(tmp_path / path.name, as_version=4)
    assert student_path and len(student.cells) == len(nb.cells)
    check_of = dict(pairs)
    with kernel_for(path) as kernel:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or workshop.is_check_cell(cell):
                continue
            where = f"{path.name} cell {index}"
            if index in check_of:
                check = _source(nb.cells[check_of[index]])
                stub = _source(student.cells[index])
                assert workshop.STUB in stub and workshop.BEGIN not in stub, where
                assert kernel.run(stub)[0] == "NotImplementedError", f"{where}: the student stub must raise"
                assert kernel.run(check)[0] is not None, f"{where}: the check passed on the student copy"
                wrong = cell.metadata.get("spyre_lab", {}).get("wrong_answer")
                assert wrong, f"{where}: put a wrong answer in metadata.spyre_lab.wrong_answer to prove the check"
                wrong_source = workshop.replace_solutions(_source(cell), wrong, where)
                assert kernel.run(wrong_source)[0] is None, f"{where}: the wrong answer itself must run"
                ename, text = kernel.run(check)
                assert ename == "AssertionError", f"{where}: a wrong answer must fail the assertion:\n{text}"
                for attempt in (1, 2):
                    ename, text = kernel.run(_source(cell))
                    assert ename is None, f"{where} (run {attempt}): the solution fails:\n{text}"
                    ename, text = kernel.run(check)
                    assert ename is None, f"{where} (run {attempt}): the check fails on the solution:\n{text}"
            else:
                for attempt in (1, 2):
                    ename, text = kernel.run(_source(cell))
                    assert ename is None, f"{where} (run {attempt}) fails:\n{text}"


def test_student_copy_strips_solutions_and_outputs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import math\n"),
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"),
        nbformat.v4.new_code_cell("# CHECK\nassert f(3) == 6\n"),
    ]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="hello")]
    nb.cells[0].execution_count = 1
    nb.cells[1].metadata["spyre_lab"] = {"wrong_answer": "return x"}
    nbformat.write(nb, src / "t.ipynb")
    (src / "data.txt").write_text("kept")
    workshop.build(tmp_path / "out", [src])
    out = nbformat.read(tmp_path / "out" / "t.ipynb", as_version=4)
    assert out.cells[0].outputs == [] and out.cells[0].execution_count is None
    assert out.cells[1].source == f"def f(x):\n    {workshop.STUB}\n"
    assert "spyre_lab" not in out.cells[1].metadata
    assert "return 2 * x" not in nbformat.writes(out)
    assert (tmp_path / "out" / "data.txt").read_text() == "kept"
    wrong = workshop.replace_solutions(nb.cells[1].source, "return x")
    assert wrong == "def f(x):\n    return x\n"


def test_broken_markers_are_named(tmp_path):
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


def test_cli_workshop_build(tmp_path, capsys):
    from spyre_lab.cli import main

    assert main(["workshop", "build", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    assert written == sorted(p.name for p in TUTORIALS)
    assert "student notebooks" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="--src"):
        main(["workshop", "build", str(tmp_path / "x"), "--src", str(tmp_path / "missing")])
