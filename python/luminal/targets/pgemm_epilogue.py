"""A GEMM's elementwise consumer run by ``pgemm`` on each register tile it stores.

``compiler/search/gemm.py`` splits a kernel that sums a product and does more (a bias, an
activation) into a ``gemm`` call and an epilogue kernel that reads the product back. When that
epilogue is a straight-line f32 expression of the product, constants and one vector operand
along the output's rows or columns (a Linear's bias, a convolution's per-channel bias), it is
written here as a short register program in ``pgemm``'s descriptor fields, and the call stores
the expression's value instead of the product: one pass over C instead of two. The program is
the epilogue's own operations in the renderer's forms (``codegen/cstyle.py``: the 2-way max of
relu and clamp, ``fabs`` for max(x, -x), a compare cast to f32), so the fused call computes what
the separate kernel computes; the search times both (select.py) and keeps the faster.

Fields (csrc/cpu/pgemm_epilogue.inc reads them): ``epi`` the number of instructions;
``e<i>`` instruction i, ``op | dst << 8 | a << 16 | b << 24`` over registers (each a vector of
the tile), ``op + CONST_B`` reading constant b instead of register b; ``ec<j>`` constant j
(real); ``vec_axis`` 1 when the vector operand (the call's 4th buffer) is indexed by the
output's row (m), 2 by its column (n), with ``vec_off`` added to the index. The last
instruction's register is stored. The programs of a bias and the common activations are
compiled into pgemm (``kKnown`` there); any other is interpreted, slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..codegen.cstyle import _const_f32, abs_of
from ..compiler import kernel_ir as K
from ..compiler.search.gemm import _affine
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.symbolic import sint
from ..graph.view import contiguous_strides

# opcodes, as csrc/cpu/pgemm_epilogue.inc numbers them
X, VEC, CONST, ADD, MUL, RECIP, EXP2, SQRT, LT, MAX2, MAXC, ABS = range(1, 13)
BINARY = (ADD, MUL, LT, MAX2, MAXC)
CONST_B = 16  # op + CONST_B: b is a constant's index (kConstB)
UNARY = (RECIP, EXP2, SQRT, ABS)
# registers the C++ interpreter holds per vector of a tile (kEpiRegs)
REGISTERS = 16
# instructions at most (a GELU by erf's rational form takes 44)
MAX_INSTRUCTIONS = 96


@dataclass
class Program:
    """A fused epilogue: instructions as (op, a, b) over earlier instructions' values (or the
    constant's index for CONST), the constants, and the vector operand."""

    ops: list[tuple[int, int, int]]
    consts: list[float]
    vec: int | None = None  # buffer id
    vec_axis: int = 0  # 1: indexed by the output's row, 2: by its column
    vec_off: sint = 0


class _Refuse(Exception):
    pass


def program(epi: K.Kernel, prod: int) -> Program | None:
    """``epi`` (reading the product from buffer ``prod`` at its own output index) as a
    program over the product's value, or None when it is not a straight-line f32 expression
    of the product, constants and one vector along a row or column of the output."""
    if epi.dtype is not dt.f32 or epi.scatter_row is not None or len(epi.shape) < 2:
        return None
    rank = len(epi.shape)
    flat: sint = 0
    for j, st in enumerate(contiguous_strides(epi.shape)):
        flat = sym.add(flat, sym.mul(sym.index_var(j, epi.shape[j]), st))
    names = [f"_i{j}" for j in range(rank)]
    prog = Program([], [])
    memo: dict[K.Value, int] = {}
    seen: dict[tuple[int, int, int], int] = {}
    consts: dict[tuple[float, float], int] = {}

    def emit(op: int, a: int = 0, b: int = 0) -> int:
        key = (op, a, b)
        if key in seen:  # equal subtrees (relu's x read twice) computed once
            return seen[key]
        prog.ops.append(key)
        seen[key] = len(prog.ops) - 1
        return seen[key]

    def const(c: float) -> int:
        bits = (c, math.copysign(1.0, c))
        if bits not in consts:
            consts[bits] = len(prog.consts)
            prog.consts.append(c)
        return emit(CONST, consts[bits])

    def load(v: K.Load) -> int:
        if v.valid != 1 or v.dtype is not dt.f32:
            raise _Refuse
        if v.buf == prod:
            if v.index != flat:
                raise _Refuse
            return emit(X)
        aff = _affine(v.index, names)
        if aff is None:
            raise _Refuse
        off, coef = aff
        used = [n for n in names if coef[n] != 0]
        if used == [names[-1]] and coef[names[-1]] == 1:
            axis = 2
        elif used == [names[-2]] and coef[names[-2]] == 1:
            axis = 1
        else:
            raise _Refuse
        if prog.vec is not None and (prog.vec, prog.vec_axis, prog.vec_off) != (v.buf, axis, off):
            raise _Refuse  # one vector operand
        prog.vec, prog.vec_axis, prog.vec_off = v.buf, axis, off
        return emit(VEC)

    def rec(v: K.Value) -> int:
        hit = memo.get(v)
        if hit is not None:
            return hit
        out: int
        if isinstance(v, K.Load):
            out = load(v)
        elif isinstance(v, K.Const) and v.dtype is dt.f32:
            out = const(float(v.value))
        elif isinstance(v, K.Cast) and v.dtype is dt.f32 and isinstance(v.src, K.Alu) \
                and v.src.op is Op.LESS_THAN and v.src.srcs[0].dtype is dt.f32:  # fmt: skip
            a, b = (rec(x) for x in v.src.srcs)
            out = emit(LT, a, b)
        elif isinstance(v, K.Alu) and v.dtype is dt.f32:
            srcs = [rec(x) for x in v.srcs]
            unary = {Op.RECIP: RECIP, Op.EXP2: EXP2, Op.SQRT: SQRT}
            if v.op in unary:
                out = emit(unary[v.op], srcs[0])
            elif v.op in (Op.ADD, Op.MUL):
                out = emit(ADD if v.op is Op.ADD else MUL, srcs[0], srcs[1])
            else:
                raise _Refuse
        elif isinstance(v, K.Reduce) and v.op is Op.MAX_REDUCE and v.dtype is dt.f32 \
                and v.extent == 2:  # fmt: skip
            out = max2(v)
        else:
            raise _Refuse
        memo[v] = out
        return out

    def max2(v: K.Reduce) -> int:
        # cstyle's _unrolled: fabs for max(x, -x); against a plain constant lm_maxcf
        bodies = [K.substitute(v.body, {v.var.name: r}) for r in range(2)]
        a = abs_of(v, bodies)
        if a is not None:
            return emit(ABS, rec(a))
        x0, x1 = (rec(b) for b in bodies)
        c0, c1 = (_const_f32(b) for b in bodies)
        if _plain(c1):
            return emit(MAXC, x0, x1)
        if _plain(c0):
            return emit(MAXC, x1, x0)
        return emit(MAX2, x0, x1)

    try:
        root = rec(epi.value)
    except _Refuse:
        return None
    if not any(op == X for op, _, _ in prog.ops) or root != len(prog.ops) - 1:
        return None
    return prog if len(prog.ops) <= MAX_INSTRUCTIONS else None


def _plain(c: float | None) -> bool:
    return c is not None and not math.isnan(c) and not (c == 0 and math.copysign(1.0, c) < 0)


def _sources(op: int, a: int, b: int) -> list[int]:
    if op > CONST_B:
        return [a]
    return [a, b] if op in BINARY else [a] if op in UNARY else []


def allocate(prog: Program) -> list[int] | None:
    """The instructions encoded with registers. A constant operand is read by the op itself
    (``op + CONST_B``, b the constant's index); a value's register is free again after its
    last use. None when more than ``REGISTERS`` are live at once."""
    ops = prog.ops
    folded: list[tuple[int, int, int]] = []
    for op, a, b in ops:
        if op in (ADD, MUL) and ops[a][0] == CONST and ops[b][0] != CONST:
            a, b = b, a  # commutative: the constant as b
        if op in (ADD, MUL, LT, MAXC) and ops[b][0] == CONST and ops[a][0] != CONST:
            folded.append((op + CONST_B, a, ops[b][1]))
        else:
            folded.append((op, a, b))
    live = {len(folded) - 1}
    for i in range(len(folded) - 1, -1, -1):
        if i in live:
            live.update(_sources(*folded[i]))
    keep = sorted(live)
    new_id = {old: j for j, old in enumerate(keep)}
    kept = []
    for i in keep:
        op, a, b = folded[i]
        srcs = _sources(op, a, b)
        a = new_id[a] if srcs else a
        b = new_id[b] if len(srcs) > 1 else b
        kept.append((op, a, b))
    last: dict[int, int] = {}
    for i, (op, a, b) in enumerate(kept):
        for x in _sources(op, a, b):
            last[x] = i
    free = list(range(REGISTERS - 1, -1, -1))
    reg: dict[int, int] = {}
    codes: list[int] = []
    for i, (op, a, b) in enumerate(kept):
        srcs = _sources(op, a, b)
        ra = reg[srcs[0]] if srcs else a  # CONST: the constant's index
        rb = reg[srcs[1]] if len(srcs) > 1 else b if op > CONST_B else 0
        for x in set(srcs):
            if last.get(x) == i:
                free.append(reg[x])
        if not free:
            return None
        reg[i] = free.pop()
        codes.append(op | reg[i] << 8 | ra << 16 | rb << 24)
    return codes


def fused_call(call: K.LibCall, epi: K.Kernel) -> K.LibCall | None:
    """``call`` (a pgemm writing the product to a scratch buffer) storing ``epi``'s value into
    ``epi``'s output instead; None when the epilogue is not a program pgemm runs or the call
    adds to C (beta)."""
    if call.fields.get("beta", 0) != 0 or call.fields.get("alpha", 1) != 1:
        return None
    prog = program(epi, call.out)
    if prog is None:
        return None
    codes = allocate(prog)
    if codes is None:
        return None
    fields: dict[str, sint | float] = {**call.fields, "epi": len(codes)}
    fields.update({f"e{i}": c for i, c in enumerate(codes)})
    fields.update({f"ec{j}": float(c) for j, c in enumerate(prog.consts)})
    args = [call.args[0], call.args[1], epi.out]
    if prog.vec is not None:
        fields["vec_axis"], fields["vec_off"] = prog.vec_axis, prog.vec_off
        args.append(prog.vec)
    return replace(call, name=f"{epi.name}_pgemm", fields=fields, args=args, out=epi.out)
