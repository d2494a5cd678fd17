"""Workshop student copies: the tutorials with every exercise's solution replaced by a stub.

Why: the committed tutorials hold the solutions, so ``pytest --nbval`` proves each exercise is solvable
and each check cell passes. A workshop hands learners the same notebooks with the solutions taken out
and the outputs cleared, so they run, predict and fill in the gaps themselves.

Conventions (shared by every notebook in ``tutorials/`` and ``notebooks/``):

* a solution sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines inside a code cell;
  the student copy keeps the rest of the cell and puts ``raise NotImplementedError(...)`` in its place;
* the cell that checks an exercise starts with ``# CHECK``; its assertion must fail on a wrong answer,
  not only on a missing variable. A solution cell may carry a deliberately wrong answer in its metadata
  (``metadata["spyre_lab"]["wrong_answer"]``, code that replaces the solution block) so a test can prove it.
"""

from __future__ import annotations

import argparse
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CHECK = "# CHECK"
STUB = 'raise NotImplementedError("your answer here: replace this line")'

_BLOCK = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*(\n|$)",
                    re.MULTILINE | re.DOTALL)


class WorkshopError(ValueError):
    """A notebook breaks the exercise conventions (unbalanced markers, a check without an exercise)."""


def repo_root() -> Path:
    """The project checkout this package was installed from (``pip install -e .``)."""
    return Path(__file__).resolve().parents[1]


def is_solution_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and BEGIN in _text(cell)


def is_check_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and _text(cell).lstrip().startswith(CHECK)


def _text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def replace_solutions(source: str, replacement: str | None = None, where: str = "cell") -> str:
    """``source`` with every solution block replaced by ``replacement`` (default: a NotImplementedError stub).

    The replacement keeps the block's indentation, so a solution inside a function body stays valid Python.
    """
    begins, ends = source.count(BEGIN), source.count(END)
    if begins != ends:
        raise WorkshopError(f"{where}: {begins} '{BEGIN}' but {ends} '{END}' lines; every solution block needs both")

    def stub(match: re.Match) -> str:
        indent = match.group(1)
        body = STUB if replacement is None else replacement
        lines = [indent + line if line else line for line in body.splitlines()]
        return "\n".join(lines) + match.group(2)

    result, count = _BLOCK.subn(stub, source)
    if count != begins:
        raise WorkshopError(f"{where}: a '{BEGIN}' line is not followed by its '{END}' line")
    return result


def check_conventions(nb: dict, name: str = "notebook") -> list[tuple[int, int]]:
    """Pairs (solution cell index, check cell index); raises if a check has no exercise before it or vice versa."""
    pairs: list[tuple[int, int]] = []
    pending: int | None = None
    for index, cell in enumerate(nb["cells"]):
        where = f"{name} cell {index}"
        if is_solution_cell(cell):
            replace_solutions(_text(cell), where=where)  # validates the markers
            if pending is not None:
                raise WorkshopError(f"{where}: a new exercise starts before cell {pending}'s check cell ('{CHECK}')")
            pending = index
        elif is_check_cell(cell):
            if pending is None:
                raise WorkshopError(f"{where}: a '{CHECK}' cell with no exercise ('{BEGIN}') before it")
            pairs.append((pending, index))
            pending = None
    if pending is not None:
        raise WorkshopError(f"{name} cell {pending}: an exercise with no '{CHECK}' cell after it")
    return pairs


def student_copy(nb: dict, name: str = "notebook") -> dict:
    """A deep copy of ``nb`` with solutions stubbed, outputs and execution counts cleared."""
    import copy

    check_conventions(nb, name)
    out = copy.deepcopy(nb)
    for index, cell in enumerate(out["cells"]):
        if cell.get("cell_type") != "code":
            continue
        if is_solution_cell(cell):
            cell["source"] = replace_solutions(_text(cell), where=f"{name} cell {index}")
            cell.get("metadata", {}).pop("spyre_lab", None)  # the wrong answer stays with the teacher
        cell["outputs"] = []
        cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    return out


def notebooks_in(folders: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for folder in folders:
        found.extend(sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith(".")))
    return found


def build(out: str | Path, sources: Iterable[str | Path] | None = None) -> list[Path]:
    """Write student copies of every notebook in ``sources`` (default: the checkout's tutorials/) to ``out``.

    Files next to the notebooks that are not notebooks (READMEs, small data) are copied as they are.
    Returns the notebooks written.
    """
    import nbformat

    folders = [Path(s) for s in (sources or [repo_root() / "tutorials"])]
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"no notebook folder {folder}; pass the folder that holds the tutorials (--src)")
    out = Path(out)
    written: list[Path] = []
    for folder in folders:
        target = out / folder.name if len(folders) > 1 else out
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(folder.iterdir()):
            if path.name.startswith(".") or path.is_dir():
                continue
            if path.suffix == ".ipynb":
                nb = nbformat.read(path, as_version=4)
                student = nbformat.from_dict(student_copy(nb, path.name))
                nbformat.write(student, target / path.name)
                written.append(target / path.name)
            else:
                shutil.copy2(path, target / path.name)
    if not written:
        raise FileNotFoundError(f"no notebooks found in {', '.join(map(str, folders))}")
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``spyre-lab workshop`` subcommand's options."""
    wsub = parser.add_subparsers(dest="workshop_command", required=True)
    b = wsub.add_parser("build", help="write student copies of the tutorials (solutions stubbed, outputs cleared)")
    b.add_argument("out", help="folder to write the student notebooks to")
    b.add_argument("--src", action="append", default=None,
                   help="notebook folder (repeatable; default: the checkout's tutorials/)")


def main(args: argparse.Namespace) -> int:
    written = build(args.out, args.src)
    exercises = 0
    import nbformat

    for path in written:
        exercises += sum(STUB in _text(c) for c in nbformat.read(path, as_version=4)["cells"])
    print(f"wrote {len(written)} student notebooks with {exercises} exercises to {args.out}")
    return 0
