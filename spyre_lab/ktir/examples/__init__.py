"""Hand-written KTIR kernels: ``path(name)`` is the file, ``load_example(name)`` the parsed module."""

from __future__ import annotations

from pathlib import Path

from spyre_lab.ktir.module import KTIRModule, load

HERE = Path(__file__).resolve().parent
NAMES = tuple(sorted(p.stem for p in HERE.glob("*.mlir")))


def path(name: str) -> Path:
    p = HERE / f"{name}.mlir"
    if not p.exists():
        raise FileNotFoundError(f"no KTIR example {name!r}; examples are {list(NAMES)}")
    return p


def load_example(name: str) -> KTIRModule:
    return load(path(name))
