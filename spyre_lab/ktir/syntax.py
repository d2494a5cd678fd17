"""Tokens -> a tree of operations: results, op name, the op's own tokens, attribute dicts and regions.

The grammar is MLIR's generic shape, not each op's custom syntax: an op is ``[%r, ... =] name body``;
its body runs until the next op starts at bracket depth 0 (a result list followed by ``=``, or a
dotted op name) or its region closes. A ``{`` opens an attribute dict when ``key =`` follows it, a
region otherwise. What each op's body means is read later, op by op (:mod:`spyre_lab.ktir.ops`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spyre_lab.ktir.errors import KTIRParseError
from spyre_lab.ktir.lexer import Token, tokenize

_OPEN, _CLOSE = {"(": ")", "[": "]"}, {")", "]"}
_BARE_OPS = {"return", "module"}


@dataclass
class Region:
    args: list[Token]            # ^bb0(%a: type, ...) block arguments, names only
    ops: list[Op]


@dataclass
class Op:
    name: str
    results: list[str]
    body: list[Token]            # the op's tokens outside its attribute dicts and regions
    attrs: dict[str, list[Token]]
    regions: list[Region]
    line: int
    col: int

    def values(self) -> list[str]:
        """Every %value the body names, in order."""
        return [t.text for t in self.body if t.kind == "value"]


@dataclass
class Document:
    ops: list[Op]
    aliases: dict[str, Token] = field(default_factory=dict)


class _Reader:
    def __init__(self, tokens: list[Token], end: tuple[int, int]) -> None:
        self.toks, self.i, self.end = tokens, 0, end

    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def next(self) -> Token:
        t = self.peek()
        if t is None:
            raise KTIRParseError("the text ends in the middle of an operation", *self.end)
        self.i += 1
        return t

    def expect(self, text: str) -> Token:
        t = self.next()
        if t.text != text:
            raise KTIRParseError(f"expected {text!r}, found {t.text!r}", t.line, t.col)
        return t

    # --- where ops start ----------------------------------------------------------------------
    def result_list_ahead(self) -> bool:
        """``%a, %b =`` starts here (the results of the next op)."""
        j = self.i
        while j < len(self.toks) and self.toks[j].kind == "value":
            j += 1
            if j < len(self.toks) and self.toks[j].text == "=":
                return True
            if j < len(self.toks) and self.toks[j].text == ",":
                j += 1
                continue
            return False
        return False

    def op_name_ahead(self) -> bool:
        t = self.peek()
        return t is not None and t.kind == "ident" and "<" not in t.text and ("." in t.text or t.text in _BARE_OPS)

    # --- blocks and ops -----------------------------------------------------------------------
    def block(self, top: bool = False) -> tuple[list[Op], dict[str, Token]]:
        ops: list[Op] = []
        aliases: dict[str, Token] = {}
        while True:
            t = self.peek()
            if t is None:
                if top:
                    return ops, aliases
                raise KTIRParseError("a region is never closed with '}'", *self.end)
            if t.text == "}" and not top:
                return ops, aliases
            if top and t.kind == "alias" and self.peek(1) is not None and self.peek(1).text == "=":
                self.i += 2
                aliases[t.text] = self.next()
                continue
            if self.result_list_ahead() or self.op_name_ahead():
                ops.append(self.op())
                continue
            raise KTIRParseError(f"expected an operation, found {t.text!r}", t.line, t.col)

    def op(self) -> Op:
        first = self.peek()
        results: list[str] = []
        if self.result_list_ahead():
            while True:
                results.append(self.next().text)
                if self.next().text == "=":
                    break
        name_tok = self.next()
        if not (name_tok.kind == "ident" and ("." in name_tok.text or name_tok.text in _BARE_OPS)):
            raise KTIRParseError(f"expected an op name after '=', found {name_tok.text!r}", name_tok.line,
                                 name_tok.col)
        op = Op(name_tok.text, results, [], {}, [], first.line, first.col)
        depth: list[str] = []
        while True:
            t = self.peek()
            if t is None:
                return op
            if not depth:
                if t.text == "}" or ((self.result_list_ahead() or self.op_name_ahead()) and not self._continues(op)):
                    return op
                if t.text == "{":
                    self._brace(op)
                    continue
            self.i += 1
            if t.text in _OPEN:
                depth.append(_OPEN[t.text])
            elif t.text in _CLOSE:
                if not depth or depth.pop() != t.text:
                    raise KTIRParseError(f"unbalanced {t.text!r}", t.line, t.col)
            elif t.text in "{}":
                raise KTIRParseError(f"{t.text!r} inside brackets", t.line, t.col)
            op.body.append(t)

    def _continues(self, op: Op) -> bool:
        """An ``scf.for %iv = ...`` names its induction variable with ``=``: that is not a new op."""
        return op.name == "scf.for" and len(op.body) == 0

    def _brace(self, op: Op) -> None:
        open_tok = self.expect("{")
        a, b = self.peek(), self.peek(1)
        # an attribute dict: ``{key = ...}``, the key plain, quoted or dialect-prefixed (``ktdf.num_phases``);
        # a region never starts with ``name =`` (an op's results come first)
        if a is not None and b is not None and a.kind in ("ident", "string") and b.text == "=":
            self._attr_dict(op)
            return
        if a is not None and a.text == "}":
            self.i += 1
            op.attrs.setdefault("", [])
            return
        args: list[Token] = []
        if a is not None and a.kind == "block":
            self.i += 1
            if self.peek() is not None and self.peek().text == "(":
                self.i += 1
                while self.peek() is not None and self.peek().text != ")":
                    t = self.next()
                    if t.kind == "value":
                        args.append(t)
                self.expect(")")
            self.expect(":")
        ops, _ = self.block()
        close = self.expect("}")
        del open_tok, close
        op.regions.append(Region(args, ops))

    def _attr_dict(self, op: Op) -> None:
        while True:
            key = self.next()
            self.expect("=")
            value: list[Token] = []
            depth = 0
            while True:
                t = self.peek()
                if t is None:
                    raise KTIRParseError("an attribute dict is never closed with '}'", *self.end)
                if depth == 0 and t.text in (",", "}"):
                    break
                depth += t.text in ("[", "(", "{")
                depth -= t.text in ("]", ")", "}")
                value.append(self.next())
            if not value:
                raise KTIRParseError(f"attribute {key.text} has no value", key.line, key.col)
            op.attrs[key.text.strip('"')] = value
            if self.next().text == "}":
                return


def parse(text: str) -> Document:
    """Parse KTIR text into a :class:`Document` (raises :class:`KTIRParseError` with line and column)."""
    lines = text.split("\n")
    reader = _Reader(tokenize(text), (len(lines), len(lines[-1]) + 1))
    ops, aliases = reader.block(top=True)
    return Document(ops, aliases)
