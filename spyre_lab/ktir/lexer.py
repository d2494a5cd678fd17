"""KTIR text -> tokens, each with its line and column.

MLIR's custom assembly is irregular, so the lexer keeps the pieces whole that the grammar never looks
inside: a type or attribute with angle brackets (``tensor<1x64xf16>``, ``affine_set<(d0) : (d0 >= 0)>``,
``#ktdp.memory_space<global>``) is one token, and its text is parsed later by whoever needs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spyre_lab.ktir.errors import KTIRParseError


@dataclass(frozen=True)
class Token:
    kind: str     # value (%x), block (^bb0), symbol (@f), alias (#a), type (!t), ident, number, string, punct
    text: str
    line: int
    col: int


_SIMPLE = [
    ("number", re.compile(r"-?0x[0-9a-fA-F]+|-?\d+\.\d*(?:[eE][-+]?\d+)?|-?\d+(?:[eE][-+]?\d+)?")),
    ("value", re.compile(r"%[A-Za-z0-9_$.#-]+")),
    ("block", re.compile(r"\^[A-Za-z0-9_$.-]+")),
    ("symbol", re.compile(r"@[A-Za-z0-9_$.-]+")),
    ("alias", re.compile(r"#[A-Za-z_][A-Za-z0-9_$.]*")),
    ("type", re.compile(r"![A-Za-z_][A-Za-z0-9_$.]*")),
    ("ident", re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")),
    ("string", re.compile(r'"(?:[^"\\\n]|\\.)*"')),
    ("punct", re.compile(r"->|>=|<=|==|[()\[\]{},:=<>+\-*?]")),
]


def tokenize(text: str) -> list[Token]:
    """Split KTIR into tokens; ``//`` comments and whitespace go, an unknown character is a parse error."""
    tokens: list[Token] = []
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    pos, n = 0, len(text)

    def where(p: int) -> tuple[int, int]:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= p:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, p - starts[lo] + 1

    while pos < n:
        ch = text[pos]
        if ch in " \t\r\n":
            pos += 1
            continue
        if text.startswith("//", pos):
            end = text.find("\n", pos)
            pos = n if end < 0 else end
            continue
        for kind, pattern in _SIMPLE:  # noqa: B007 - the matching kind is used after the loop
            m = pattern.match(text, pos)
            if m:
                break
        else:
            line, col = where(pos)
            raise KTIRParseError(f"unexpected character {ch!r}", line, col)
        end = m.end()
        if kind in ("ident", "alias", "type") and end < n and text[end] == "<":
            end = _angle_end(text, end, where)
        after_operand = tokens and tokens[-1].kind in ("value", "ident", "number") and "." not in tokens[-1].text
        if kind == "number" and ch == "-" and after_operand:  # ``d0 -1`` reads as minus, one; ``constant -4.0`` not
            m = _SIMPLE[-1][1].match(text, pos)
            end = m.end()
            kind = "punct"
        line, col = where(pos)
        tokens.append(Token(kind, text[pos:end], line, col))
        pos = end
    return tokens


def _angle_end(text: str, start: int, where) -> int:
    """End of the balanced ``<...>`` at ``start`` (``->``, ``>=``, ``<=`` do not count as brackets)."""
    depth, pos = 0, start
    while pos < len(text):
        two = text[pos:pos + 2]
        if two in ("->", ">=", "<="):
            pos += 2
            continue
        ch = text[pos]
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
            if depth == 0:
                return pos + 1
        elif ch == '"':
            close = text.find('"', pos + 1)
            pos = close if close > 0 else pos
        pos += 1
    line, col = where(start)
    raise KTIRParseError("'<' is never closed by a matching '>'", line, col)
