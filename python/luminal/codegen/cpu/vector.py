"""Explicit native-width vectors for the inner loop of a split sum (schedule.py's blocked
reductions: a GEMV over quantized weights, a long row sum).

GCC sizes a loop's vectors by its narrowest type: an inner loop of 16 that mixes bytes (packed
weights) with floats becomes 128-bit vectors, four per float value, with the widening done in
pieces, about 4x the instructions of one 512-bit vector per value. Written with the compiler's
vector extension (portable C for GCC and Clang; the prelude widens loads with AVX-512 or AVX2
where the target has them), every value of the loop body is one vector of the target's native
width (``LM_VL`` lanes) or one scalar.

``blocked_sum`` returns None when the body holds something this form does not cover (gathers,
masks, comparisons, transcendental ops, loads that are not unit-stride in the inner variable);
the caller then writes the scalar loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import COMMUTATIVE, Op
from ...graph.symbolic import sint
from ...graph.view import contiguous_strides

if TYPE_CHECKING:
    from ..cstyle import Emitter

# the inner sums this form takes are multiples of the widest native vector (16 floats, 512 bits),
# so the lane count of every target (LM_VL in the prelude: 16, 8 or 4) divides them
BLOCK_LANES = 16

# loads the prelude widens to 16 x i32 (integers) or 16 x f32 (floats)
_INT_LOADS = {dt.u8: "u8", dt.i8: "i8", dt.i32: "i32"}
_FLOAT_LOADS = {dt.f32: "f32", dt.f16: "f16", dt.bf16: "bf16"}


_VT = {"f": "lm_f32v", "i": "lm_i32v"}
_VEC_UNARY = {Op.EXP2: "lm_vexp2f", Op.SQRT: "lm_vsqrtf"}


class _Unsupported(Exception):
    pass


def _nonneg(v: K.Value) -> bool:
    """Whether an integer value is provably >= 0 (a byte read and masked, say): its `%` by a
    constant is then an unsigned one, one AND instead of a signed-remainder fix-up."""
    if isinstance(v, K.Const):
        return not v.dtype.is_float and int(v.value) >= 0
    if isinstance(v, K.Load):
        return v.dtype is dt.u8
    if isinstance(v, K.Cast):
        return not v.src.dtype.is_float and _nonneg(v.src)
    if isinstance(v, K.Alu) and v.op in (Op.ADD, Op.MUL, Op.MOD):
        # ADD/MUL of values < 2^31 may wrap in 32 bits; only byte and short sources are safe
        srcs = v.srcs if v.op is not Op.MOD else v.srcs[:1]
        return all(_nonneg(s) and _small(s) for s in srcs)
    return False


def _small(v: K.Value) -> bool:
    """Fits in 16 bits unsigned (so sums and products of two stay below 2^31)."""
    if isinstance(v, K.Const):
        return 0 <= int(v.value) < 1 << 15
    if isinstance(v, K.Load):
        return v.dtype is dt.u8
    if isinstance(v, K.Cast):
        return _small(v.src)
    if isinstance(v, K.Alu) and v.op is Op.MOD:
        return _small(v.srcs[0]) or (isinstance(v.srcs[1], K.Const) and _small(v.srcs[1]))
    return False


def mask_window(valid: sint, x: sym.Expr) -> tuple[list[str], list[str], sint] | None:
    """A padding mask as a window of the inner loop: ``valid`` (a product of comparisons) is
    ``lo_k <= x`` and ``x < hi_k`` for each listed bound (C expressions), times a rest free of
    ``x``. Then the loop runs the unmasked value over the window and stores zeros around it
    (a padded conv's copy: the per-element test kept it scalar). None when ``x`` appears
    otherwise."""
    from ..cstyle import cexpr

    los: list[str] = []
    his: list[str] = []
    rest: sint = 1
    for f in sym._factors(valid) if isinstance(valid, sym.Expr) else []:
        if x not in f.vars():
            rest = sym.mul(rest, f)
            continue
        if f.kind != sym.LT:
            return None
        a, b = f.args
        terms, const = sym._lin(sym.add(a, sym.mul(b, -1)))  # c*x + r < 0
        c = terms.pop(x, 0)
        if c == 0 or any(x in t.vars() for t in terms):
            return None
        r = sym._from_lin(terms, const)
        if c == 1:
            his.append(cexpr(sym.mul(r, -1)))
        elif c == -1:
            los.append(cexpr(sym.add(r, 1)))
        elif c > 0:  # x < ceil(-r / c)
            his.append(f"(lm_fdiv({cexpr(sym.add(sym.mul(r, -1), -1))}, {c}) + 1)")
        else:  # x > r / -c
            los.append(f"(lm_fdiv({cexpr(r)}, {-c}) + 1)")
    return los, his, rest


class _Vec:
    def __init__(
        self,
        em: Emitter,
        ri: sym.Expr,
        ind: str,
        over: dict[K.Value, str] | None = None,
        lanes: str | None = None,
        first: str = "0",
        guard: frozenset[str] = frozenset(),
    ) -> None:
        self.em, self.ri, self.ind = em, ri, ind
        # C expressions: only lanes first..lanes-1 exist (a row's last columns, a padding
        # mask's window), the loads of the others are not made
        self.lanes, self.first = lanes, first
        # variables of the enclosing masks: a load the same for every lane is made for all
        # lanes, so it may not depend on them (it would read where the mask guards)
        self.guard = guard
        self.lines: list[str] = []
        # values given as float vectors already (a row cache's entries read as one vector)
        self.memo: dict[K.Value, tuple[str, str]] = {v: (e, "f") for v, e in (over or {}).items()}

    def scalar(self, v: K.Value) -> str | None:
        if v in self.memo:
            return None
        for s in reversed(self.em.scopes):
            if v in s:
                return s[v]
        return None

    def val(self, v: K.Value) -> tuple[str, str]:
        """(C expression, kind): kind "s" a scalar, "f" 16 x f32, "i" 16 x i32."""
        s = self.scalar(v)
        if s is not None:
            return s, "s"
        if v in self.memo:
            return self.memo[v]
        e, kind = self._val(v)
        if kind != "s":
            name = self.em.tmp()
            self.lines.append(f"{self.ind}const {_VT[kind]} {name} = {e};")
            e = name
        self.memo[v] = (e, kind)
        return e, kind

    def _val(self, v: K.Value) -> tuple[str, str]:
        from ..cstyle import _const, cexpr, ctype, load_expr

        if isinstance(v, K.Const):
            if v.dtype not in (dt.f32, dt.i32):
                raise _Unsupported
            return _const(v.value, v.dtype), "s"
        if isinstance(v, K.Load):
            ptr = self.em.ptr_of(v.buf)
            if v.valid != 1 and not v.dtype.packed and v.dtype is dt.f32:
                return self._padded_load(v, ptr), "f"
            if v.valid != 1 or v.dtype.packed:
                raise _Unsupported
            if not isinstance(v.index, sym.Expr) or self.ri not in v.index.vars():
                if _names(v.index) & self.guard:
                    raise _Unsupported
                return load_expr(ptr, cexpr(v.index), v.dtype), "s"
            step = _step(v.index, self.ri)
            windowed = self.lanes is not None or self.first != "0"
            if v.dtype is dt.f32 and (step != 1 or windowed):
                at = f"&{ptr}[{cexpr(v.index)}]"
                return _lane_load(at, step, self.first, self.lanes or "LM_VL"), "f"
            if step != 1 or windowed:
                raise _Unsupported
            if v.dtype in _INT_LOADS:
                return f"lm_vload_{_INT_LOADS[v.dtype]}(&{ptr}[{cexpr(v.index)}])", "i"
            if v.dtype in _FLOAT_LOADS:
                return f"lm_vload_{_FLOAT_LOADS[v.dtype]}(&{ptr}[{cexpr(v.index)}])", "f"
            raise _Unsupported
        if isinstance(v, K.Cast):
            a, kind = self.val(v.src)
            if kind == "s":
                return f"({ctype(v.dtype)})({a})", "s"
            if v.dtype is dt.f32:
                return (a, "f") if kind == "f" else (f"__builtin_convertvector({a}, lm_f32v)", "f")
            if v.dtype in (dt.bf16, dt.f16):  # in f32 lanes, rounded as a store would be
                f = a if kind == "f" else f"__builtin_convertvector({a}, lm_f32v)"
                return f"lm_vround_{v.dtype.name}({f})", "f"
            if v.dtype is dt.i32:
                # a vector of narrower integers already holds their values as i32
                if kind == "i":
                    return a, "i"
                return f"__builtin_convertvector({a}, lm_i32v)", "i"  # truncates, as C does
            raise _Unsupported
        if isinstance(v, K.Alu):
            return self._alu(v)
        if isinstance(v, K.Reduce):
            if isinstance(v.extent, int) and v.extent <= 4:
                return self._unrolled(v)
            return self._lane_sum(v)
        if isinstance(v, K.Gather):
            return self._lookup(v)
        if isinstance(v, K.Masked):
            return self._masked(v)
        raise _Unsupported

    def _window(self, valid: sint) -> tuple[str, str]:
        """The lanes (C expressions ``lo``, ``hi``) where a padding mask (a product of
        comparisons) holds: its comparisons of the lanes' variable ``x`` (``c*x + r < 0``)
        bound them, the rest is one test for all lanes (a padded conv's taps: the row in
        range, the columns a window of lanes)."""
        from ..cstyle import _c_name, cexpr

        x = self.ri
        if not isinstance(valid, sym.Expr):
            raise _Unsupported
        window = mask_window(valid, x)
        if window is None:
            raise _Unsupported
        los, his, rest = window
        at = _c_name(x)  # the first lane's index: lane = x - at
        lo, hi = self.first, self.lanes or "LM_VL"
        for e in los:
            lo = f"lm_max({lo}, {e} - {at})"
        for e in his:
            hi = f"lm_min({hi}, {e} - {at})"
        if rest != 1:
            hi = f"(({cexpr(rest)}) ? {hi} : 0)"
        return lo, hi

    def _padded_load(self, v: K.Load, ptr: str) -> str:
        """An f32 load zero outside a padding mask, its lanes bounded by the mask's window."""
        from ..cstyle import cexpr

        x = self.ri
        if not isinstance(v.index, sym.Expr) or x not in v.index.vars():
            raise _Unsupported  # the same for every lane: the scalar form broadcasts it
        lo, hi = self._window(v.valid)
        return _lane_load(f"&{ptr}[{cexpr(v.index)}]", _step(v.index, x), lo, hi)

    def _masked(self, v: K.Masked) -> tuple[str, str]:
        """A value zero outside a padding mask (a padded max pool's taps, its mask of
        ones): computed over the mask's window of lanes, whose loads read only those lanes,
        then zero in the others."""
        from ..cstyle import cexpr

        if v.dtype is not dt.f32:
            raise _Unsupported
        lo, hi = self._window(v.valid)
        inner = _Vec(self.em, self.ri, self.ind, lanes=hi, first=lo,
                     guard=self.guard | _names(v.valid))  # fmt: skip
        inner.memo = dict(self.memo)
        x, kind = inner.val(v.value)
        self.lines += inner.lines
        if kind == "s" and self.ri.name not in _names(v.valid):
            return f"(({cexpr(v.valid)}) ? ({x}) : 0.0f)", "s"
        return f"lm_vwindow_f32({inner._vector((x, kind), 'f')}, {lo}, {hi})", "f"

    def _lookup(self, v: K.Gather) -> tuple[str, str]:
        """A gather from a table of up to 256 floats (a small-float or 4-bit level code's
        value) whose row provably lies in range: a lookup in registers per vector."""
        from ..cstyle import cexpr

        body, rows = v.body, v.rows
        r = K.value_range(v.row, self.em.ranges)
        if not (isinstance(rows, int) and rows % 16 == 0 and rows <= 256):
            raise _Unsupported
        if r is None or r[0] < 0 or r[1] >= rows:
            raise _Unsupported
        if not (isinstance(body, K.Load) and body.dtype is dt.f32 and body.valid == 1):
            raise _Unsupported
        off = sym.add(body.index, sym.mul(v.var, -1))  # where the table starts
        if isinstance(off, sym.Expr) and {v.var.name, self.ri.name} & {x.name for x in off.vars()}:
            raise _Unsupported
        row = v.row
        while isinstance(row, K.Cast) and row.dtype.is_int and row.src.dtype.is_int:
            row = row.src  # a widening to the index type: the value fits 32 bits
        idx, kind = self.val(row)
        if kind == "f":
            idx, kind = f"__builtin_convertvector({idx}, lm_i32v)", "i"  # C's truncation
        if kind != "i":
            raise _Unsupported
        return f"lm_vlut_f32(&{self.em.ptr_of(body.buf)}[{cexpr(off)}], {rows}, {idx})", "f"

    def _vector(self, x: tuple[str, str], kind: str) -> str:
        """``x`` as a vector of ``kind`` (a scalar broadcast)."""
        e, k = x
        if k == kind:
            return e
        if k == "s":
            return f"lm_vsplat{'f' if kind == 'f' else 'i'}({e})"
        raise _Unsupported

    def _lane_sum(self, v: K.Reduce) -> tuple[str, str]:
        """A float sum whose body varies along the lanes' variable (a column sum: the summed
        axis strided, the lanes' axis unit-stride, ``lane_sums``): a loop over the summed
        variable adding one vector per step, each lane's terms in the scalar loop's order."""
        from ..cstyle import _c_name, cexpr

        if v.op is not Op.SUM_REDUCE or v.dtype is not dt.f32:
            raise _Unsupported
        inner = _Vec(self.em, self.ri, self.ind + "  ", lanes=self.lanes, first=self.first,
                     guard=self.guard)  # fmt: skip
        inner.memo = dict(self.memo)
        x = inner._vector(inner.val(v.body), "f")
        acc, rv = self.em.tmp(), _c_name(v.var)
        self.lines += [
            f"{self.ind}lm_f32v {acc} = {{0}};",
            f"{self.ind}for ({self.em.index_type} {rv} = 0; {rv} < {cexpr(v.extent)}; ++{rv}) {{",
            *inner.lines,
            f"{self.ind}  {acc} += {x};",
            f"{self.ind}}}",
        ]
        return acc, "f"

    def _unrolled(self, v: K.Reduce) -> tuple[str, str]:
        """A float sum or max of 2-4 values (abs as max(x, -x), relu's max against a padded
        zero), written out as the scalar emitter's ``_unrolled`` does."""
        if not (isinstance(v.extent, int) and 0 < v.extent <= 4 and v.dtype is dt.f32):
            raise _Unsupported
        if v.op not in (Op.SUM_REDUCE, Op.MAX_REDUCE):
            raise _Unsupported
        bodies = [K.substitute(v.body, {v.var.name: r}) for r in range(v.extent)]
        self.em.made += bodies
        from ..cstyle import abs_of

        a = abs_of(v, bodies)
        if a is not None:  # |x|: the sign bit cleared, as the scalar rest's fabsf
            ax, kind = self.val(a)
            if kind != "f":
                raise _Unsupported
            return f"(lm_f32v)((lm_i32v)({ax}) & lm_vsplati(0x7fffffff))", "f"
        xs = [self.val(b) for b in bodies]
        if all(k == "s" for _, k in xs):
            raise _Unsupported
        acc = self._vector(xs[0], "f")
        for x in xs[1:]:
            b = self._vector(x, "f")
            acc = f"lm_vmax2f({acc}, {b})" if v.op is Op.MAX_REDUCE else f"({acc} + {b})"
        return acc, "f"

    def _alu(self, v: K.Alu) -> tuple[str, str]:
        d = v.dtype
        if v.op is Op.LESS_THAN and v.srcs[0].dtype in (dt.f32, dt.i32):
            # 1 or 0 per lane (a vector compare gives -1 or 0), as the scalar bool
            cmp = [self.val(s) for s in v.srcs]
            if all(k == "s" for _, k in cmp):
                raise _Unsupported
            k = "f" if v.srcs[0].dtype is dt.f32 else "i"
            return f"(-({self._vector(cmp[0], k)} < {self._vector(cmp[1], k)}))", "i"
        if d not in (dt.f32, dt.i32):
            raise _Unsupported
        args = [self.val(s) for s in v.srcs]
        if all(k == "s" for _, k in args):
            if d is dt.f32 and v.op in (Op.ADD, Op.MUL):  # one scalar for all lanes (a mask's)
                name = self.em.tmp()
                op = "+" if v.op is Op.ADD else "*"
                self.lines.append(f"{self.ind}const float {name} = {args[0][0]} {op} {args[1][0]};")
                return name, "s"
            raise _Unsupported  # not hoisted yet independent of the lanes: leave it scalar
        kind = "f" if d is dt.f32 else "i"
        if v.op is Op.RECIP and d is dt.f32:
            return f"(1.0f / {args[0][0]})", kind
        if v.op in _VEC_UNARY and d is dt.f32:
            return f"{_VEC_UNARY[v.op]}({args[0][0]})", kind
        if len(args) != 2:
            raise _Unsupported
        (a, ka), (b, kb) = args
        if d is dt.f32:
            if v.op is Op.ADD:
                return f"({a} + {b})", kind
            if v.op is Op.MUL:
                return f"({a} * {b})", kind
            raise _Unsupported
        if v.op is Op.MOD:
            c = v.srcs[1]
            if not (isinstance(c, K.Const) and int(c.value) > 0 and ka == "i"):
                raise _Unsupported
            if _nonneg(v.srcs[0]):
                return f"(lm_i32v)((lm_u32v)({a}) % {int(c.value)}u)", kind
            return f"({a} % {int(c.value)})", kind
        if v.op not in COMMUTATIVE:
            raise _Unsupported
        # wrap-around arithmetic, as the scalar code does it (signed overflow is undefined)
        ua = f"(lm_u32v)({a})" if ka == "i" else f"(uint32_t)({a})"
        ub = f"(lm_u32v)({b})" if kb == "i" else f"(uint32_t)({b})"
        return f"(lm_i32v)({ua} {'+' if v.op is Op.ADD else '*'} {ub})", kind


def vector_loop(
    em: Emitter,
    value: K.Value,
    var: sym.Expr,
    lo: str,
    hi: str,
    ind: str,
    step: Callable[[str, str], list[str]],
    over: dict[K.Value, str] | None = None,
    always: bool = False,
    advance: bool = False,
    prefetch: bool = False,
    tail: Callable[[str, str], list[str]] | None = None,
) -> tuple[list[str], str] | None:
    """The vector part of a loop over ``var`` from ``lo`` to ``hi`` that computes ``value``
    per index: steps of ``LM_VL`` indices, each running ``step(vector, step variable)``
    (its store or sum),
    and the C variable holding where the scalar loop for the rest starts. Only for values
    holding an op whose vector form beats GCC's vectorization of the scalar one (``exp2``:
    ``lm_vexp2f``); None (nothing emitted) otherwise, or when the value is not covered
    (``over``: values readable as vectors already; ``always``: whatever the ops;
    ``advance``: ``step``'s statements move the step variable on, not the loop header;
    ``prefetch``: each step prefetches ``STREAM_PREFETCH`` elements ahead in the inputs that
    stream, see ``_streamed``; ``tail``: the indices after the last whole vector are one
    vector of fewer lanes, their loads limited to them, stored by ``tail(vector, lanes)``,
    where the value's loads allow it, and the scalar loop gets none)."""
    if sym.upper_bound(var) + 1 < BLOCK_LANES and tail is None:
        return None  # never a whole vector at the widest target: the scalar loop alone
    if not always and not any(isinstance(x, K.Alu) and x.op in _VEC_UNARY for x in K.walk(value)):
        return None
    from ..cstyle import _c_name

    restore = em.checkpoint()
    at, iv = em.tmp(), _c_name(var)
    vec = _Vec(em, var, ind + "  ", over)
    try:
        x, kind = vec.val(value)
    except _Unsupported:
        kind = ""
    if kind != "f":
        restore()
        return None
    ahead = []
    if prefetch:
        from ..cstyle import cexpr

        ahead = [
            f"{ind}  __builtin_prefetch(&{em.ptr_of(x.buf)}[{cexpr(x.index)} + {STREAM_PREFETCH}]);"
            for x in _streamed(value, var)
        ]
    lines = [
        f"{ind}int64_t {at} = {lo};",
        f"{ind}for (; {at} + LM_VL <= {hi};{'' if advance else f' {at} += LM_VL'}) {{",
        f"{ind}  const int64_t {iv} = {at};",
        *ahead,
        *vec.lines,
        *step(x, at),
        f"{ind}}}",
    ]
    if tail is not None and not over:
        done = em.checkpoint()
        n = em.tmp()
        rest = _Vec(em, var, ind + "  ", lanes=n)
        try:
            y, kind = rest.val(value)
        except _Unsupported:
            kind = ""
        if kind == "f":
            lines += [
                f"{ind}if ({at} < {hi}) {{",
                f"{ind}  const int64_t {iv} = {at}, {n} = {hi} - {at};",
                *rest.lines,
                *tail(y, n),
                f"{ind}  {at} = {hi};",
                f"{ind}}}",
            ]
        else:
            done()
    return lines, at


# Elements ahead that a streaming elementwise loop prefetches its inputs: the hardware's own
# prefetch left a GELU chain's exp2 and division waiting on memory (4096 x 4096, 2 threads:
# 7.2 ms without; 256 ahead 5.1, 512 5.0, 1024 5.2, 2048 5.0, 4096 5.3 ms).
STREAM_PREFETCH = 512


def lane_sums(value: K.Value, var: sym.Expr) -> bool:
    """Whether ``value`` holds a float sum or max (more than a few terms) that a vector along
    the output variable ``var`` computes with plain loads where one along its own variable
    would gather: every load varying with the reduced variable is unit-stride in ``var`` or
    does not depend on it, and one that depends on ``var`` is not unit-stride in the reduced
    variable (a column sum, a mean over an outer axis, a channel norm of an NCHW tensor) or the
    reduction is shorter than a vector (a conv's or a pool's taps along a row: lanes of the
    reduced axis would be mostly idle). Stride 2 in ``var`` counts as plain (a stride-2 conv:
    two loads and a permute)."""
    for r in K.walk(value):
        if not (
            isinstance(r, K.Reduce) and r.op in (Op.SUM_REDUCE, Op.MAX_REDUCE) and r.dtype is dt.f32
        ):
            continue
        nested = any(isinstance(y, K.Reduce) for y in K.walk(r.body))
        if isinstance(r.extent, int) and r.extent <= 4 and not nested:
            continue  # a few terms, written out (a 3x3 conv's taps count as 9)
        loads = [x for x in K.walk(r.body) if isinstance(x, K.Load)]
        varying = [x for x in loads if isinstance(x.index, sym.Expr) and r.var in x.index.vars()]
        lanes = [x for x in varying if isinstance(x.index, sym.Expr) and var in x.index.vars()]
        short = isinstance(r.extent, int) and r.extent < BLOCK_LANES
        steps = [_step(x.index, var) for x in lanes]
        if (
            lanes
            and all(st in (1, 2) or (short and _gathered(st)) for st in steps)
            and (short or any(_step(x.index, r.var) != 1 for x in lanes))
        ):
            return True
    return False


# the largest stride lanes are gathered at: its lane offsets fit 32-bit gather indices with
# room to spare (a channels-last conv reads its taps at the channel count)
MAX_GATHER_STRIDE = 1 << 20


def _gathered(step: sint) -> bool:
    """Whether lanes ``step`` elements apart are read by one gather (a constant stride
    other than 0, 1 and 2, which have loads of their own)."""
    return isinstance(step, int) and 2 < step <= MAX_GATHER_STRIDE


def _lane_load(at: str, step: sint, lo: str, hi: str) -> str:
    """C: f32 lanes ``lo``..``hi``-1 read ``step`` elements apart from ``at``, zeros in the
    others: unit stride (a padded window's edge, a row's last columns), stride 2 (a strided
    conv's taps: two loads and a permute), or a gather (a channels-last conv's taps)."""
    if step == 1:
        return f"lm_vload_f32_lanes({at}, {lo}, {hi})"
    if step == 2:
        return f"lm_vload_f32_s2_lanes({at}, {lo}, {hi})"
    if _gathered(step):
        return f"lm_vload_f32_strided_lanes({at}, {step}, {lo}, {hi})"
    raise _Unsupported


def _names(e: sint) -> frozenset[str]:
    return frozenset(x.name for x in e.vars()) if isinstance(e, sym.Expr) else frozenset()


def _step(index: sint, var: sym.Expr) -> sint:
    """How far ``index`` moves when ``var`` grows by one."""
    return sym.add(sym.substitute(index, {var.name: sym.add(var, 1)}), sym.mul(index, -1))


def _streamed(value: K.Value, var: sym.Expr) -> list[K.Load]:
    """Loads of ``value`` read once per element: unit-stride in the loop variable ``var`` and
    moving with another index too (a row's vector of scales, read again every row, stays in
    cache and is left alone)."""
    out: dict[tuple[int, sint], K.Load] = {}
    for x in K.walk(value):
        if not (isinstance(x, K.Load) and isinstance(x.index, sym.Expr) and x.valid == 1):
            continue
        names = {v.name for v in x.index.vars() if v.extent is not None}
        if var.name not in names or len(names) < 2 or x.dtype.packed:
            continue
        if any(not n.startswith("_i") for n in names):
            continue  # read inside a reduction or a gather: its variable is not in scope
        if _step(x.index, var) == 1:
            out.setdefault((x.buf, x.index), x)
    return list(out.values())


def _unroll(extent: object) -> int:
    """Outer steps per loop trip: each its own accumulators, so consecutive FMAs into one
    accumulator (4 cycles apart) do not bound a loop whose body is a few instructions."""
    if not isinstance(extent, int):
        return 1
    return next(u for u in (4, 2, 1) if extent % u == 0)


def _terms(body: K.Value, limit: int = 4) -> list[K.Value]:
    """The addends of a float sum body (a pair-jammed block adds its halves), each given its
    own accumulator: ``acc += x * y`` contracts to one FMA, where ``acc += a + b`` costs a
    multiply, an add and an FMA. The split sum reorders the additions anyway."""
    terms = [body]
    while len(terms) < limit:
        i = next(
            (j for j, t in enumerate(terms)
             if isinstance(t, K.Alu) and t.op is Op.ADD and t.dtype is dt.f32),
            None,
        )  # fmt: skip
        if i is None:
            break
        t = terms.pop(i)
        assert isinstance(t, K.Alu)
        terms[i:i] = list(t.srcs)
    return terms


def blocked_sum(em: Emitter, v: K.Reduce, ind: str) -> str | None:
    """``v`` (a float sum over blocks of an inner sum of ``BLOCK_LANES``-multiple length) with
    the inner body as vector code, or None (nothing emitted) when the body is not covered. The
    lane count is the C compiler's (``LM_VL``), so the accumulator count is a C constant. Each
    addend has accumulators of its own and the outer loop is unrolled, so consecutive FMAs do
    not wait on one another. (A jammed block's copies: ``jam.py``'s ``_split_sums``.)"""
    inner = v.body
    assert isinstance(inner, K.Reduce)
    g = inner.extent
    if v.dtype is not dt.f32 or not isinstance(g, int) or g % BLOCK_LANES or g > 4 * BLOCK_LANES:
        return None
    from ..cstyle import _c_name, cexpr

    body0 = inner.body
    restore = em.checkpoint()
    accv, acc = em.tmp(), em.tmp()
    ro, ri = _c_name(v.var), _c_name(inner.var)
    unroll = _unroll(v.extent)
    n_terms = len(_terms(body0))
    chunks, sets = f"({g} / LM_VL)", unroll * n_terms
    em.hoist(body0, frozenset({v.var.name, inner.var.name}), ind)
    em.lines.append(f"{ind}lm_f32v {accv}[{sets} * {chunks}] = {{{{0}}}};")
    em.lines.append(
        f"{ind}for ({em.index_type} {ro} = 0; {ro} < {cexpr(v.extent)}; {ro} += {unroll}) {{"
    )
    ok = True

    def step(u: int) -> None:
        nonlocal ok
        body = body0 if u == 0 else K.substitute(body0, {v.var.name: sym.add(v.var, u)})
        em.made.append(body)
        em.hoist(body, frozenset({inner.var.name}), ind + "  ")
        i2 = ind + "    "
        # the lane variable holds the first index of the current LM_VL: every load's index is
        # unit-stride in it, so the scalar index expression addresses lane 0
        em.lines.append(f"{ind}  for ({em.index_type} {ri} = 0; {ri} < {g}; {ri} += LM_VL) {{")
        vec = _Vec(em, inner.var, i2)
        try:
            xs = [vec.val(t) for t in _terms(body)]
            if any(kind != "f" for _, kind in xs):
                # a scalar addend (a bias, say): the whole body into one accumulator
                xs = [vec.val(body)]
        except _Unsupported:
            ok = False
            return
        if any(kind != "f" for _, kind in xs):
            ok = False
            return
        em.lines += vec.lines
        for t, (x, _) in enumerate(xs):
            em.lines.append(f"{i2}{accv}[{u * n_terms + t} * {chunks} + {ri} / LM_VL] += {x};")
        em.lines.append(f"{ind}  }}")

    for u in range(unroll):
        if ok:
            em.block(lambda: step(u))  # noqa: B023 (called at once)
    if not ok:
        restore()
        return None
    em.lines.append(f"{ind}}}")
    tot, k = em.tmp(), em.tmp()
    em.lines.append(f"{ind}lm_f32v {tot} = {accv}[0];")
    em.lines.append(f"{ind}for (int {k} = 1; {k} < {sets} * {chunks}; ++{k}) {tot} += {accv}[{k}];")
    em.lines.append(f"{ind}const float {acc} = lm_vsum_f32({tot});")
    return acc


# -- helpers of the register blocks (jam.py, panel.py) ----------------------------------------

# Independent accumulator chains that keep the FMA units busy (2 units x 4 cycles of latency
# on the AVX2 machines measured): a block of fewer copies splits each copy's addends.
ACC_CHAINS = 8


def _shared_loads(bodies: list[K.Value]) -> set[K.Load]:
    """Loads that two or more of ``bodies`` read (a block's rows' or columns' operands)."""
    users: dict[K.Load, int] = {}
    for body in bodies:
        for x in {x for x in K.walk(body) if isinstance(x, K.Load)}:
            users[x] = users.get(x, 0) + 1
    return {x for x, n in users.items() if n > 1}


_Key = TypeVar("_Key")


def _accumulate(
    em: Emitter,
    vec: _Vec,
    cells: Sequence[tuple[_Key, list[K.Value]]],
    acc: Callable[[_Key, int], str],
    shared: set[K.Load],
    ind: str,
) -> None:
    """``acc(key, t) += term t`` for each cell's terms, term by term across the cells (their
    chains interleave); raises ``_Unsupported`` where a term is not a float vector."""
    done = 0
    for t in range(max((len(ts) for _, ts in cells), default=0)):
        for key, ts in cells:
            if t >= len(ts):
                continue
            x, kind = vec.val(ts[t])
            if kind != "f":
                raise _Unsupported
            em.lines.extend(_keep(vec.lines[done:], vec, shared))
            done = len(vec.lines)
            em.lines.append(f"{ind}{acc(key, t)} += {x};")


def _keep(lines: list[str], vec: _Vec, shared: set[K.Load]) -> list[str]:
    """``lines`` of ``vec``, the float vectors loaded for ``shared`` loads held in registers
    (``LM_KEEP``)."""
    names = {vec.memo[x][0] for x in shared if x in vec.memo}
    out = []
    for line in lines:
        head, _, _ = line.partition(" = ")
        name = head.rsplit(" ", 1)[-1]
        if name in names and head.lstrip().startswith("const lm_f32v "):
            out.append(line.replace("const lm_f32v ", "lm_f32v ", 1))
            out.append(f"{head[: len(head) - len(head.lstrip())]}LM_KEEP({name});")
        else:
            out.append(line)
    return out


def _flat(shape: tuple[sint, ...], at: dict[int, sym.Expr]) -> sint:
    """The output's flat index with ``at[d]`` as dim ``d``'s index."""
    out: sint = 0
    for j, (s, st) in enumerate(zip(shape, contiguous_strides(shape), strict=True)):
        out = sym.add(out, sym.mul(at.get(j, sym.index_var(j, s)), st))
    return out


def _digits(size: int) -> list[int]:
    """The block sizes a rest of fewer than ``size`` indices runs in, largest first."""
    p = 1
    while p * 2 < size:
        p *= 2
    out = []
    while p >= 1:
        out.append(p)
        p //= 2
    return out
