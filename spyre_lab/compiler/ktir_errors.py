"""The two ways reading KTIR can fail, each naming where: a malformed file, or a form outside the supported subset."""

from __future__ import annotations


class KTIRError(Exception):
    """Base of the KTIR reader's errors."""


class KTIRParseError(KTIRError):
    """The text is not well-formed KTIR (as far as this reader's grammar goes): names the line and column."""

    def __init__(self, message: str, line: int, col: int) -> None:
        self.message, self.line, self.col = message, line, col
        super().__init__(f"line {line}, column {col}: {message}")


class KTIRUnsupported(KTIRError):
    """Well-formed KTIR that uses an op or form this reader does not model: names the op and its line."""

    def __init__(self, op: str, line: int, why: str = "") -> None:
        self.op, self.line = op, line
        detail = f": {why}" if why else ""
        if op == "export":  # the exporter refusing a kernel: there is no KTIR line to point at yet
            super().__init__(f"not written as KTIR{detail} (docs/ktir.md lists the subset)")
            return
        super().__init__(f"line {line}: {op} is outside the KTIR subset spyre_lab models{detail} "
                         "(docs/ktir.md lists the subset)")
