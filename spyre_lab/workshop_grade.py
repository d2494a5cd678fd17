"""Grade submitted student notebooks: run each one, with its original check cells, and write a CSV.

Why the original checks: a learner may edit a check cell until it passes; as nbgrader does, each submitted
``# CHECK`` cell is replaced by the committed notebook's own before anything runs. Every other cell runs as
submitted, top to bottom in one fresh kernel started in the submission's folder. An error in one cell does
not stop the run: later exercises are still graded, and the row of an exercise whose solution cell failed
says so.

Layout: ``SUBMISSIONS/<student>/<notebook>.ipynb`` (a notebook straight in ``SUBMISSIONS/`` is graded as
student ``-``). One CSV row per exercise: ``student, notebook, exercise, result (pass|fail), message``.
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spyre_lab.workshop import (
    CHECK,
    STUB,
    STUB_AFTER_NAMES,
    WorkshopError,
    cell_text,
    check_conventions,
    is_check_cell,
    repo_root,
)

FIELDS = ("student", "notebook", "exercise", "result", "message")
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PLOTLY_RENDERER": "plotly_mimetype"}


@dataclass(frozen=True)
class Grade:
    """One exercise of one submission."""

    student: str
    notebook: str
    exercise: str
    result: str      # "pass" or "fail"
    message: str

    def row(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in FIELDS}


def exercise_name(check_source: str, number: int) -> str:
    """``# CHECK exercise 2`` -> ``exercise 2``; a bare ``# CHECK`` -> ``exercise <number>``."""
    first = check_source.lstrip().splitlines()[0][len(CHECK):].strip(" :-")
    return first or f"exercise {number}"


def _originals(sources: Iterable[str | Path] | None) -> dict[str, Path]:
    folders = [Path(s) for s in sources] if sources else [repo_root() / "tutorials", repo_root() / "notebooks"]
    found: dict[str, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"no folder of original notebooks {folder} (--src)")
        for path in sorted(folder.glob("*.ipynb")):
            found.setdefault(path.name, path)
    return found


def _error_text(output: dict) -> str:
    return f"{output.get('ename', 'Error')}: {output.get('evalue', '')}".strip()


def grade_notebook(path: Path, original: Path, student: str, timeout: int = 300) -> list[Grade]:
    """Run one submitted notebook with the original's check cells; one Grade per exercise."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    reference = nbformat.read(original, as_version=4)
    pairs = check_conventions(reference, original.name)
    names = [exercise_name(cell_text(reference.cells[c]), n) for n, (_, c) in enumerate(pairs, 1)]
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as error:  # a truncated or hand-edited file is a submission too
        return [Grade(student, path.name, name, "fail", f"the notebook cannot be read: {error}") for name in names]
    checks = [i for i, cell in enumerate(nb.cells) if is_check_cell(cell)]
    if len(checks) != len(pairs):
        message = (f"the notebook has {len(checks)} '{CHECK}' cells, the original {len(pairs)}: a check cell was "
                   "deleted or added; start again from the student copy")
        return [Grade(student, path.name, name, "fail", message) for name in names]
    for index, (_, check) in zip(checks, pairs, strict=True):
        nb.cells[index].source = cell_text(reference.cells[check])
        nb.cells[index].outputs = []

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    saved = {k: os.environ.get(k) for k in KERNEL_ENV}
    os.environ.update(KERNEL_ENV)
    grades: list[Grade] = []
    last_error: tuple[int, str] | None = None  # the latest failing non-check cell, for the next check's message
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                error = None
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as failure:
                    error = f"{failure.ename}: {failure.evalue}"
                if index not in checks:
                    if error:
                        last_error = (index, error)
                    continue
                name = names[checks.index(index)]
                if error is None:
                    grades.append(Grade(student, path.name, name, "pass", ""))
                elif _still_stubbed(nb, index, checks):
                    grades.append(Grade(student, path.name, name, "fail", UNANSWERED))
                elif error.startswith("AssertionError"):
                    grades.append(Grade(student, path.name, name, "fail", error.removeprefix("AssertionError: ")))
                else:
                    grades.append(Grade(student, path.name, name, "fail",
                                        _unanswered_or_error(nb, index, checks, last_error, error)))
                last_error = None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return grades


UNANSWERED = "not answered: the solution cell still holds the stub (NotImplementedError)"


def _exercise_cells(nb, check_index: int, checks: list[int]) -> list[int]:
    previous = max((c for c in checks if c < check_index), default=-1)
    return [c for c in range(previous + 1, check_index) if nb.cells[c].cell_type == "code"]


def _still_stubbed(nb, check_index: int, checks: list[int]) -> bool:
    """Whether a code cell of this exercise still holds the student copy's stub."""
    return any(STUB in cell_text(nb.cells[c]) or STUB_AFTER_NAMES in cell_text(nb.cells[c])
               for c in _exercise_cells(nb, check_index, checks))


def _unanswered_or_error(nb, check_index: int, checks: list[int], last_error, check_error: str) -> str:
    """Why a check raised something other than AssertionError: an error in the learner's code, or in the check."""
    previous = max((c for c in checks if c < check_index), default=-1)
    if last_error is not None and last_error[0] > previous:
        return f"error in cell {last_error[0]}: {last_error[1]}"
    return f"error in the check: {check_error}"


def grade_folder(submissions: str | Path, sources: Iterable[str | Path] | None = None,
                 out: str | Path | None = None, timeout: int = 300) -> tuple[list[Grade], Path]:
    """Grade every ``SUBMISSIONS/<student>/*.ipynb`` and write the CSV; returns the grades and the CSV path."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"no submissions folder {submissions}; give the folder with one subfolder per student")
    originals = _originals(sources)
    found = [(p.parent.name if p.parent != submissions else "-", p)
             for p in sorted(submissions.glob("*.ipynb")) + sorted(submissions.glob("*/*.ipynb"))]
    if not found:
        raise FileNotFoundError(f"no notebooks in {submissions} or its subfolders (SUBMISSIONS/<student>/*.ipynb)")
    grades: list[Grade] = []
    for student, path in found:
        original = originals.get(path.name)
        if original is None:
            raise WorkshopError(f"{path}: no original notebook named {path.name} in the --src folders; a submission "
                                "keeps the name of the notebook it was copied from")
        grades.extend(grade_notebook(path, original, student, timeout))
    csv_path = Path(out) if out else submissions / "grades.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(g.row() for g in grades)
    return grades, csv_path


def main(args: argparse.Namespace) -> int:
    """``spyre-lab workshop grade SUBMISSIONS``: grade, write the CSV, print a one-line summary."""
    rows, csv_path = grade_folder(args.submissions, args.src, args.out, timeout=args.timeout)
    passed = sum(r.result == "pass" for r in rows)
    print(f"graded {len(rows)} exercises ({passed} passed) in {len({r.student for r in rows})} submissions; "
          f"wrote {csv_path}")
    return 0
