"""The C-style emitter every backend's renderer builds on (C for the CPU, CUDA; Metal next).

``Emitter`` turns kernel-IR value trees into SSA statements of C: loads and stores with the
storage types' conversions (low-precision floats compute in f32 and round once, at the
store), reductions as loops, gathers, masks, and the online-softmax sum. A backend subclasses
it and changes a few fields (``index_type``, ``simd_reductions``, ``fast_exp2``, ``fast_log2``) and hooks
(``vector_sum``); its kernel renderer wraps the statements in the backend's entry point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..compiler import kernel_ir as K
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import COMMUTATIVE, Op
from ..graph.symbolic import sint

# (decode, encode) for stored types that compute as f32
_SMALL = {
    dt.f8e4m3: (4, 3, 7, 1),
    dt.f8e5m2: (5, 2, 15, 0),
    dt.fp4e2m1: (2, 1, 1, 2),
}


def ctype(d: dt.DType) -> str:
    """The C type a value of dtype ``d`` is computed in."""
    if d.is_float:
        return "double" if d is dt.f64 else "float"
    # bools compute as 32-bit ints: a byte-wide value in a float loop stops GCC vectorizing it
    # (it sizes vectors by the narrowest type: 64 byte lanes, no 64-lane float vector)
    return {dt.bool_: "int32_t", dt.i4: "int8_t", dt.u4: "uint8_t"}.get(d, d.c_type)


def _c_name(v: sym.Expr) -> str:
    n = v.name
    if n.startswith("_i") or n.startswith("_r") or n.startswith("_g"):
        return n[1:]
    return f"d_{n}"


def cexpr(e: sint) -> str:
    return sym.render(e, _c_name, "c")


def _const(value: float | int | bool, d: dt.DType) -> str:
    if d.is_float:
        f = float(value)
        if math.isnan(f):
            return "NAN"
        if math.isinf(f):
            return "INFINITY" if f > 0 else "-INFINITY"
        return repr(f) + ("" if d is dt.f64 else "f")
    if d is dt.bool_:
        return "1" if value else "0"
    return f"({ctype(d)}){int(value)}LL"


def load_expr(ptr: str, idx: str, d: dt.DType) -> str:
    """Read element ``idx`` of a buffer of dtype ``d`` as its compute type."""
    if d.packed:
        nib = f"(({ptr}[({idx}) >> 1] >> ((({idx}) & 1) * 4)) & 15)"
        if d is dt.i4:
            return f"((int8_t)({nib} << 4) >> 4)"
        if d is dt.u4:
            return f"(uint8_t){nib}"
        return f"lm_small_to_f32({nib}, {', '.join(map(str, _SMALL[d]))})"
    raw = f"{ptr}[{idx}]"
    if d is dt.f16:
        return f"lm_f16_to_f32({raw})"
    if d is dt.bf16:
        return f"lm_bf16_to_f32({raw})"
    if d is dt.e8m0:
        return f"lm_e8m0_to_f32({raw})"
    if d in _SMALL:
        return f"lm_small_to_f32({raw}, {', '.join(map(str, _SMALL[d]))})"
    return raw


def store_stmt(ptr: str, idx: str, val: str, d: dt.DType) -> str:
    if d.packed:
        enc = (
            f"(uint8_t)({val} & 15)"
            if d in (dt.i4, dt.u4)
            else f"lm_f32_to_small({val}, {', '.join(map(str, _SMALL[d]))})"
        )
        return (f"{{ int64_t q = {idx}; uint8_t sh = (uint8_t)((q & 1) * 4); "
                f"{ptr}[q >> 1] = (uint8_t)(({ptr}[q >> 1] & ~(15 << sh)) | ((({enc}) & 15) << sh)); }}")  # fmt: skip
    conv = {dt.f16: "lm_f32_to_f16", dt.bf16: "lm_f32_to_bf16", dt.e8m0: "lm_f32_to_e8m0"}.get(d)
    if conv:
        return f"{ptr}[{idx}] = {conv}({val});"
    if d in _SMALL:
        return f"{ptr}[{idx}] = (uint8_t)lm_f32_to_small({val}, {', '.join(map(str, _SMALL[d]))});"
    return f"{ptr}[{idx}] = {val};"


def storage_ctype(d: dt.DType) -> str:
    return d.c_type


_UNARY_F = {Op.EXP2: "exp2", Op.LOG2: "log2", Op.SIN: "sin", Op.SQRT: "sqrt"}


def _select_safe(v: K.Value, done: Callable[[K.Value], bool]) -> bool:
    """Whether ``v`` may be computed where its mask is false: no memory read (a padded
    window's read past its row), no loop of more than a few terms (work the mask saves) and
    no integer remainder (a division by zero traps) but in parts already computed (``done``:
    emitted outside the mask); float math never traps."""
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if id(x) in seen or done(x):
            continue
        seen.add(id(x))
        if isinstance(x, K.Reduce) and isinstance(x.extent, int) and x.extent <= 4:
            stack.append(x.body)  # written out (a max against a constant), no loop
            continue
        if isinstance(x, (K.Load, K.Gather, K.Reduce, K.SoftmaxSum)):
            return False
        if isinstance(x, K.Alu) and x.op is Op.MOD and not x.dtype.is_float:
            return False
        if isinstance(x, K.Alu):
            stack.extend(x.srcs)
        elif isinstance(x, K.Cast):
            stack.append(x.src)
        elif isinstance(x, K.Masked):
            stack.append(x.value)
    return True


class Emitter:
    """Emits value trees as SSA statements; nested blocks get their own memo scope.
    ``index_type`` is the C type of loop and gather variables."""

    index_type = "int64_t"

    def __init__(self, ptr_of: Callable[[int], str]) -> None:
        self.ptr_of = ptr_of
        self.lines: list[str] = []
        self.scopes: list[dict[K.Value, str]] = [{}]
        self.n = 0
        self.fv_memo: dict[int, frozenset[str]] = {}
        self.ranges: dict[int, K.Range | None] = {}  # value_range's memo, keyed as fv_memo
        # values made while rendering (unrolled copies): fv_memo is keyed by id, so they must
        # outlive the kernel, or a new value could inherit a dead one's id and its entry
        self.made: list[K.Value] = []
        # row sums whose body values are also written to a row buffer (cpu/rows.py): reduction
        # -> buffer name; the ones actually written so are recorded in ``cached``
        self.row_cache: dict[K.Reduce, str] = {}
        self.cached: set[K.Reduce] = set()
        # a row kernel's prefetch of the next row, placed in one of its loops (cpu/rows.py)
        self.prefetch: Any = None  # a RowPrefetch (cpu/rows.py) or None

    def checkpoint(self) -> Callable[[], None]:
        """A function that puts the emitter back as it is now (lines, temporaries and the
        innermost scope): a vector form that finds a value it cannot vectorize backs out."""
        lines, n, scope = list(self.lines), self.n, dict(self.scopes[-1])

        def restore() -> None:
            self.lines[:] = lines
            self.n = n
            self.scopes[-1].clear()
            self.scopes[-1].update(scope)

        return restore

    def tmp(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def emit(self, v: K.Value, indent: str) -> str:
        for s in reversed(self.scopes):
            if v in s:
                return s[v]
        e = self._emit(v, indent)
        if isinstance(v, K.Const) or e.isidentifier():
            self.scopes[-1][v] = e
            return e
        name = self.tmp()
        self.lines.append(f"{indent}const {ctype(v.dtype)} {name} = {e};")
        self.scopes[-1][v] = name
        return name

    def emitted(self, v: K.Value) -> bool:
        """Whether ``v`` is computed already, in this scope or one around it."""
        return any(v in s for s in self.scopes)

    simd_reductions = True
    # a masked value of arithmetic alone (``_select_safe``) computed everywhere and selected,
    # not branched around: the loop around it stays straight-line code, which vectorizes
    select_masks = False
    fast_exp2 = True  # the C prelude's vectorizable lm_exp2f
    fast_log2 = True  # and lm_log2f

    def hoist(self, v: K.Value, inner: frozenset[str], ind: str, anywhere: bool = False) -> None:
        """Emit, at the current level, the parts of ``v`` that do not use the loop variables in
        ``inner``, so the loop about to open reads them instead of recomputing them
        (``anywhere``: see ``K.invariant_parts``)."""
        for part in K.invariant_parts(v, inner, self.fv_memo, anywhere):
            self.emit(part, ind)

    def block(self, body: Callable[[], None]) -> None:
        self.scopes.append({})
        body()
        self.scopes.pop()

    def _emit(self, v: K.Value, ind: str) -> str:
        if isinstance(v, K.Const):
            return _const(v.value, v.dtype)
        if isinstance(v, K.IndexVal):
            return f"(({ctype(v.dtype)})({cexpr(v.expr)}))"
        if isinstance(v, K.Load):
            x = load_expr(self.ptr_of(v.buf), cexpr(v.index), v.dtype)
            if v.valid == 1:
                return x
            return f"(({cexpr(v.valid)}) ? ({ctype(v.dtype)})({x}) : ({ctype(v.dtype)})0)"
        if isinstance(v, K.Cast):
            a = self.emit(v.src, ind)
            if v.dtype is dt.bool_:
                return f"(int32_t)({a} != 0)"
            if v.dtype in (dt.i4, dt.u4):
                return (
                    f"({ctype(v.dtype)})(((int64_t)({a})) & 15)"
                    if v.dtype is dt.u4
                    else f"(int8_t)((int8_t)(((int64_t)({a})) << 4) >> 4)"
                )
            if v.dtype in (dt.f16, dt.bf16) and v.src.dtype is not v.dtype:
                # computed in f32 registers: rounded to the 16-bit type as a store would
                n = v.dtype.name
                return f"lm_{n}_to_f32(lm_f32_to_{n}((float)({a})))"
            return f"({ctype(v.dtype)})({a})"
        if isinstance(v, K.Alu):
            return self._alu(v, ind)
        if isinstance(v, K.Masked):
            if self.select_masks and _select_safe(v.value, self.emitted):
                x = self.emit(v.value, ind)
                ok = f"(uint32_t)({cexpr(v.valid)})"
                if v.dtype is dt.f32:
                    return f"lm_bits_f32(lm_f32_bits({x}) & (0u - {ok}))"
                return f"({ok} ? {x} : ({ctype(v.dtype)})0)"
            out = self.tmp()
            self.lines.append(f"{ind}{ctype(v.dtype)} {out} = 0;")
            self.lines.append(f"{ind}if ({cexpr(v.valid)}) {{")

            def inner() -> None:
                x = self.emit(v.value, ind + "  ")
                self.lines.append(f"{ind}  {out} = {x};")

            self.block(inner)
            self.lines.append(f"{ind}}}")
            return out
        if isinstance(v, K.Reduce):
            if self.simd_reductions and _blocked_sum(v):
                return self._blocked_sum(v, ind)
            if self.simd_reductions and isinstance(v.extent, int) and 0 < v.extent <= 4:
                return self._unrolled(v, ind)
            if self.simd_reductions and v.op is Op.MAX_REDUCE and v.dtype is dt.f32:
                return self._max_f32(v, ind)
            # loop-invariant parts of the body (e.g. a row max inside a row sum) run once
            self.hoist(v.body, frozenset({v.var.name}), ind)
            acc = self.tmp()
            t = ctype(v.dtype)
            self.lines.append(f"{ind}{t} {acc} = {reduce_init(v.op, v.dtype)};")
            rv = _c_name(v.var)
            strip = self.prefetch is not None and self.prefetch.take(ind)
            bi = ind  # the loop's own indent: inside the strip loop when prefetching
            lo, hi = "0", cexpr(v.extent)
            if strip:
                assert self.prefetch is not None
                opened, lo, hi = self.prefetch.strip(rv, hi, ind, self.index_type)
                self.lines += opened
                bi = ind + "  "
            if v.op is Op.SUM_REDUCE and v.dtype is dt.f32 and self.simd_reductions:
                lo = self.vector_sum_loop(v, acc, lo, hi, bi) or lo
            head = len(self.lines)
            self.lines.append(f"{bi}for ({self.index_type} {rv} = {lo}; {rv} < {hi}; ++{rv}) {{")

            def body() -> None:
                x = self.emit(v.body, bi + "  ")
                if v in self.row_cache:
                    self.lines.append(f"{bi}  {self.row_cache[v]}[{rv}] = {x};")
                    self.cached.add(v)
                self.lines.append(f"{bi}  {acc} = {reduce_update(v.op, v.dtype, acc, x)};")

            self.block(body)
            self.lines.append(f"{bi}}}")
            if self.simd_reductions and v.op is Op.SUM_REDUCE and v.dtype.is_float:
                loop_body = self.lines[head + 1 : -1]
                if not any("{" in ln or "}" in ln for ln in loop_body):
                    # straight-line body: let the compiler reassociate this one sum
                    self.lines.insert(head, f"{bi}#pragma omp simd reduction(+:{acc})")
            if strip:
                self.lines.append(f"{ind}}}")
            return acc
        if isinstance(v, K.SoftmaxSum):
            return self._softmax_sum(v, ind)
        if isinstance(v, K.Gather):
            row = self.emit(v.row, ind)
            r = K.value_range(v.row, self.ranges)
            if r is not None and 0 <= r[0] and r[1] < min(sym.lower_bound(v.rows), 2**31):
                return self._gather_in_range(v, row, ind)
            if sym.lower_bound(v.rows) >= 1:
                return self._gather_clamped(v, row, ind)
            out = self.tmp()
            gv = _c_name(v.var)
            self.lines.append(f"{ind}{ctype(v.dtype)} {out} = 0;")
            self.lines.append(f"{ind}{{ const {self.index_type} {gv} = ({self.index_type})({row});")
            self.lines.append(f"{ind}if ({gv} >= 0 && {gv} < {cexpr(v.rows)}) {{")

            def gbody() -> None:
                x = self.emit(v.body, ind + "  ")
                self.lines.append(f"{ind}  {out} = {x};")

            self.block(gbody)
            self.lines.append(f"{ind}}} }}")
            return out
        raise TypeError(f"cannot render {v!r}")

    def _gather_in_range(self, v: K.Gather, row: str, ind: str) -> str:
        """A gather whose row provably lies in range (a byte-coded table lookup): no check and
        a 32-bit row. GCC loads the lanes one by one (it prefers that to Zen's slower gather
        instruction); the vector form of split sums looks tables up in registers instead."""
        at = self.tmp()
        self.lines.append(f"{ind}const int32_t g{at} = (int32_t)({row});")
        ub = max(sym.upper_bound(v.rows) - 1, 0)
        body = K.substitute(v.body, {v.var.name: sym.var(f"_g{at}", 0, ub, v.rows)})
        self.made.append(body)
        return self.emit(body, ind)

    def _gather_clamped(self, v: K.Gather, row: str, ind: str) -> str:
        """A gather without a branch: the body read at the row clamped into range (row 0
        exists), then zeroed where the row is out of range. A loop around it (a row's
        columns, a tile of gathered keys) stays straight-line code, which vectorizes."""
        ok, at = self.tmp(), self.tmp()
        it = self.index_type
        self.lines.append(f"{ind}const {it} {at}r = ({it})({row});")
        self.lines.append(f"{ind}const int {ok} = {at}r >= 0 && {at}r < {cexpr(v.rows)};")
        self.lines.append(f"{ind}const {it} g{at} = {ok} ? {at}r : 0;")
        ub = max(sym.upper_bound(v.rows) - 1, 0)
        body = K.substitute(v.body, {v.var.name: sym.var(f"_g{at}", 0, ub, v.rows)})
        self.made.append(body)
        x = self.emit(body, ind)
        if v.dtype is dt.f32:
            return f"lm_bits_f32(lm_f32_bits({x}) & (0u - (uint32_t){ok}))"
        return f"({ok} ? {x} : ({ctype(v.dtype)})0)"

    def exp2(self, x: str, d: dt.DType) -> str:
        if d is dt.f64:
            return f"exp2({x})"
        return f"lm_exp2f({x})" if self.fast_exp2 else f"exp2f({x})"

    def _softmax_sum(self, v: K.SoftmaxSum, ind: str) -> str:
        """One element of an online softmax-weighted sum: a running max ``m``, the running
        denominator ``l`` and numerator ``a``, both rescaled when the max grows."""
        t = ctype(v.dtype)
        m, l_, a = self.tmp(), self.tmp(), self.tmp()
        jv = _c_name(v.var)
        self.lines.append(f"{ind}{t} {m} = -INFINITY, {l_} = 0, {a} = 0;")
        self.lines.append(
            f"{ind}for ({self.index_type} {jv} = 0; {jv} < {cexpr(v.extent)}; ++{jv}) {{"
        )

        def body() -> None:
            i2 = ind + "  "
            sc = self.emit(v.score, i2)
            w = self.emit(v.weight, i2)
            self.lines.append(f"{i2}if ({sc} > {m}) {{ const {t} r = {self.exp2(f'{m} - {sc}', v.dtype)}; "
                              f"{l_} *= r; {a} *= r; {m} = {sc}; }}")  # fmt: skip
            # a score of -inf adds nothing (and m - m would be NaN while m is still -inf)
            self.lines.append(f"{i2}if ({sc} != -INFINITY) {{ const {t} p = {self.exp2(f'{sc} - {m}', v.dtype)}; "
                              f"{l_} += p; {a} += p * {w}; }}")  # fmt: skip

        self.block(body)
        self.lines.append(f"{ind}}}")
        out = self.tmp()
        self.lines.append(f"{ind}const {t} {out} = {a} / {l_};")
        return out

    def _unrolled(self, v: K.Reduce, ind: str) -> str:
        """A reduction over 2-4 values (relu's and clamp's max against a padded constant)
        written out: the padding masks fold away and the enclosing loop stays branch-free."""
        assert isinstance(v.extent, int)
        bodies = [K.substitute(v.body, {v.var.name: r}) for r in range(v.extent)]
        self.made += bodies
        a = abs_of(v, bodies)
        if a is not None:
            return f"fabsf({self.emit(a, ind)})"
        xs = [self.emit(b, ind) for b in bodies]
        consts = [_const_f32(b) for b in bodies]
        acc, acc_c = xs[0], consts[0]
        for x, x_c in zip(xs[1:], consts[1:], strict=True):
            out = self.tmp()
            if v.op is Op.MAX_REDUCE and v.dtype is dt.f32:
                # against a constant (relu, clamp) a compare and a blend suffice
                if _plain_const(x_c):
                    e = f"lm_maxcf({acc}, {x})"
                elif _plain_const(acc_c):
                    e = f"lm_maxcf({x}, {acc})"
                else:
                    e = f"lm_max2f({acc}, {x})"
                acc_c = None
            else:
                e = reduce_update(v.op, v.dtype, acc, x)
            self.lines.append(f"{ind}const {ctype(v.dtype)} {out} = {e};")
            acc = out
        return acc

    def _max_f32(self, v: K.Reduce, ind: str) -> str:
        """A float max as an integer max over order-preserving keys of the bits (negative
        floats' magnitude bits flipped) plus a NaN flag: an idiom the compiler vectorizes,
        where lm_maxf's NaN-propagating select stays a scalar branch (8x slower)."""
        self.hoist(v.body, frozenset({v.var.name}), ind)
        if self.prefetch is not None:
            self.prefetch.note(ind)
        key, nan, acc = self.tmp(), self.tmp(), self.tmp()
        rv = _c_name(v.var)
        # the key of -INFINITY: an empty max stays -inf
        self.lines.append(f"{ind}int32_t {key} = (int32_t)0x807fffff, {nan} = 0;")
        lo = self.vector_max_loop(v, key, nan, cexpr(v.extent), ind) or "0"
        head = len(self.lines)
        self.lines.append(
            f"{ind}for ({self.index_type} {rv} = {lo}; {rv} < {cexpr(v.extent)}; ++{rv}) {{"
        )

        def body() -> None:
            x = self.emit(v.body, ind + "  ")
            self.lines.append(f"{ind}  {{ const uint32_t b = lm_f32_bits({x}); "
                              f"const int32_t k = (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) >> 1)); "
                              f"{key} = k > {key} ? k : {key}; {nan} |= ({x} != {x}); }}")  # fmt: skip

        self.block(body)
        self.lines.append(f"{ind}}}")
        loop_body = self.lines[head + 1 : -2]
        if not any("{" in ln or "}" in ln for ln in loop_body):
            self.lines.insert(
                head, f"{ind}#pragma omp simd reduction(max:{key}) reduction(|:{nan})"
            )
        self.lines.append(f"{ind}const float {acc} = {nan} ? NAN : "
                          f"lm_bits_f32((uint32_t){key} ^ ((uint32_t)({key} >> 31) >> 1));")  # fmt: skip
        return acc

    def vector_sum_loop(self, v: K.Reduce, acc: str, lo: str, hi: str, ind: str) -> str | None:
        """A backend's explicit-vector part of a float sum's loop from ``lo`` to ``hi`` (adding
        into ``acc``, writing the row cache): the C variable where the scalar rest starts, or
        None (nothing emitted)."""
        return None

    def vector_max_loop(self, v: K.Reduce, key: str, nan: str, hi: str, ind: str) -> str | None:
        """A backend's explicit-vector part of a float max's loop up to ``hi``, folded into the
        order-preserving integer ``key`` and the NaN flag ``nan`` (``_max_f32``): the C
        variable where the scalar rest starts, or None (nothing emitted)."""
        return None

    def vector_sum(self, v: K.Reduce, ind: str) -> str | None:
        """A backend's explicit-vector form of a split float sum, or None (the scalar loop
        with a vector of partial sums below)."""
        return None

    def _blocked_sum(self, v: K.Reduce, ind: str) -> str:
        """A float sum over blocks of a short inner sum (a split reduction): one vector of
        partial sums across the whole outer loop, folded once at the end, instead of a
        horizontal sum per block."""
        if self.prefetch is not None:
            self.prefetch.note(ind)
        vec = self.vector_sum(v, ind)
        if vec is not None:
            return vec
        inner = v.body
        assert isinstance(inner, K.Reduce)
        t, g = ctype(v.dtype), inner.extent
        accv, acc = self.tmp(), self.tmp()
        ro, ri = _c_name(v.var), _c_name(inner.var)
        self.hoist(inner.body, frozenset({v.var.name, inner.var.name}), ind)
        self.lines.append(f"{ind}{t} {accv}[{g}] = {{0}};")
        self.lines.append(
            f"{ind}for ({self.index_type} {ro} = 0; {ro} < {cexpr(v.extent)}; ++{ro}) {{"
        )

        def outer() -> None:
            self.hoist(inner.body, frozenset({inner.var.name}), ind + "  ")
            self.lines.append(f"{ind}  #pragma omp simd")
            self.lines.append(f"{ind}  for ({self.index_type} {ri} = 0; {ri} < {g}; ++{ri}) {{")

            def body() -> None:
                x = self.emit(inner.body, ind + "    ")
                self.lines.append(f"{ind}    {accv}[{ri}] += {x};")

            self.block(body)
            self.lines.append(f"{ind}  }}")

        self.block(outer)
        self.lines.append(f"{ind}}}")
        # a plain fold: `omp simd` here would keep the partial sums in memory (3x slower)
        self.lines.append(f"{ind}{t} {acc} = 0;")
        self.lines.append(f"{ind}for (int j = 0; j < {g}; ++j) {acc} += {accv}[j];")
        return acc

    def _alu(self, v: K.Alu, ind: str) -> str:
        args = [self.emit(s, ind) for s in v.srcs]
        d, t = v.dtype, ctype(v.dtype)
        op = v.op
        if op is Op.EXP2:
            return self.exp2(args[0], d)
        if op is Op.LOG2 and d is dt.f32 and self.fast_log2:
            return f"lm_log2f({args[0]})"
        if op in _UNARY_F:
            return f"{_UNARY_F[op]}{'' if d is dt.f64 else 'f'}({args[0]})"
        if op is Op.RECIP:
            return f"({'1.0' if d is dt.f64 else '1.0f'} / {args[0]})"
        a, b = args
        if op is Op.LESS_THAN:
            return f"(int32_t)({a} < {b})"
        if d is dt.bool_:
            return f"(int32_t)({a} & {b})"
        if d.is_float:
            if op is Op.MOD:
                c = v.srcs[1]
                if isinstance(c, K.Const) and _pow2(c.value):
                    # x - c*trunc(x/c) is exact for a power-of-two c, inline and vectorizable
                    # (the nibble extraction of quantized weights); fmod is a libm call
                    f = "" if d is dt.f64 else "f"
                    return f"({a} - {b} * trunc{f}({a} * {_const(1.0 / float(c.value), d)}))"
                return f"fmod{'' if d is dt.f64 else 'f'}({a}, {b})"
            return f"({a} {'+' if op is Op.ADD else '*'} {b})"
        if op is Op.MOD:
            c = v.srcs[1]
            if isinstance(c, K.Const) and int(c.value) > 0 and d.bits <= 32:
                # 32-bit lanes and a constant divisor: a vectorizable `%` (the nibble split
                # of 4-bit weights); lm_imod's int64 arguments would widen every lane
                return f"({t})((int32_t){a} % {int(c.value)})"
            return f"({t})lm_imod({a}, {b})"
        sign = "+" if op is Op.ADD else "*"
        # wrap-around arithmetic in unsigned types (signed overflow is UB in C); 32-bit lanes
        # for types of 32 bits or fewer, so vector loops stay 16 lanes wide
        u = "uint32_t" if d.bits <= 32 else "uint64_t"
        if d.bits <= 32:
            return f"({t})({u})(({u})(int32_t){a} {sign} ({u})(int32_t){b})"
        return f"({t})(int64_t)(({u})(int64_t){a} {sign} ({u})(int64_t){b})"


def _const_f32(v: K.Value) -> float | None:
    """The value of an f32 tree of constants, sums and products (a padded clamp bound comes as
    ``0 + c``), evaluated as C would in f32; None for anything else."""
    if v.dtype is not dt.f32:
        return None
    if isinstance(v, K.Const):
        return float(np.float32(v.value))
    if isinstance(v, K.Alu) and v.op in COMMUTATIVE:
        a, b = (_const_f32(x) for x in v.srcs)
        if a is None or b is None:
            return None
        with np.errstate(all="ignore"):
            r = np.float32(a) + np.float32(b) if v.op is Op.ADD else np.float32(a) * np.float32(b)
        return float(r)
    return None


def _unpadded(v: K.Value) -> K.Value:
    """``v`` without an added constant +0 or -0 (a padded side of a concatenation), which
    changes no value a max compares but the sign of a zero."""
    if isinstance(v, K.Alu) and v.op is Op.ADD:
        for x, c in (v.srcs, v.srcs[::-1]):
            if isinstance(c, K.Const) and c.dtype.is_float and float(c.value) == 0:
                return x
    return v


def abs_of(v: K.Reduce, bodies: list[K.Value]) -> K.Value | None:
    """x when the f32 reduction ``v`` over ``bodies`` is max(x, -x) (``abs``: a 2-way max
    over x and its negation, each maybe padded by +0): fabs(x) gives the same value for
    every x, zeros and infinities included, and NaN for NaN, in one instruction where the
    NaN-propagating max takes three compares and a blend."""
    if v.op is not Op.MAX_REDUCE or v.dtype is not dt.f32 or len(bodies) != 2:
        return None
    a, b = (_unpadded(x) for x in bodies)
    for x, n in ((a, b), (b, a)):
        if isinstance(n, K.Alu) and n.op is Op.MUL:
            for y, c in (n.srcs, n.srcs[::-1]):
                if y == x and isinstance(c, K.Const) and float(c.value) == -1.0:
                    return x
    return None


def _plain_const(c: float | None) -> bool:
    """A constant lm_maxcf takes: not NaN and not -0 (its ties go to the constant)."""
    return c is not None and not math.isnan(c) and not (c == 0 and math.copysign(1.0, c) < 0)


def _blocked_sum(v: K.Reduce) -> bool:
    """A float sum whose body is a short straight-line float sum (schedule.py's split)."""
    b = v.body
    return (
        v.op is Op.SUM_REDUCE
        and v.dtype.is_float
        and isinstance(b, K.Reduce)
        and b.op is Op.SUM_REDUCE
        and b.dtype is v.dtype
        and isinstance(b.extent, int)
        and b.extent <= 64
        and not any(
            isinstance(x, (K.Reduce, K.Masked, K.SoftmaxSum))
            or (isinstance(x, K.Gather) and sym.lower_bound(x.rows) < 1)  # a branch
            for x in K.walk(b.body)
        )
    )


def reduce_init(op: Op, d: dt.DType) -> str:
    return "0" if op is Op.SUM_REDUCE else _max_init(d)


def reduce_update(op: Op, d: dt.DType, acc: str, x: str) -> str:
    """The C expression folding ``x`` into accumulator ``acc`` (max propagates NaN)."""
    if op is Op.SUM_REDUCE:
        return f"{acc} + {x}" if d.is_float else f"({ctype(d)})((int64_t){acc} + (int64_t){x})"
    if d.is_float:
        return f"{'lm_maxd' if d is dt.f64 else 'lm_maxf'}({acc}, {x})"
    return f"({x} > {acc} ? {x} : {acc})"


def _pow2(x: float | int | bool) -> bool:
    f = abs(float(x))
    return f > 0 and math.isfinite(f) and math.frexp(f)[0] == 0.5


def _max_init(d: dt.DType) -> str:
    if d.is_float:
        return "-INFINITY"
    return {dt.i32: "INT32_MIN", dt.i64: "INT64_MIN", dt.i8: "INT8_MIN", dt.i4: "-8"}.get(d, "0")


def _per_element_reduce(v: K.Value, inner: str) -> bool:
    """Whether computing one element runs a reduction loop (one that cannot be hoisted out of
    the innermost loop, as a row max can)."""

    def loop(x: K.Value) -> bool:  # reductions over 2-4 values are written out, no loop
        if isinstance(x, K.Reduce):
            return not (isinstance(x.extent, int) and x.extent <= 4)
        return isinstance(x, K.SoftmaxSum)

    if not any(loop(x) for x in K.walk(v)):
        return False
    hoisted = K.invariant_parts(v, frozenset({inner}), {})
    return not any(loop(x) for h in hoisted for x in K.walk(h))


def _emit_into(em: Emitter, v: K.Value, ind: str, fmt: str) -> list[str]:
    """Statements computing ``v`` at indent ``ind``, then ``fmt`` with the result filled in."""
    em.lines = []
    x = em.emit(v, ind)
    return [*em.lines, ind + fmt.format(x)]
