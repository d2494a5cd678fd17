"""Affine sets and maps as KTIR writes them: ``affine_set<(d0, d1)[s0] : (d0 >= 0, -d0 + 63 >= 0)>`` and
``affine_map<(d0, d1) -> (d0, d1)>``. Expressions are sums of integer multiples of dims and symbols, with
``*``, ``floordiv``, ``ceildiv`` and ``mod`` by constants; they evaluate on python ints or numpy arrays.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spyre_lab.ktir.errors import KTIRParseError

Expr = Callable[[dict], object]
_TOKEN = re.compile(r"\s*(floordiv|ceildiv|mod|>=|<=|==|->|[A-Za-z_][A-Za-z0-9_]*|\d+|[-+*()\[\],:])")


class _Tokens:
    def __init__(self, text: str, line: int, col: int) -> None:
        self.items: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if not m:
                raise KTIRParseError(f"cannot read affine expression at {text[pos:pos + 12]!r}", line, col)
            self.items.append(m.group(1))
            pos = m.end()
        self.i, self.line, self.col = 0, line, col

    def peek(self) -> str | None:
        return self.items[self.i] if self.i < len(self.items) else None

    def take(self, want: str | None = None) -> str:
        t = self.peek()
        if t is None or (want is not None and t != want):
            raise KTIRParseError(f"affine: expected {want or 'more'}, found {t!r}", self.line, self.col)
        self.i += 1
        return t

    def names(self, open_: str, close: str) -> list[str]:
        out: list[str] = []
        self.take(open_)
        while self.peek() != close:
            out.append(self.take())
            if self.peek() == ",":
                self.take()
        self.take(close)
        return out

    # expr := term (('+'|'-') term)*; term := factor (('*'|floordiv|ceildiv|mod) factor)*;
    # factor := -factor | int | name | (expr)
    def expr(self, known: set[str]) -> Expr:
        left = self.term(known)
        while self.peek() in ("+", "-"):
            op, right = self.take(), self.term(known)
            left = (lambda a, b: lambda e: a(e) + b(e))(left, right) if op == "+" else \
                (lambda a, b: lambda e: a(e) - b(e))(left, right)
        return left

    def term(self, known: set[str]) -> Expr:
        left = self.factor(known)
        while self.peek() in ("*", "floordiv", "ceildiv", "mod"):
            op, right = self.take(), self.factor(known)
            left = _binary(op, left, right)
        return left

    def factor(self, known: set[str]) -> Expr:
        t = self.take()
        if t == "-":
            inner = self.factor(known)
            return lambda e: -inner(e)
        if t == "(":
            inner = self.expr(known)
            self.take(")")
            return inner
        if t.isdigit():
            v = int(t)
            return lambda e: v
        if t in known:
            return lambda e: e[t]
        raise KTIRParseError(f"affine: unknown name {t!r} (dims and symbols are {sorted(known)})", self.line,
                             self.col)


def _binary(op: str, a: Expr, b: Expr) -> Expr:
    if op == "*":
        return lambda e: a(e) * b(e)
    if op == "floordiv":
        return lambda e: a(e) // b(e)
    if op == "ceildiv":
        return lambda e: -((-a(e)) // b(e))
    return lambda e: a(e) % b(e)


@dataclass
class AffineSet:
    dims: list[str]
    symbols: list[str]
    constraints: list[tuple[Expr, str]]    # (expr, ">=" or "==") against 0
    text: str

    def contains(self, dims: Sequence, symbols: Sequence = ()) -> object:
        env = dict(zip(self.dims, dims)) | dict(zip(self.symbols, symbols))
        ok = True
        for e, rel in self.constraints:
            v = e(env)
            ok = ok & ((v >= 0) if rel == ">=" else (v == 0))
        return ok


@dataclass
class AffineMap:
    dims: list[str]
    symbols: list[str]
    results: list[Expr]
    text: str

    def apply(self, dims: Sequence, symbols: Sequence = ()) -> list:
        env = dict(zip(self.dims, dims)) | dict(zip(self.symbols, symbols))
        return [r(env) for r in self.results]

    def is_identity(self) -> bool:
        probe = list(range(3, 3 + len(self.dims)))
        return len(self.results) == len(self.dims) and self.apply(probe, [0] * len(self.symbols)) == probe


def _inner(text: str, head: str, line: int, col: int) -> str:
    if not (text.startswith(head + "<") and text.endswith(">")):
        raise KTIRParseError(f"expected {head}<...>, found {text[:40]!r}", line, col)
    return text[len(head) + 1:-1]


def _header(t: _Tokens) -> tuple[list[str], list[str]]:
    dims = t.names("(", ")")
    symbols = t.names("[", "]") if t.peek() == "[" else []
    return dims, symbols


def parse_set(text: str, line: int = 0, col: int = 0) -> AffineSet:
    t = _Tokens(_inner(text, "affine_set", line, col), line, col)
    dims, symbols = _header(t)
    t.take(":")
    t.take("(")
    cons: list[tuple[Expr, str]] = []
    known = set(dims) | set(symbols)
    while True:
        lhs = t.expr(known)
        rel = t.take()
        if rel not in (">=", "<=", "=="):
            raise KTIRParseError(f"affine_set: expected >=, <= or ==, found {rel!r}", line, col)
        rhs = t.expr(known)
        if rel == "<=":
            cons.append(((lambda a, b: lambda e: b(e) - a(e))(lhs, rhs), ">="))
        else:
            cons.append(((lambda a, b: lambda e: a(e) - b(e))(lhs, rhs), rel))
        if t.take() == ")":
            break
    if t.peek() is not None:
        raise KTIRParseError(f"affine_set: unexpected {t.peek()!r} after the constraints", line, col)
    return AffineSet(dims, symbols, cons, text)


def parse_map(text: str, line: int = 0, col: int = 0) -> AffineMap:
    t = _Tokens(_inner(text, "affine_map", line, col), line, col)
    dims, symbols = _header(t)
    t.take("->")
    t.take("(")
    results: list[Expr] = []
    known = set(dims) | set(symbols)
    while t.peek() != ")":
        results.append(t.expr(known))
        if t.peek() == ",":
            t.take()
    t.take(")")
    if t.peek() is not None:
        raise KTIRParseError(f"affine_map: unexpected {t.peek()!r} after the results", line, col)
    return AffineMap(dims, symbols, results, text)
