"""KTIR in and out: spyre_lab's kernels as the real stack's Kernel Tile IR, and KTIR kernels on spyre_lab's device.

``load(text_or_path)`` parses the subset documented in docs/ktir.md and turns each function into per-core
tile programs (:class:`~spyre_lab.device.isa.TileProgram`) that run numerically and simulate like a
compiled kernel; :func:`~spyre_lab.ktir.export.program_to_ktir` writes a compiled Program's kernels out.
"""

from spyre_lab.ktir.errors import KTIRError, KTIRParseError, KTIRUnsupported
from spyre_lab.ktir.module import KTIRFunction, KTIRModule, KTIRResult, load

__all__ = ["KTIRError", "KTIRFunction", "KTIRModule", "KTIRParseError", "KTIRResult", "KTIRUnsupported", "load"]
