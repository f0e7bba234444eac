"""Rewrite rules as data: the s-expression DSL of the ``*.rules`` files beside this module.

The language is documented in docs/rules.md. This module only parses and checks it; the
e-graph (``search/egraph.py``) matches and applies the parsed rules. Every file here is parsed
at import, so a malformed rule fails loudly, naming its file and line, before any compile.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ....graph import dtypes as dt
from ....graph.ops import COMMUTATIVE as COMMUTATIVE  # re-exported for the e-graph
from ....graph.ops import Op

# pattern heads -> (op, number of tensor children, attribute kind or None)
OPS: dict[str, tuple[Op, int, str | None]] = {
    "exp2": (Op.EXP2, 1, None), "log2": (Op.LOG2, 1, None), "sin": (Op.SIN, 1, None),
    "sqrt": (Op.SQRT, 1, None), "recip": (Op.RECIP, 1, None),
    "add": (Op.ADD, 2, None), "mul": (Op.MUL, 2, None), "mod": (Op.MOD, 2, None),
    "lt": (Op.LESS_THAN, 2, None),
    "sum": (Op.SUM_REDUCE, 1, "axis"), "max": (Op.MAX_REDUCE, 1, "axis"),
    "cast": (Op.CAST, 1, "dtype"),
}  # fmt: skip
# value functions: python arithmetic on numbers, or an op evaluated by the interpreter
ARITH = {"+": 2, "-": 2, "*": 2, "/": 2, "neg": 1}
FOLD = {k: v for k, v in OPS.items() if v[2] != "axis"}
PREMISES = {
    "float": 1, "int": 1,  # dtype of an operand or constant
    "num": 1, "finite": 1, "negzero": 1, "posinf": 1, "neginf": 1,  # a constant's value
    "=": 2, "!=": 2, "<": 2, "<=": 2, ">": 2, ">=": 2,
}  # fmt: skip
RULES_DIR = os.path.dirname(__file__)


class RuleSyntaxError(ValueError):
    """A malformed rule file; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class PVar:
    """``?x`` in a tensor position: an operand (an e-class read through a view)."""

    name: str


@dataclass(frozen=True)
class PConst:
    """``(const v)``: a scalar constant broadcast without padding; ``v`` a number or value
    variable (pattern side) or a value expression (replacement side)."""

    value: Value


@dataclass(frozen=True)
class POp:
    op: Op
    attr: Value | None  # reduce axis or cast dtype: a literal or a value variable
    kids: tuple[Pattern, ...]


@dataclass(frozen=True)
class VVar:
    """``?c`` in a value position: a constant's value, a reduce axis or a cast dtype."""

    name: str


@dataclass(frozen=True)
class VCall:
    fn: str
    args: tuple[Value, ...]


Pattern = PVar | PConst | POp
Value = VVar | VCall | int | float | dt.DType


@dataclass(frozen=True)
class Rule:
    name: str
    lhs: POp
    rhs: Pattern
    premises: tuple[VCall, ...]
    where: str  # "file:line", for messages

    def __repr__(self) -> str:
        return f"Rule({self.name} @ {self.where})"


# ----------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class _Tok:
    text: str
    line: int


SExpr = _Tok | list


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    for ln, line in enumerate(text.splitlines(), 1):
        line = line.split(";", 1)[0]
        for t in line.replace("(", " ( ").replace(")", " ) ").split():
            out.append(_Tok(t, ln))
    return out


class _Reader:
    def __init__(self, text: str, file: str) -> None:
        self.toks = _tokens(text)
        self.pos = 0
        self.file = file

    def err(self, line: int, msg: str) -> RuleSyntaxError:
        return RuleSyntaxError(f"{self.file}:{line}: {msg}")

    def forms(self) -> list[tuple[int, list]]:
        out = []
        while self.pos < len(self.toks):
            t = self.toks[self.pos]
            x = self.read()
            if not isinstance(x, list):
                raise self.err(t.line, f"expected '(rule ...)', got {t.text!r}")
            out.append((t.line, x))
        return out

    def read(self) -> SExpr:
        t = self.toks[self.pos]
        self.pos += 1
        if t.text == ")":
            raise self.err(t.line, "unbalanced ')'")
        if t.text != "(":
            return t
        items: list = []
        while True:
            if self.pos >= len(self.toks):
                raise self.err(t.line, "'(' is never closed")
            if self.toks[self.pos].text == ")":
                self.pos += 1
                return items
            items.append(self.read())


def _line(x: SExpr, default: int) -> int:
    if isinstance(x, _Tok):
        return x.line
    return _line(x[0], default) if x else default


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        v = float(text)
    except ValueError:
        return None
    return v if not math.isnan(v) else None  # a NaN literal could never compare equal


class _RuleParser:
    """Parses one ``(rule ...)`` form, checking names, arities and variable use."""

    def __init__(self, reader: _Reader, line: int) -> None:
        self.r, self.line = reader, line
        self.kinds: dict[str, str] = {}  # variable -> "operand" | "value"

    def err(self, x: SExpr | None, msg: str) -> RuleSyntaxError:
        return self.r.err(_line(x, self.line) if x is not None else self.line, msg)

    def var(self, tok: _Tok, kind: str, binding: bool) -> str:
        name = tok.text
        if len(name) < 2 or not name[0] == "?":
            raise self.err(tok, f"expected a variable like ?x, got {name!r}")
        have = self.kinds.get(name)
        if have is None:
            if not binding:
                raise self.err(tok, f"variable {name} is not bound by the pattern")
            self.kinds[name] = kind
        elif have != kind:
            raise self.err(tok, f"variable {name} is used both as {have} and as {kind}")
        return name

    def pattern(self, x: SExpr, lhs: bool) -> Pattern:
        if isinstance(x, _Tok):
            if x.text.startswith("?"):
                return PVar(self.var(x, "operand", lhs))
            raise self.err(x, f"expected a pattern, got {x.text!r}")
        if not x or not isinstance(x[0], _Tok):
            raise self.err(x, "expected (op ...)")
        head = x[0].text
        if head == "const":
            if len(x) != 2:
                raise self.err(x, "const takes one value")
            return PConst(self.value(x[1], lhs and not isinstance(x[1], list), lhs))
        if head not in OPS:
            raise self.err(x, f"unknown op {head!r} (have: const, {', '.join(OPS)})")
        op, nkids, attr_kind = OPS[head]
        want = nkids + (attr_kind is not None)
        if len(x) - 1 != want:
            raise self.err(x, f"{head} takes {want} arguments, got {len(x) - 1}")
        attr: Value | None = None
        if attr_kind is not None:
            attr = self.attr(x[1], attr_kind, lhs)
        kids = tuple(self.pattern(k, lhs) for k in x[1 + (attr is not None) :])
        return POp(op, attr, kids)

    def attr(self, x: SExpr, kind: str, lhs: bool) -> Value:
        if isinstance(x, _Tok) and kind == "dtype" and not x.text.startswith("?"):
            try:
                return dt.to_dtype(x.text)
            except (TypeError, ValueError, KeyError):
                raise self.err(x, f"unknown dtype {x.text!r}") from None
        v = self.value(x, lhs and isinstance(x, _Tok), lhs)
        if isinstance(v, float):
            raise self.err(x, f"a reduce axis must be an integer, got {v}")
        return v

    def value(self, x: SExpr, binding: bool, lhs: bool) -> Value:
        if isinstance(x, _Tok):
            if x.text.startswith("?"):
                return VVar(self.var(x, "value", binding))
            n = _number(x.text)
            if n is None:
                raise self.err(x, f"expected a number or ?var, got {x.text!r}")
            return n
        if lhs:
            raise self.err(x, "a pattern may only hold numbers or variables here")
        return self.call(x)

    def call(self, x: list) -> VCall:
        fn = x[0].text if x and isinstance(x[0], _Tok) else ""
        if fn in ARITH:
            want = ARITH[fn]
        elif fn in FOLD:
            want = FOLD[fn][1] + (FOLD[fn][2] is not None)
        else:
            raise self.err(x, f"unknown function {fn!r} (have: {', '.join([*ARITH, *FOLD])})")
        args = x[1:]
        if len(args) != want:
            raise self.err(x, f"{fn} takes {want} arguments, got {len(args)}")
        if fn == "cast":
            d = self.attr(args[0], "dtype", False)
            return VCall(fn, (d, self.value(args[1], False, False)))
        return VCall(fn, tuple(self.value(a, False, False) for a in args))

    def premise(self, x: SExpr) -> VCall:
        if not isinstance(x, list) or not x or not isinstance(x[0], _Tok):
            raise self.err(x, "a premise is (name args...)")
        fn = x[0].text
        if fn not in PREMISES:
            raise self.err(x, f"unknown premise {fn!r} (have: {', '.join(PREMISES)})")
        if len(x) - 1 != PREMISES[fn]:
            raise self.err(x, f"{fn} takes {PREMISES[fn]} arguments, got {len(x) - 1}")
        if fn in ("float", "int"):
            tok = x[1]
            if not isinstance(tok, _Tok) or tok.text not in self.kinds:
                raise self.err(x, f"{fn} needs a variable bound by the pattern")
            return VCall(fn, (VVar(tok.text),))  # an operand's or a constant's dtype
        return VCall(fn, tuple(self.value(a, False, False) for a in x[1:]))

    def rule(self, form: list) -> Rule:
        # (rule NAME LHS => RHS [:if PREMISE...])
        if len(form) < 5 or not isinstance(form[1], _Tok):
            raise self.err(form, "expected (rule NAME PATTERN => REPLACEMENT [:if PREMISE...])")
        name = form[1].text
        arrow = form[3]
        if not isinstance(arrow, _Tok) or arrow.text != "=>":
            raise self.err(arrow, f"rule {name}: expected '=>' after the pattern")
        lhs = self.pattern(form[2], True)
        if not isinstance(lhs, POp):
            raise self.err(form[2], f"rule {name}: the pattern must start with an op")
        rhs = self.pattern(form[4], False)
        rest = form[5:]
        premises: list[VCall] = []
        if rest:
            if not isinstance(rest[0], _Tok) or rest[0].text != ":if":
                raise self.err(rest[0], f"rule {name}: expected ':if' before premises")
            if len(rest) == 1:
                raise self.err(rest[0], f"rule {name}: ':if' with no premises")
            premises = [self.premise(p) for p in rest[1:]]
        return Rule(name, lhs, rhs, tuple(premises), f"{self.r.file}:{self.line}")


def parse(text: str, file: str = "<string>") -> list[Rule]:
    """The rules of one file's text; RuleSyntaxError names ``file`` and the line."""
    reader = _Reader(text, file)
    out: list[Rule] = []
    names: set[str] = set()
    for line, form in reader.forms():
        if not form or not isinstance(form[0], _Tok) or form[0].text != "rule":
            raise reader.err(line, "expected '(rule ...)'")
        rule = _RuleParser(reader, line).rule(form)
        if rule.name in names:
            raise reader.err(line, f"rule {rule.name!r} is defined twice")
        names.add(rule.name)
        out.append(rule)
    return out


def load(directory: str = RULES_DIR) -> list[Rule]:
    """Every ``*.rules`` file of ``directory`` in name order (so rule order is stable)."""
    out: list[Rule] = []
    seen: dict[str, str] = {}
    for fn in sorted(os.listdir(directory)):
        if fn.endswith(".rules"):
            with open(os.path.join(directory, fn), encoding="utf-8") as f:
                for r in parse(f.read(), fn):
                    if r.name in seen:
                        raise RuleSyntaxError(f"{r.where}: rule {r.name!r} is already defined "
                                              f"at {seen[r.name]}")  # fmt: skip
                    seen[r.name] = r.where
                    out.append(r)
    return out


DEFAULT: list[Rule] = load()
