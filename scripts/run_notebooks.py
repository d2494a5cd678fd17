"""Re-execute notebooks in place, deterministically, so they are ready to commit (``make notebooks``).

Each notebook runs top to bottom in a fresh kernel started in its own folder, with one thread and plotly's
mimetype renderer (no plotly.js embedded), the same environment ``pytest --nbval`` checks them in. Cell
timing metadata and widget state are not stored: they change on every run and would only add noise to a diff.

    python scripts/run_notebooks.py                   # every notebook in tutorials/ and notebooks/
    python scripts/run_notebooks.py tutorials/01_tour.ipynb
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tutorials", "notebooks")
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PLOTLY_RENDERER": "plotly_mimetype",
              "PYTHONHASHSEED": "0"}
MAX_BYTES = 1_500_000


def find_notebooks(args: list[str]) -> list[Path]:
    """The notebooks named (files or folders), or every one in tutorials/ and notebooks/."""
    paths = [Path(a) for a in args] or [ROOT / f for f in FOLDERS]
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(path.glob("*.ipynb")))
        elif path.suffix == ".ipynb" and path.exists():
            found.append(path)
        else:
            raise SystemExit(f"not a notebook or a folder of notebooks: {path}")
    return found


def execute(path: Path, timeout: int = 300):
    """The notebook at ``path`` executed in a fresh kernel (raises on the first failing cell)."""
    import nbformat
    from nbclient import NotebookClient

    os.environ.update(KERNEL_ENV)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            store_widget_state=False, resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    merge = CoalesceStreamsPreprocessor()
    for index, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            merge.preprocess_cell(cell, {}, index)  # one stdout block per cell, however the kernel flushed it
    nb.metadata.pop("widgets", None)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="notebooks or folders (default: tutorials/ and notebooks/)")
    args = parser.parse_args(argv)
    import nbformat

    for path in find_notebooks(args.paths):
        start = time.perf_counter()
        nb = execute(path)
        nbformat.write(nb, path)
        size = path.stat().st_size
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{time.perf_counter() - start:.1f} s wall, {size / 1e3:.0f} kB")
        if size > MAX_BYTES:
            print(f"  {path.name} is {size / 1e6:.1f} MB: over the {MAX_BYTES / 1e6:.1f} MB budget "
                  "(is plotly.js embedded? keep the plotly_mimetype renderer)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
