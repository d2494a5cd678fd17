"""A compiled Program's kernels as KTIR files: the writer lives in the compiler (``KernelSpec.to_ktir``)."""

from __future__ import annotations

from pathlib import Path

from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.program import Program


def program_to_ktir(program: Program) -> dict[str, str | KTIRUnsupported]:
    """Every planned device kernel by name: its KTIR text, or the reason it is not written out."""
    out: dict[str, str | KTIRUnsupported] = {}
    for launch, kernel in zip(program.launches, program.kernels):
        if isinstance(launch, KernelSpec):
            try:
                out[launch.name] = launch.to_ktir(kernel.nodes)
            except KTIRUnsupported as e:
                out[launch.name] = e
    return out


def write_program(program: Program, directory: str | Path) -> list[Path]:
    """Write ``<kernel>.mlir`` per exported kernel (and ``<kernel>.unsupported.txt`` with the reason otherwise)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in program_to_ktir(program).items():
        path = root / (f"{name}.mlir" if isinstance(text, str) else f"{name}.unsupported.txt")
        path.write_text(text if isinstance(text, str) else f"{text}\n")
        written.append(path)
    return written
