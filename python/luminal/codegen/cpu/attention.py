"""C for attention's online softmax (``K.SoftmaxSum``): one pass over the keys per query row
serves every output column of that row.

Two forms. The blocked form, when the IR shows the score's heart is a dot product of a
query-side and a key-side operand (``sum_r q[r] * k[j, r]``), works like a small GEMM: a task
is a block of query rows, held along vector lanes (the query operand transposed once per
task); each tile of keys is read as stored (in place, or copied once), the block's dot
products are register-blocked vector FMAs of row lanes by broadcast key elements, the rest
of the score (scale, mask, whatever the IR holds) is evaluated from them as vectors across
rows, so are the running max, rescale and sums, and P.V keeps several rows by four vectors
of value columns in registers over the whole tile. The row form serves every other score,
and blocks too short to amortize the copies: per row, scores of a tile of keys, then exp,
then the weighted columns as a vector.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import COMMUTATIVE, Op
from ...graph.symbolic import sint
from ...graph.symbolic_text import LT
from ...graph.view import contiguous_strides
from ..cstyle import Emitter, _c_name, _emit_into, cexpr, ctype, store_stmt

_SM_TILE = (
    32  # keys per tile of the row form: scores of a tile are computed, then exp'd, as vectors
)
_QB = 64  # query rows per task of the blocked form
# Sequences whose keys fill less than 1/_SHORT_KEYS of a key tile take the per-row form: the
# blocked form pays for a whole zero-padded tile and its setup. Set by timing both forms on
# 384 heads of dim 32 (2 threads, one sitting): 8 keys 3.2x and 17 keys 1.6x faster per row,
# 24 keys 0.9x, 32 keys 0.7x (the per-row cost grows with the keys, the tile's does not).
_SHORT_KEYS = 3
_RB = 5  # rows per register block of P.V (x 4 vectors of columns); fewer rows: the row form
_KT = 64  # keys per tile of the blocked form: a query block's, so causal tiles align
_KG = 6  # keys per register block of the blocked form's dot products (x 4 vectors of rows)
# _KT, _KG, _RB: set by timing the bench's attention (4 heads, d 64, seq 1024, one thread,
# AVX-512, round-robin medians of wall time): tile 32 / group 4 / rows 4 67 GFLOP/s; 48 / 6 / 4
# 77; 48 / 6 / 5 86; 48 / 6 / 6 83 (24 / 6, 64 / 4, 32 / 8, 28 / 7 between; the old layout
# 64); then in thread CPU time, tiles of 48 and 64 keys alike (79 GFLOP/s), 64 kept.
_MAX_DOT = 256  # longest dot product (head dim) the blocked form copies to the stack

# Vector helpers of the blocked form (LM_SM_T, four vectors of keys, is the short-keys
# threshold's unit). GCC's vector types keep the register blocks' accumulators in registers
# (plain loops over arrays stay in memory).
_SM_PRELUDE = r"""
#ifndef LM_SM_PRELUDE
#define LM_SM_PRELUDE
#if defined(__AVX512F__)
#define LM_VL 16
#elif defined(__AVX__)
#define LM_VL 8
#else
#define LM_VL 4
#endif
#define LM_SM_T (4 * LM_VL)
#define LM_FLT_MAX 3.40282347e+38f
typedef float lm_vf __attribute__((vector_size(LM_VL * 4)));
typedef int32_t lm_vi __attribute__((vector_size(LM_VL * 4)));
static inline lm_vf lm_vld(const float *p) { lm_vf v; memcpy(&v, p, sizeof v); return v; }
static inline void lm_vst(float *p, lm_vf v) { memcpy(p, &v, sizeof v); }
/* lanes of a where m is set, else of b; the lanewise max b > a ? b : a (a NaN b passed over) */
static inline lm_vf lm_sm_vsel(lm_vi m, lm_vf a, lm_vf b) {
  return (lm_vf)(((lm_vi)a & m) | ((lm_vi)b & ~m));
}
#if defined(__AVX512F__)
#include <immintrin.h>
/* vmaxps(b, a) is b > a ? b : a, in one instruction of 2 cycles' latency where the select
   takes three (the tile max is a chain of them) */
static inline lm_vf lm_sm_vmax(lm_vf a, lm_vf b) { return (lm_vf)_mm512_max_ps((__m512)b, (__m512)a); }
#else
static inline lm_vf lm_sm_vmax(lm_vf a, lm_vf b) { return lm_sm_vsel(b > a, b, a); }
#endif
#endif
"""


def _softmax_rows(k: K.Kernel) -> bool:
    """Whether the kernel is a row of softmax-weighted sums (attention: out[..., i, v]) whose
    score does not depend on the row's last index: then one pass over the keys serves the
    whole row, each score computed once instead of once per output column."""
    v, n = k.value, len(k.shape)
    if k.scatter_row is not None or not isinstance(v, K.SoftmaxSum) or n == 0:
        return False
    last = k.shape[-1]
    return (
        isinstance(last, int)
        and 0 < last <= 512
        and f"_i{n - 1}" not in K.free_vars(v.score, {})
        and v.dtype in (dt.f32, dt.f64)
    )


@dataclass
class _ScoreDot:
    """The score's dot product ``red = sum_r q * k``: ``q`` does not depend on the key,
    ``k`` not on the query row (the second-to-last output index)."""

    red: K.Reduce
    q: K.Value
    k: K.Value


def _score_dot(k: K.Kernel) -> _ScoreDot | None:
    """The dot product the blocked form computes as a micro-GEMM, when the IR has one: f32,
    the score holds exactly one sum-reduce and it is a product of a query-side and a key-side
    operand, and the weights (values) do not depend on the query row, so one copied tile of
    keys and values serves a whole block of rows."""
    v, n = k.value, len(k.shape)
    if not isinstance(v, K.SoftmaxSum) or v.dtype is not dt.f32 or n < 2:
        return None
    row, key = f"_i{n - 2}", v.var.name
    memo: dict[int, frozenset[str]] = {}
    if row in K.free_vars(v.weight, memo):
        return None
    reds = {x for x in K.walk(v.score) if isinstance(x, (K.Reduce, K.SoftmaxSum))}
    if len(reds) != 1:
        return None
    (red,) = reds
    # gathered operands (the rows of a packed batch) are read inside the dot product only
    inside = set(K.walk(red))
    if any(isinstance(x, K.Gather) and x not in inside for x in K.walk(v.score)):
        return None
    if not (
        isinstance(red, K.Reduce)
        and red.op is Op.SUM_REDUCE
        and red.dtype is dt.f32
        and isinstance(red.extent, int)
        and 0 < red.extent <= _MAX_DOT
        and isinstance(red.body, K.Alu)
        and red.body.op is Op.MUL
    ):
        return None
    a, b = red.body.srcs
    for q, kk in ((a, b), (b, a)):
        if key not in K.free_vars(q, memo) and row not in K.free_vars(kk, memo):
            return _ScoreDot(red, q, kk)
    return None


def _monotone_in(v: K.Value, red: K.Reduce) -> bool:
    """Whether ``v`` reaches ``red`` once, through additions and multiplications by values that
    do not hold it: then, for fixed indices, ``v`` is monotone in ``red``'s value (IEEE
    rounding keeps monotonicity), and its extremes over every finite dot product are at
    -FLT_MAX and FLT_MAX."""
    if v is red:
        return True
    if not isinstance(v, K.Alu) or v.op not in COMMUTATIVE or len(v.srcs) != 2:
        return False
    has = [any(x is red for x in K.walk(s)) for s in v.srcs]
    if has[0] == has[1]:
        return False
    return _monotone_in(v.srcs[0] if has[0] else v.srcs[1], red)


def _decode_task(lines: list[str], ext: list[str], dims: int, rem: str) -> None:
    """Index variables i0..i{dims-1} of the outer dims from the task number ``rem``."""
    for j in range(dims - 1, -1, -1):
        if j == 0:
            lines.append(f"    const int64_t i0 = {rem};")
        else:
            lines.append(f"    const int64_t i{j} = {rem} % {ext[j]};")
            lines.append(f"    const int64_t q{j} = {rem} / {ext[j]}; (void)q{j};")
            rem = f"q{j}"
    for j in range(dims):
        lines.append(f"    (void)i{j};")


def _out_index(k: K.Kernel) -> str:
    flat: sint = 0
    for j, (s_, st) in enumerate(zip(k.shape, contiguous_strides(k.shape))):
        flat = sym.add(flat, sym.mul(sym.index_var(j, s_), st))
    return cexpr(flat)


def _render_softmax_rows(k: K.Kernel, em: Emitter, lines: list[str], ext: list[str]) -> sint:
    """Render the kernel's loop over tasks into ``lines``; returns the task count."""
    v = k.value
    assert isinstance(v, K.SoftmaxSum)
    n = len(k.shape)
    dot = _score_dot(k)
    if dot is None:
        tasks: sint = 1
        for sz in k.shape[:-1]:
            tasks = sym.mul(tasks, sz)
        lines.append("  for (int64_t t = begin; t < end; ++t) {")
        _decode_task(lines, ext, n - 1, "t")
        em.block(lambda: lines.extend(_row(k, em, "    ")))
        lines.append("  }")
        return tasks
    lines.insert(0, _SM_PRELUDE)
    nb = sym.ceildiv(k.shape[-2], _QB)
    tasks = nb
    for sz in k.shape[:-2]:
        tasks = sym.mul(tasks, sz)
    lines += [
        "  for (int64_t t = begin; t < end; ++t) {",
        # blocks in the order first, last, second, second last, ...: a causal mask's work grows
        # along the blocks, and a run of tasks (a thread's chunk) then holds light and heavy
        f"    const int64_t tb = t % {cexpr(nb)}, tq = t / {cexpr(nb)}; (void)tq;",
        f"    const int64_t ib = ((tb & 1) ? {cexpr(nb)} - 1 - tb / 2 : tb / 2) * {_QB};",
    ]
    _decode_task(lines, ext, n - 2, "tq")
    lines.append(f"    const int64_t rows = lm_min({_QB}, {ext[n - 2]} - ib);")
    # parts of the score and values that hold for the whole task (a head's offsets)
    em.lines = []
    inner = frozenset({v.var.name, f"_i{n - 2}", f"_i{n - 1}"})
    em.hoist(v.score, inner, "    ")
    em.hoist(v.weight, inner, "    ")
    lines += em.lines
    jv, rv, d, ext_s = _c_name(v.var), _c_name(dot.red.var), dot.red.extent, cexpr(v.extent)
    cv, cols = f"i{n - 1}", cexpr(k.shape[-1])
    lines += [
        f"    if ({_SHORT_KEYS} * ({ext_s}) < LM_SM_T) {{",
        "      /* too few keys to amortize a zero-padded tile: the row form, each key's",
        "         operand (RoPE included) computed once per task, transposed (keys along",
        "         two vectors, which hold every key: LM_SM_T / 3 < 2 * LM_VL), and each row's",
        "         dot products as vector FMAs */",
        f"      float kt[{d}][2 * LM_VL] __attribute__((aligned(64)));",
        f"      float vt[2 * LM_VL][{cols}] __attribute__((aligned(64)));",
        f"      for (int64_t {rv} = 0; {rv} < {d}; ++{rv})",
        f"        for (int64_t jj = {ext_s}; jj < 2 * LM_VL; ++jj) kt[{rv}][jj] = 0;",
        f"      for (int64_t {jv} = 0; {jv} < {ext_s}; ++{jv}) {{",
        f"        for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{",
    ]
    em.block(lambda: lines.extend(_emit_into(em, dot.k, " " * 10, f"kt[{rv}][{jv}] = {{}};")))
    lines += [
        "        }",
        "        /* and its value row (a bias added, a packed batch's row gathered) */",
        f"        for (int64_t {cv} = 0; {cv} < {cols}; ++{cv}) {{",
    ]
    em.block(lambda: lines.extend(_emit_into(em, v.weight, " " * 10, f"vt[{jv}][{cv}] = {{}};")))
    lines += ["        }", "      }"]
    _rows_loop(k, em, lines, dot, "kt")
    lines += ["      continue;", "    }", f"    if (rows < {_RB}) {{"]
    _rows_loop(k, em, lines, dot, None)
    lines += ["      continue;", "    }"]
    em.block(lambda: lines.extend(_blocked(k, em, dot)))
    lines.append("  }")
    return tasks


def _rows_loop(k: K.Kernel, em: Emitter, lines: list[str], dot: _ScoreDot, kt: str | None) -> None:
    n = len(k.shape)
    lines += [
        "      for (int64_t ri = 0; ri < rows; ++ri) {",
        f"        const int64_t i{n - 2} = ib + ri;",
    ]
    em.block(lambda: lines.extend(_row(k, em, "        ", dot, kt)))
    lines.append("      }")


def _row(
    k: K.Kernel, em: Emitter, ind: str, dot: _ScoreDot | None = None, kt: str | None = None
) -> list[str]:
    """The row form for the row the index variables i0..i{n-2} name: per tile of keys, the
    scores, the tile max, rescale of the running sums, exp of the tile, then the weighted
    columns accumulate as a vector. With the score's dot product known (``dot``), the row's
    query operand is computed once (RoPE included), not once per key; ``kt`` names an array
    holding every key's operand transposed (``kt[r][key]``, two vectors of keys: one tile)
    and ``vt[key][column]`` their value rows when the caller computed them, and the row's dot
    products are vector FMAs over it."""
    v = k.value
    assert isinstance(v, K.SoftmaxSum)
    n, cols = len(k.shape), k.shape[-1]
    t, T = ctype(v.dtype), _SM_TILE
    jv, cv = _c_name(v.var), f"i{n - 1}"
    out: list[str] = []
    em.lines = []
    em.hoist(v.score, frozenset({v.var.name}), ind)
    em.hoist(v.weight, frozenset({v.var.name, f"_i{n - 1}"}), ind)
    out += em.lines
    ext_s = cexpr(v.extent)
    i2, i3, i4 = ind + "  ", ind + "    ", ind + "      "
    if dot is not None:
        rv, d = _c_name(dot.red.var), dot.red.extent
        out += [f"{ind}float qrow[{d}];", f"{ind}for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{"]
        em.block(lambda: out.extend(_emit_into(em, dot.q, i2, "qrow[" + rv + "] = {};")))
        out.append(f"{ind}}}")
    if dot is not None and kt is not None:
        out += [
            f"{ind}float dots[2 * LM_VL] __attribute__((aligned(64)));",
            f"{ind}{{",
            f"{i2}lm_vf d0 = {{0}}, d1 = {{0}};",
            f"{i2}for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{",
            f"{i3}d0 += qrow[{rv}] * lm_vld(&{kt}[{rv}][0]);",
            f"{i3}d1 += qrow[{rv}] * lm_vld(&{kt}[{rv}][LM_VL]);",
            f"{i2}}}",
            f"{i2}lm_vst(dots, d0), lm_vst(dots + LM_VL, d1);",
            f"{ind}}}",
        ]
    out += [
        f"{ind}{t} acc[{cols}] = {{0}}, m = -INFINITY, l = 0;",
        f"{ind}for (int64_t j0 = 0; j0 < {ext_s}; j0 += {T}) {{",
        f"{i2}const int64_t jn = lm_min({T}, {ext_s} - j0);",
        f"{i2}{t} sc[{T}];",
        f"{i2}for (int64_t jj = 0; jj < jn; ++jj) {{",
        f"{i3}const int64_t {jv} = j0 + jj;",
    ]
    if dot is None:
        em.block(lambda: out.extend(_emit_into(em, v.score, i3, "sc[jj] = {};")))
    else:
        if kt is None:
            out += [
                f"{i3}float dsum = 0;",
                f"{i3}#pragma omp simd reduction(+:dsum)",
                f"{i3}for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{",
            ]
            em.block(lambda: out.extend(_emit_into(em, dot.k, i4, f"dsum += qrow[{rv}] * {{}};")))
            out.append(f"{i3}}}")
        else:
            out.append(f"{i3}const float dsum = dots[{jv}];")

        def score() -> None:
            em.scopes[-1][dot.red] = "dsum"
            out.extend(_emit_into(em, v.score, i3, "sc[jj] = {};"))

        em.block(score)
    out += [
        f"{i2}}}",
        f"{i2}{t} tm = -INFINITY;",
        f"{i2}for (int64_t jj = 0; jj < jn; ++jj) tm = sc[jj] > tm ? sc[jj] : tm;",
        f"{i2}if (tm == -INFINITY) continue; /* every key of the tile masked */",
        f"{i2}if (tm > m) {{",
        f"{i3}if (m != -INFINITY) {{ /* before the first live tile the sums are 0 */",
        f"{i3}  const {t} r = {em.exp2('m - tm', v.dtype)};",
        f"{i3}  l *= r;",
        f"{i3}  for (int c = 0; c < {cols}; ++c) acc[c] *= r;",
        f"{i3}}}",
        f"{i3}m = tm;",
        f"{i2}}}",
        # the exps apart from the sum: a float sum keeps its loop scalar (no reassociation),
        # the exps alone vectorize
        f"{i2}for (int64_t jj = 0; jj < jn; ++jj) sc[jj] = {em.exp2('sc[jj] - m', v.dtype)};",
        f"{i2}for (int64_t jj = 0; jj < jn; ++jj) l += sc[jj];",
        f"{i2}for (int64_t jj = 0; jj < jn; ++jj) {{",
        f"{i3}const int64_t {jv} = j0 + jj;",
        f"{i3}const {t} p = sc[jj];",
        f"{i3}#pragma omp simd",
        f"{i3}for (int64_t {cv} = 0; {cv} < {cols}; ++{cv}) {{",
    ]
    if kt is not None:  # the caller computed the value rows too
        out.append(f"{i4}acc[{cv}] += p * vt[{jv}][{cv}];")
    else:
        em.block(lambda: out.extend(_emit_into(em, v.weight, i4, "acc[" + cv + "] += p * {};")))
    out += [f"{i3}}}", f"{i2}}}", f"{ind}}}"]
    out.append(f"{ind}for (int64_t {cv} = 0; {cv} < {cols}; ++{cv})")
    out.append(f"{ind}  " + store_stmt("b0", _out_index(k), f"acc[{cv}] / l", k.dtype))
    return out


def _masked_tile_skip(
    k: K.Kernel, em: Emitter, dot: _ScoreDot, subst: dict[K.Value, str] | None = None
) -> list[str]:
    """C that skips a tile of keys no row of the block gives weight: every score is -inf
    for both extreme finite dot products, so (the score being monotone in its dot) for every
    finite one; the tile would add exp2(-inf) = 0 to every sum (a causal mask's keys past the
    block's last row). The check is a vector loop per row and stops after the first row
    with a live score, so an unmasked tile pays for one row of it. Dot products that
    overflow to inf are not covered: like attention that skips causally masked keys, their
    masked scores then do not turn the row into NaN. ``subst``: C for parts of the score
    known on the whole tile (see ``_index_steps``)."""
    v = k.value
    assert isinstance(v, K.SoftmaxSum)
    n = len(k.shape)
    row, jv = f"i{n - 2}", _c_name(v.var)
    out = [
        "      { /* a tile every score of the block leaves at -inf adds nothing: skip it */",
        "        int dead = 1;",
        "        for (int64_t ri = 0; ri < rows && dead; ++ri) {",
        f"          const int64_t {row} = ib + ri;",
        "          #pragma omp simd reduction(&:dead)",
        "          for (int64_t jj = 0; jj < jn; ++jj) {",
        f"            const int64_t {jv} = j0 + jj;",
        "            float hi, lo;",
    ]
    for bound, var in (("LM_FLT_MAX", "hi"), ("-LM_FLT_MAX", "lo")):

        def score(bound: str = bound, var: str = var) -> None:
            em.scopes[-1].update(subst or {})
            em.scopes[-1][dot.red] = bound
            out.extend(_emit_into(em, v.score, "            ", var + " = {};"))

        em.block(score)
    out += [
        "            dead &= (hi == -INFINITY) & (lo == -INFINITY); /* NaN: live */",
        "          }",
        "        }",
        "        if (dead) continue;",
        "      }",
    ]
    return out


@dataclass
class _Step:
    """A comparison ``a < b`` of the score (a causal mask's ``key < row + 1``) whose
    ``b - a`` is ``rest + row_c * row + key_c * key``, ``rest`` free of both: over a
    rectangle of rows and keys its extremes are at corners, so a tile can be known to pass it
    everywhere, or fail it everywhere, from two numbers."""

    node: K.IndexVal
    rest: sint
    row_c: int
    key_c: int


def _index_steps(v: K.SoftmaxSum, row_var: sint) -> list[_Step]:
    """The score's comparisons linear in the row and key indices (see ``_Step``)."""
    if not isinstance(row_var, sym.Expr):
        return []
    row, key, out = row_var.name, v.var.name, []
    for x in K.walk(v.score):
        if not (isinstance(x, K.IndexVal) and isinstance(x.expr, sym.Expr)):
            continue
        if x.expr.kind != LT:
            continue
        a, b = x.expr.args
        diff = sym.add(b, sym.mul(a, -1))
        rest = sym.substitute(diff, {row: 0, key: 0})
        rc = sym.as_int(sym.add(sym.substitute(diff, {row: 1, key: 0}), sym.mul(rest, -1)))
        kc = sym.as_int(sym.add(sym.substitute(diff, {row: 0, key: 1}), sym.mul(rest, -1)))
        if rc is None or kc is None or sym.var_names(rest) & {row, key}:
            continue
        lin = sym.add(rest, sym.add(sym.mul(row_var, rc), sym.mul(v.var, kc)))
        if sym.add(lin, sym.mul(diff, -1)) != 0:
            continue
        out.append(_Step(x, rest, rc, kc))
    return out


def _step_bounds(steps: list[_Step], row: str, jv: str) -> list[str]:
    """C for the least and greatest ``b - a`` of each step over the tile (rows ``ib`` ..
    ``ib + rows - 1``, keys ``j0`` .. ``j0 + jn - 1``): ``lt_all`` when every step holds
    on the whole tile, ``lt_none`` when the one step fails on all of it."""
    r_lo, r_hi, k_lo, k_hi = "ib", "(ib + rows - 1)", "j0", "(j0 + jn - 1)"
    out, alls = [], []
    for i, st in enumerate(steps):
        lo = f"{cexpr(st.rest)} + {st.row_c} * {r_lo if st.row_c > 0 else r_hi}"
        lo += f" + {st.key_c} * {k_lo if st.key_c > 0 else k_hi}"
        hi = f"{cexpr(st.rest)} + {st.row_c} * {r_hi if st.row_c > 0 else r_lo}"
        hi += f" + {st.key_c} * {k_hi if st.key_c > 0 else k_lo}"
        out += [f"      const int64_t lt{i}_lo = {lo}, lt{i}_hi = {hi};"]
        alls.append(f"lt{i}_lo >= 1")
    out.append(f"      const int lt_all = {' && '.join(alls)};")
    none = "lt0_hi <= 0" if len(steps) == 1 else "0"
    out.append(f"      const int lt_none = {none}; (void)lt_none;")
    return out


def _in_place(x: K.Value, key: sym.Expr, inner: sint) -> tuple[sint, sint] | None:
    """(offset at key 0 and inner index 0, key stride) when ``x`` is an f32 load of
    ``offset + stride * key + inner``, free of padding: then a tile's rows are read where they
    are stored instead of copied."""
    if not (isinstance(x, K.Load) and x.valid == 1 and x.dtype is dt.f32):
        return None
    if not isinstance(inner, sym.Expr):
        return None
    idx, names = x.index, {key.name, inner.name}
    base = sym.substitute(idx, {key.name: 0, inner.name: 0})
    one = sym.add(sym.substitute(idx, {key.name: 0, inner.name: 1}), sym.mul(base, -1))
    stride = sym.add(sym.substitute(idx, {key.name: 1, inner.name: 0}), sym.mul(base, -1))
    if one != 1 or (sym.var_names(base) | sym.var_names(stride)) & names:
        return None
    if sym.add(sym.add(base, sym.add(sym.mul(key, stride), inner)), sym.mul(idx, -1)) != 0:
        return None
    return base, stride


def _blocked(k: K.Kernel, em: Emitter, dot: _ScoreDot) -> list[str]:
    """The blocked form for the task's ``rows`` query rows from ``ib`` (at least _RB). The
    block's rows lie along vector lanes: its query operands are transposed once per task
    (``qt[r][row]``), so each tile of keys is read as it is stored (``key * stride + r``: in
    place when a plain load, else copied to ``kt``) and the dot products are vector FMAs of
    query lanes by broadcast key elements; the scores ``st[key][row]`` then keep the rows in lanes, so the running max, the
    rescale and the sums are vector operations across rows, and P.V broadcasts each score
    against vectors of value columns held in registers over the whole tile."""
    v = k.value
    assert isinstance(v, K.SoftmaxSum)
    n, cols, d = len(k.shape), k.shape[-1], dot.red.extent
    assert isinstance(d, int) and isinstance(cols, int)
    row, jv, cv, rv = f"i{n - 2}", _c_name(v.var), f"i{n - 1}", _c_name(dot.red.var)
    ext_s = cexpr(v.extent)
    kt_, kg, rb = _KT, _KG, _RB
    assert kt_ % 4 == 0  # the tile max's four chains
    al = "__attribute__((aligned(64)))"
    # value columns in vectors: groups of four (16 accumulators of _RB rows), then the rest
    ncv = f"(({cols} + LM_VL - 1) / LM_VL)"
    colp = f"({ncv} * LM_VL)"
    qv = f"({_QB} / LM_VL)"  # vectors of query rows
    qbp = -(-_QB // rb) * rb  # rows of the accumulators: whole register blocks
    sts = -(-qbp // 16) * 16  # a score row's stride: whole 64-byte lines
    ktp = -(-kt_ // kg) * kg  # rows of the key tile: whole register blocks (the rest zero)
    out = [
        f"    float qt[{d}][{_QB}] {al}, oacc[{qbp}][{colp}] {al};",
        f"    float st[{ktp}][{sts}] {al}, kt[{ktp}][{d}] {al}, vt[{kt_}][{colp}] {al};",
        f"    float mrow[{_QB}] {al}, lrow[{_QB}] {al};",
        "    /* zero: the padding rows and columns of the copies below stay so (rows past the",
        "       block's end get finite sums that are not stored) */",
        "    memset(oacc, 0, sizeof oacc), memset(qt, 0, sizeof qt), memset(vt, 0, sizeof vt);",
        "    memset(kt, 0, sizeof kt), memset(st, 0, sizeof st);",
        f"    for (int ri = 0; ri < {_QB}; ++ri) mrow[ri] = -INFINITY, lrow[ri] = 0;",
        "    /* the block's query operands, transposed, once per task */",
        "    for (int64_t ri = 0; ri < rows; ++ri) {",
        f"      const int64_t {row} = ib + ri;",
        f"      for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{",
    ]
    em.block(lambda: out.extend(_emit_into(em, dot.q, "        ", "qt[" + rv + "][ri] = {};")))
    kpl = _in_place(dot.k, v.var, dot.red.var)
    vpl = _in_place(v.weight, v.var, sym.index_var(n - 1, cols))
    kp = f"{em.ptr_of(dot.k.buf)} + ({cexpr(kpl[0])})" if kpl and isinstance(dot.k, K.Load) else "0"
    vp = (
        f"{em.ptr_of(v.weight.buf)} + ({cexpr(vpl[0])})"
        if vpl and isinstance(v.weight, K.Load)
        else "0"
    )
    out += [
        "      }",
        "    }",
        f"    const float *const kp = {kp}, *const vp = {vp}; (void)kp, (void)vp;",
        f"    const int64_t ks = {cexpr(kpl[1]) if kpl else 0}, vs = {cexpr(vpl[1]) if vpl else 0};",
        "    (void)ks, (void)vs;",
        f"    for (int64_t j0 = 0; j0 < {ext_s}; j0 += {kt_}) {{",
        f"      const int64_t jn = lm_min({kt_}, {ext_s} - j0);",
    ]
    steps = _index_steps(v, sym.index_var(n - 2, k.shape[n - 2]))
    true_: dict[K.Value, str] = {st.node: "1" for st in steps}
    if steps:
        out += ["      /* the score's index comparisons that hold, or fail, on the whole tile */"]
        out += _step_bounds(steps, row, jv)
    if _monotone_in(v.score, dot.red):
        if steps:
            out += ["      if (lt_all)"]
            out += _masked_tile_skip(k, em, dot, true_)
            if len(steps) == 1:
                out += ["      else if (lt_none)"]
                false_: dict[K.Value, str] = {steps[0].node: "0"}
                out += _masked_tile_skip(k, em, dot, false_)
            out += ["      else"]
        out += _masked_tile_skip(k, em, dot)
    out += [
        "      /* the tile's key operands and value rows: read in place when plain loads whose",
        "         tile (and key group) lies inside the sequence, else copied (the rest: zero) */",
        f"      const int kin = {'1' if kpl else '0'} && j0 + {ktp} <= {ext_s};",
        f"      const int vin = {'1' if vpl else '0'} && j0 + {kt_} <= {ext_s}"
        f" && {cols} % LM_VL == 0;",
        "      const float *const kb = kin ? kp + j0 * ks : &kt[0][0];",
        "      const float *const vb = vin ? vp + j0 * vs : &vt[0][0];",
        f"      const int64_t kss = kin ? ks : {d}, vss = vin ? vs : {colp};",
        "      if (!kin)",
        "        for (int64_t jj = 0; jj < jn; ++jj) {",
        f"          const int64_t {jv} = j0 + jj;",
        f"          for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{",
    ]
    em.block(lambda: out.extend(_emit_into(em, dot.k, "            ", "kt[jj][" + rv + "] = {};")))
    out += [
        "          }",
        "        }",
        "      if (!vin)",
        "        for (int64_t jj = 0; jj < jn; ++jj) {",
        f"          const int64_t {jv} = j0 + jj;",
        f"          for (int64_t {cv} = 0; {cv} < {cols}; ++{cv}) {{",
    ]
    em.block(
        lambda: out.extend(_emit_into(em, v.weight, "            ", "vt[jj][" + cv + "] = {};"))
    )
    out += [
        "          }",
        "        }",
        f"      for (int64_t jj = jn; jj < {kt_}; ++jj) {{ /* the last tile */",
        f"        for (int c = 0; c < {d}; ++c) kt[jj][c] = 0;",
        f"        for (int c = 0; c < {cols}; ++c) vt[jj][c] = 0;",
        "      }",
        f"      /* st = keys x the block's rows: {kg} keys x 4 vectors of rows per register block",
        "         (the key groups that hold live keys) */",
        f"      for (int j = 0; j < jn; j += {kg})",
        f"        for (int v0 = 0; v0 < {qv}; v0 += 4) {{",
        f"          lm_vf c[4][{kg}];",
        "          for (int u = 0; u < 4; ++u)",
        f"            for (int g = 0; g < {kg}; ++g) c[u][g] = (lm_vf){{0}};",
        f"          for (int r = 0; r < {d}; ++r) {{",
        "            lm_vf qq[4];",
        "            for (int u = 0; u < 4; ++u) qq[u] = lm_vld(&qt[r][(v0 + u) * LM_VL]);",
        f"            for (int g = 0; g < {kg}; ++g) {{",
        "              const float b = kb[(j + g) * kss + r];",
        "              for (int u = 0; u < 4; ++u) c[u][g] += qq[u] * b;",
        "            }",
        "          }",
        "          for (int u = 0; u < 4; ++u)",
        f"            for (int g = 0; g < {kg}; ++g) lm_vst(&st[j + g][(v0 + u) * LM_VL], c[u][g]);",
        "        }",
        "      /* the scores as the IR has them, each row's dot product read from st (the",
        "         index comparisons that hold on the whole tile as 1) */",
    ]
    for variant in [true_, None] if steps else [None]:
        if steps:
            out.append("      if (lt_all) {" if variant else "      } else {")
        out += [
            "      for (int64_t jj = 0; jj < jn; ++jj) {",
            f"        const int64_t {jv} = j0 + jj;",
            "        #pragma omp simd",
            "        for (int64_t ri = 0; ri < rows; ++ri) {",
            f"          const int64_t {row} = ib + ri;",
        ]

        def score(variant: dict[K.Value, str] | None = variant, out: list[str] = out) -> None:
            em.scopes[-1].update(variant or {})
            em.scopes[-1][dot.red] = "st[jj][ri]"
            out.extend(_emit_into(em, v.score, "          ", "st[jj][ri] = {};"))

        em.block(score)
        out += ["        }", "      }"]
    if steps:
        out.append("      }")
    out += [
        f"      for (int64_t jj = jn; jj < {kt_}; ++jj)",
        "        for (int64_t ri = 0; ri < rows; ++ri) st[jj][ri] = -INFINITY;",
        "      /* per vector of rows: the tile max (a NaN score is passed over: its exp makes the",
        "         row NaN), the rescale where the max grew, the exps and their sums. msub: the",
        "         max to subtract, +inf while a row has no weight (exp2(-inf - inf) = 0) */",
        f"      for (int w = 0; w < {qv}; ++w) {{",
        "        /* four chains of maxes, their latency overlapped */",
        "        lm_vf m4[4];",
        "        for (int u = 0; u < 4; ++u) m4[u] = lm_vld(&st[u][w * LM_VL]);",
        f"        for (int jj = 4; jj < {kt_}; jj += 4)",
        "          for (int u = 0; u < 4; ++u) m4[u] = lm_sm_vmax(m4[u], lm_vld(&st[jj + u][w * LM_VL]));",
        "        const lm_vf mt = lm_sm_vmax(lm_sm_vmax(m4[0], m4[1]), lm_sm_vmax(m4[2], m4[3]));",
        "        const lm_vf mo = lm_vld(&mrow[w * LM_VL]), mn = lm_sm_vmax(mo, mt);",
        "        const lm_vf one = (lm_vf){0} + 1.0f, inf = one * INFINITY;",
        "        /* 1 where the max stayed (both -inf included) */",
        "        const lm_vf r = lm_sm_vsel(mo == mn, one, lm_vexp2f(mo - mn));",
        "        lm_vi grew = r != one;",
        "        int any = 0;",
        "        for (int e = 0; e < LM_VL; ++e) any |= grew[e];",
        "        if (any) {",
        "          lm_vst(&lrow[w * LM_VL], lm_vld(&lrow[w * LM_VL]) * r);",
        "          for (int e = 0; e < LM_VL; ++e)",
        f"            for (int c = 0; c < {colp}; c += LM_VL)",
        "              lm_vst(&oacc[w * LM_VL + e][c], lm_vld(&oacc[w * LM_VL + e][c]) * r[e]);",
        "        }",
        "        lm_vst(&mrow[w * LM_VL], mn);",
        "        const lm_vf msub = lm_sm_vsel(mn == -inf, inf, mn);",
        "        lm_vf ls = lm_vld(&lrow[w * LM_VL]);",
        f"        for (int jj = 0; jj < {kt_}; ++jj) {{",
        "          const lm_vf p = lm_vexp2f(lm_vld(&st[jj][w * LM_VL]) - msub);",
        "          lm_vst(&st[jj][w * LM_VL], p);",
        "          ls += p;",
        "        }",
        "        lm_vst(&lrow[w * LM_VL], ls);",
        "      }",
        f"      /* P.V: {rb} rows x up to 4 vectors of columns in registers over the tile */",
        f"      for (int r0 = 0; r0 < rows; r0 += {rb}) {{",
    ]
    for lo, width in ((0, f"({ncv} / 4 * 4)"), (f"({ncv} / 4 * 4)", ncv)):
        nw = "4" if lo == 0 else f"({ncv} % 4)"
        out += [
            f"        for (int cb = {lo}; cb < {width}; cb += 4) {{",
            f"          lm_vf a[{rb}][4];",
            f"          for (int i = 0; i < {rb}; ++i)",
            f"            for (int u = 0; u < {nw}; ++u) a[i][u] = lm_vld(&oacc[r0 + i][(cb + u) * LM_VL]);",
            "          for (int jj = 0; jj < jn; ++jj) {",
            "            lm_vf vv[4];",
            f"            for (int u = 0; u < {nw}; ++u) vv[u] = lm_vld(&vb[jj * vss + (cb + u) * LM_VL]);",
            f"            for (int i = 0; i < {rb}; ++i) {{",
            "              const float p = st[jj][r0 + i];",
            f"              for (int u = 0; u < {nw}; ++u) a[i][u] += p * vv[u];",
            "            }",
            "          }",
            f"          for (int i = 0; i < {rb}; ++i)",
            f"            for (int u = 0; u < {nw}; ++u) lm_vst(&oacc[r0 + i][(cb + u) * LM_VL], a[i][u]);",
            "        }",
        ]
    out += [
        "      }",
        "    }",
        "    for (int64_t ri = 0; ri < rows; ++ri) {",
        f"      const int64_t {row} = ib + ri;",
        f"      for (int64_t {cv} = 0; {cv} < {cols}; ++{cv})",
        "        " + store_stmt("b0", _out_index(k), f"oacc[ri][{cv}] / lrow[ri]", k.dtype),
        "    }",
    ]
    return out
