"""The KTIR reader's errors (defined next to the compiler's KTIR writer, which raises them too)."""

from spyre_lab.compiler.ktir_errors import KTIRError, KTIRParseError, KTIRUnsupported

__all__ = ["KTIRError", "KTIRParseError", "KTIRUnsupported"]
