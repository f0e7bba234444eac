"""The 15 primitive operations and the three non-op node kinds, with named groups.

Passes ask "is it in UNARY?" rather than repeating lists; nothing dispatches on names.
"""

from __future__ import annotations

import enum


class Op(enum.Enum):
    # unary (float in, float out)
    EXP2 = enum.auto()
    LOG2 = enum.auto()
    SIN = enum.auto()
    SQRT = enum.auto()
    RECIP = enum.auto()
    # binary (same dtype in; LESS_THAN gives bool)
    ADD = enum.auto()
    MUL = enum.auto()
    MOD = enum.auto()  # C fmod semantics: the result has the sign of the dividend
    LESS_THAN = enum.auto()
    # reduce along one axis (arg: the axis; the axis is removed)
    SUM_REDUCE = enum.auto()
    MAX_REDUCE = enum.auto()
    # index
    IOTA = enum.auto()  # arg: an expression of the index variables _i0.. of the output
    GATHER = enum.auto()  # out[i.., j..] = data[idx[i..], j..]; out of range reads 0
    SCATTER = enum.auto()  # out = dest; out[idx[i..], j..] = src[i.., j..]; out of range skipped
    # type
    CAST = enum.auto()  # arg: the target dtype

    def __repr__(self) -> str:
        return f"Op.{self.name}"


class Leaf(enum.Enum):
    """Nodes that are not operations."""

    INPUT = enum.auto()  # arg: (name, is_weight)
    CONSTANT = enum.auto()  # arg: a Python scalar or a symbolic int expression; shape ()
    OUTPUT = enum.auto()  # arg: name

    def __repr__(self) -> str:
        return f"Leaf.{self.name}"


UNARY = frozenset({Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP})
BINARY = frozenset({Op.ADD, Op.MUL, Op.MOD, Op.LESS_THAN})
REDUCE = frozenset({Op.SUM_REDUCE, Op.MAX_REDUCE})
INDEX = frozenset({Op.IOTA, Op.GATHER, Op.SCATTER})
TYPE = frozenset({Op.CAST})
ELEMENTWISE = UNARY | BINARY | TYPE
PRIMITIVES = UNARY | BINARY | REDUCE | INDEX | TYPE
# binary ops whose operands commute
COMMUTATIVE = frozenset({Op.ADD, Op.MUL})
# unary ops that cost far more than an add or a multiply (a polynomial or a library call)
TRANSCENDENTAL = frozenset({Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP})
assert len(PRIMITIVES) == len(Op) == 15
