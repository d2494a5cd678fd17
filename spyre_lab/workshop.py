"""Workshop copies of the notebooks: student copies (solutions stubbed, guesses emptied) and an instructor copy.

Why: the committed tutorials hold the solutions and a worked guess in every predict cell, so ``pytest --nbval``
proves each exercise is solvable and each check cell passes. A workshop hands learners the same notebooks with
the solutions taken out, the guesses emptied and the outputs cleared, so they predict, run and fill in the gaps
themselves; the teacher gets a copy with the solutions and the wrong answers each check is known to catch.

Conventions (shared by every notebook in ``tutorials/`` and ``notebooks/``):

* a solution sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines inside a code cell; the
  student copy puts a stub in its place that names every variable the rest of the cell and the check read
  (``delta_bytes = ...  # your answer``) and then raises ``NotImplementedError``;
* the cell that checks an exercise starts with ``# CHECK``; its assertion must fail on a wrong answer, not
  only on a missing variable. The solution cell's ``metadata["spyre_lab"]["wrong_answers"]`` lists at least
  three ``{"code": ..., "why": ...}`` (code that replaces the solution block, and the misconception it is);
* a markdown cell right before each solution cell holds a collapsed ``<details><summary>Hint</summary>``;
* a **predict cell** starts with ``# PREDICT`` and assigns ``guess_<name> = <value>``; the student copy
  writes ``guess_<name> = None`` (see :mod:`spyre_lab.teach`).

Links: a notebook's relative links (``../spyre_lab/compiler/fusion.py``, ``../docs/glossary.md#lx``) would
break in a copy built outside the checkout, so ``build`` copies every linked file into ``OUT/reference/``
(keeping its path in the repository, so links between copied files still work) and rewrites the link.
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from spyre_lab.teach import PREDICT

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CHECK = "# CHECK"
HINT = "<summary>Hint</summary>"
STUB = 'raise NotImplementedError("your answer here: replace this line")'
STUB_AFTER_NAMES = 'raise NotImplementedError("write your answer in place of each ... above, then delete this line")'
ANSWER_MARK = "  # your answer"
GUESS_MARK = "  # your guess"
REFERENCE = "reference"
INSTRUCTOR = "instructor"
MIN_WRONG_ANSWERS = 3

_BLOCK = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n(.*?)^[ \t]*{re.escape(END)}[^\n]*(\n|$)",
                    re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_HREF = re.compile(r"""((?:href|src)=["'])([^"']+)(["'])""")


class WorkshopError(ValueError):
    """A notebook breaks the exercise conventions (unbalanced markers, a check without an exercise, ...)."""


def repo_root() -> Path:
    """The project checkout this package was installed from (``pip install -e .``)."""
    return Path(__file__).resolve().parents[1]


def cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def is_solution_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and BEGIN in cell_text(cell)


def is_check_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and cell_text(cell).lstrip().startswith(CHECK)


def is_predict_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and cell_text(cell).lstrip().startswith(PREDICT)


def is_hint_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "markdown" and "<details>" in cell_text(cell) and HINT in cell_text(cell)


def wrong_answers(cell: dict) -> list[dict]:
    """The wrong answers a solution cell stores for its check (``[]`` when it has none)."""
    return list(cell.get("metadata", {}).get("spyre_lab", {}).get("wrong_answers", []))


def solution_blocks(source: str) -> list[str]:
    """The code inside each solution block of ``source`` (dedented), in order."""
    import textwrap

    return [textwrap.dedent(m.group(2)) for m in _BLOCK.finditer(source)]


def _names(code: str, ctx: type) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ctx) and node.id not in found:
            found.append(node.id)
    return found


def _top_level_definitions(code: str) -> tuple[list[str], dict[str, str]]:
    """Names a solution block binds at its top level, and for functions the ``def`` line to keep."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [], {}
    names: list[str] = []
    defs: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
            defs[node.name] = code.splitlines()[node.lineno - 1].strip()
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name) and sub.id not in names:
                        names.append(sub.id)
    return names, defs


def answer_stub(block: str, readers: str) -> str:
    """The stub for one solution block: each name it binds that ``readers`` uses, then a NotImplementedError.

    ``readers`` is the code that reads the answer (the rest of the solution cell and its check cell), so a
    learner sees exactly which variables the check expects, with the shape of each function kept.
    """
    bound, defs = _top_level_definitions(block)
    read = set(_names(readers, ast.Load))
    wanted = [name for name in bound if name in read]
    if not wanted:
        return STUB
    lines = []
    for name in wanted:
        if name in defs:
            lines += [defs[name] + ANSWER_MARK, "    ...", ""]
        else:
            lines.append(f"{name} = ...{ANSWER_MARK}")
    return "\n".join([*lines, STUB_AFTER_NAMES])


def replace_solutions(source: str, replacement: str | None = None, where: str = "cell",
                      readers: str | None = None) -> str:
    """``source`` with every solution block replaced by ``replacement``.

    Default replacement: a stub (:func:`answer_stub`) naming what ``readers`` reads, or a bare
    NotImplementedError when ``readers`` is not given. The replacement keeps the block's indentation, so a
    solution inside a function body stays valid Python.
    """
    begins, ends = source.count(BEGIN), source.count(END)
    if begins != ends:
        raise WorkshopError(f"{where}: {begins} '{BEGIN}' but {ends} '{END}' lines; every solution block needs both")
    outside = _BLOCK.sub("", source)

    def stub(match: re.Match) -> str:
        indent = match.group(1)
        if replacement is not None:
            body = replacement
        elif readers is not None and not indent:
            body = answer_stub(match.group(2), outside + "\n" + readers)
        else:
            body = STUB
        lines = [indent + line if line else line for line in body.splitlines()]
        return "\n".join(lines) + match.group(3)

    result, count = _BLOCK.subn(stub, source)
    if count != begins:
        raise WorkshopError(f"{where}: a '{BEGIN}' line is not followed by its '{END}' line")
    return result


def empty_guesses(source: str, where: str = "cell") -> str:
    """A predict cell's source with every ``guess_<name> = <value>`` written as ``guess_<name> = None``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise WorkshopError(f"{where}: the predict cell is not valid Python ({error.msg})") from None
    lines = source.splitlines()
    spans = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("guess_")):
            spans.append((node.lineno - 1, node.end_lineno or node.lineno, node.targets[0].id))
    if not spans:
        raise WorkshopError(f"{where}: a '{PREDICT}' cell with no 'guess_<name> = ...' line")
    for start, end, name in reversed(spans):
        lines[start:end] = [f"{name} = None{GUESS_MARK}"]
    return "\n".join(lines) + ("\n" if source.endswith("\n") else "")


def check_conventions(nb: dict, name: str = "notebook") -> list[tuple[int, int]]:
    """Pairs (solution cell index, check cell index); raises if a check has no exercise before it or vice versa."""
    pairs: list[tuple[int, int]] = []
    pending: int | None = None
    for index, cell in enumerate(nb["cells"]):
        where = f"{name} cell {index}"
        if is_solution_cell(cell):
            replace_solutions(cell_text(cell), where=where)  # validates the markers
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


def _clear(cell: dict) -> None:
    cell["outputs"] = []
    cell["execution_count"] = None
    cell.get("metadata", {}).pop("execution", None)


def student_copy(nb: dict, name: str = "notebook") -> dict:
    """A deep copy of ``nb``: solutions stubbed, guesses emptied, wrong answers dropped, outputs cleared."""
    pairs = dict(check_conventions(nb, name))
    out = copy.deepcopy(nb)
    for index, cell in enumerate(out["cells"]):
        if cell.get("cell_type") != "code":
            continue
        where = f"{name} cell {index}"
        if is_solution_cell(cell):
            check = cell_text(nb["cells"][pairs[index]])
            cell["source"] = replace_solutions(cell_text(cell), where=where, readers=check)
            cell.get("metadata", {}).pop("spyre_lab", None)  # the wrong answers stay with the teacher
        elif is_predict_cell(cell):
            cell["source"] = empty_guesses(cell_text(cell), where)
        _clear(cell)
    out.get("metadata", {}).pop("widgets", None)
    return out


def instructor_copy(nb: dict, name: str = "notebook") -> dict:
    """A deep copy of ``nb`` with, after each solution cell, a note listing the wrong answers its check catches."""
    import nbformat

    check_conventions(nb, name)
    out = copy.deepcopy(nb)
    cells = []
    for cell in out["cells"]:
        cells.append(cell)
        if is_solution_cell(cell) and wrong_answers(cell):
            lines = ["**Instructor notes: wrong answers this exercise's check is known to catch**", ""]
            for wrong in wrong_answers(cell):
                lines += [f"- {wrong.get('why', '')}", "", "  ```python", *[f"  {line}" for line in
                                                                          wrong["code"].splitlines()], "  ```", ""]
            note = nbformat.v4.new_markdown_cell("\n".join(lines).rstrip() + "\n")
            note.metadata["spyre_lab"] = {"instructor_note": True}
            cells.append(note)
    out["cells"] = cells
    return out


def notebooks_in(folders: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for folder in folders:
        found.extend(sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith(".")))
    return found


def _is_relative_link(target: str) -> bool:
    return not (target.startswith(("#", "/", "mailto:")) or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target))


class _Linker:
    """Rewrites a built notebook's relative links so they resolve inside ``out`` (copying what they point to)."""

    def __init__(self, out: Path, root: Path, built: dict[Path, Path]) -> None:
        self.out, self.root, self.built = out, root, built
        self.copied: set[Path] = set()

    def rewrite(self, text: str, source_dir: Path, target_dir: Path, where: str) -> str:
        def fix(match: re.Match) -> str:
            head, target, tail = match.groups()
            if not _is_relative_link(target):
                return match.group(0)
            path_part, hash_, anchor = target.partition("#")
            resolved = (source_dir / path_part).resolve()
            if resolved in self.built:
                new = self.built[resolved]
            else:
                if not resolved.exists():
                    raise WorkshopError(f"{where}: the link {target!r} points to a missing file {resolved}")
                new = self._copy(resolved, where)
            rel = Path(_relpath(new, target_dir))
            return f"{head}{rel.as_posix()}{hash_}{anchor}{tail}"

        return _HREF.sub(fix, _LINK.sub(fix, text))

    def _copy(self, path: Path, where: str) -> Path:
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            raise WorkshopError(f"{where}: the link to {path} leaves the project; link inside it") from None
        if path.suffix == ".ipynb":
            raise WorkshopError(f"{where}: the link to {rel} is a notebook that is not in the workshop; add its "
                                "folder with --src")
        dest = self.out / REFERENCE / rel
        if path in self.copied:
            return dest
        self.copied.add(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            return dest
        shutil.copy2(path, dest)
        if path.suffix == ".md":  # a copied page keeps its own links working: copy what it links to as well
            for match in _LINK.finditer(path.read_text()):
                target = match.group(2).partition("#")[0]
                if target and _is_relative_link(target):
                    linked = (path.parent / target).resolve()
                    if linked.exists() and linked.suffix != ".ipynb":
                        self._copy(linked, f"{rel}")
        return dest


def _relpath(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path, start)


def build(out: str | Path, sources: Iterable[str | Path] | None = None, root: str | Path | None = None,
          instructor: bool = True) -> list[Path]:
    """Write student copies of every notebook in ``sources`` (default: the checkout's tutorials/) to ``out``.

    One source folder: its notebooks land in ``out``; several: in ``out/<folder name>/``. The instructor copy
    (solutions, hints, the wrong answers) goes to ``out/instructor/`` the same way, and every linked file to
    ``out/reference/``. Files next to the notebooks that are not notebooks (READMEs, small data) are copied as
    they are. Returns the student notebooks written.
    """
    import nbformat

    root = Path(root).resolve() if root else repo_root()
    folders = [Path(s).resolve() for s in (sources or [root / "tutorials"])]
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"no notebook folder {folder}; pass the folder that holds the tutorials (--src)")
    out = Path(out).resolve()
    sub = (lambda folder: folder.name) if len(folders) > 1 else (lambda folder: "")
    student_dir = {folder: out / sub(folder) for folder in folders}
    teacher_dir = {folder: out / INSTRUCTOR / sub(folder) for folder in folders}
    notebooks = {folder: notebooks_in([folder]) for folder in folders}
    if not any(notebooks.values()):
        raise FileNotFoundError(f"no notebooks found in {', '.join(map(str, folders))}")
    written: list[Path] = []
    for copy_dir, make in ((student_dir, student_copy), (teacher_dir, instructor_copy)):
        if copy_dir is teacher_dir and not instructor:
            continue
        # everything copied next to the notebooks (the notebooks and their READMEs) is linked where it lands
        built = {p.resolve(): copy_dir[f] / p.name for f in folders for p in f.iterdir()
                 if p.is_file() and not p.name.startswith(".")}
        linker = _Linker(out, root, built)
        for folder in folders:
            target = copy_dir[folder]
            target.mkdir(parents=True, exist_ok=True)
            for path in sorted(folder.iterdir()):
                if path.name.startswith(".") or path.is_dir():
                    continue
                if path.suffix != ".ipynb":
                    shutil.copy2(path, target / path.name)
                    continue
                nb = nbformat.read(path, as_version=4)
                made = make(nb, path.name)
                for index, cell in enumerate(made["cells"]):
                    if cell.get("cell_type") == "markdown":
                        cell["source"] = linker.rewrite(cell_text(cell), folder, target, f"{path.name} cell {index}")
                nbformat.write(nbformat.from_dict(made), target / path.name)
                if copy_dir is student_dir:
                    written.append(target / path.name)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``spyre-lab workshop`` subcommand's options."""
    wsub = parser.add_subparsers(dest="workshop_command", required=True)
    b = wsub.add_parser("build", help="write student copies of the tutorials (solutions stubbed, guesses emptied, "
                                      "outputs cleared) and an instructor copy in OUT/instructor/")
    b.add_argument("out", help="folder to write the student notebooks to")
    b.add_argument("--src", action="append", default=None,
                   help="notebook folder (repeatable; default: the checkout's tutorials/)")
    g = wsub.add_parser("grade", help="run every check on submitted notebooks (SUBMISSIONS/<student>/*.ipynb) "
                                      "and write a CSV")
    g.add_argument("submissions", help="folder with one subfolder of notebooks per student")
    g.add_argument("--src", action="append", default=None,
                   help="folder of the original notebooks whose check cells are run (repeatable; default: the "
                        "checkout's tutorials/ and notebooks/)")
    g.add_argument("--out", default=None, help="CSV to write (default: SUBMISSIONS/grades.csv)")
    g.add_argument("--timeout", type=int, default=300, help="seconds one cell may run (default: 300)")


def main(args: argparse.Namespace) -> int:
    """``spyre-lab workshop build`` (``grade`` lives in :mod:`spyre_lab.workshop_grade`)."""
    import nbformat

    written = build(args.out, args.src)
    exercises = sum(STUB_AFTER_NAMES in cell_text(c) or STUB in cell_text(c)
                    for path in written for c in nbformat.read(path, as_version=4)["cells"])
    print(f"wrote {len(written)} student notebooks with {exercises} exercises to {args.out} "
          f"(instructor copy in {Path(args.out) / INSTRUCTOR}, linked files in {Path(args.out) / REFERENCE})")
    return 0
