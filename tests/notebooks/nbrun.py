"""Shared helpers for the notebook tests: which notebooks exist, and a kernel that runs one cell at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))
EXPLORATION = sorted((ROOT / "notebooks").glob("*.ipynb"))
ALL_NOTEBOOKS = TUTORIALS + EXPLORATION

# One thread, the mimetype plotly renderer: the environment the committed outputs were made in.
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PLOTLY_RENDERER": "plotly_mimetype"}


class CellRunner:
    """Runs code in one live kernel, one cell at a time; ``run`` returns the error name or None."""

    def __init__(self, client: NotebookClient) -> None:
        self.client = client
        self._index = 0
        self.last_evalue = ""   # the exception message of the last failing ``run`` ("" when it passed)
        self.last_outputs: list = []

    def run(self, source: str) -> tuple[str | None, str]:
        cell = nbformat.v4.new_code_cell(source)
        self.client.nb.cells.append(cell)
        index = len(self.client.nb.cells) - 1
        self.last_evalue = ""
        try:
            self.client.execute_cell(cell, index)
        except CellExecutionError as error:
            self.last_evalue = error.evalue or ""
            self.last_outputs = list(cell.outputs)
            return error.ename, str(error)
        self.last_outputs = list(cell.outputs)
        return None, ""

    def stdout(self, source: str) -> str:
        """Run ``source`` and return what it printed (raises if it fails)."""
        ename, text = self.run(source)
        if ename is not None:
            raise RuntimeError(text)
        return "".join(o.get("text", "") for o in self.last_outputs if o.get("output_type") == "stream")


@contextmanager
def kernel_for(path: Path, timeout: int = 180) -> Iterator[CellRunner]:
    """A fresh kernel started in the notebook's folder, as Jupyter would start it."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = nbformat.read(path, as_version=4).metadata
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    saved = {k: os.environ.get(k) for k in [*KERNEL_ENV, "SPYRE_LAB_DEVICES"]}
    os.environ.update(KERNEL_ENV)
    os.environ.pop("SPYRE_LAB_DEVICES", None)   # the committed notebooks see one card
    try:
        with client.setup_kernel():
            yield CellRunner(client)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
