"""C for attention's online softmax (``K.SoftmaxSum``): one pass over the keys per query row
serves every output column of that row.

Two forms. The blocked form, when the IR shows the score's heart is a dot product of a
query-side and a key-side operand (``sum_r q[r] * k[j, r]``), works like a small GEMM: a task
is a block of query rows; each tile of keys is copied once (the key operand transposed, the
value rows padded), the block's dot products are register-blocked vector FMAs over the tile,
the rest of the score (scale, mask, whatever the IR holds) is evaluated per row from them,
and P.V accumulates as rank-1 updates of several rows at once. The row form serves every
other score, and blocks too short to amortize the copies: per row, scores of a tile of keys,
then exp, then the weighted columns as a vector.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import COMMUTATIVE, Op
from ...graph.symbolic import sint
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
_RB = 4  # rows per register block; a block of fewer rows takes the row form
_MAX_DOT = 256  # longest dot product (head dim) the blocked form copies to the stack

# Vector helpers of the blocked form. The key tile is LM_SM_T keys: four vectors, so the
# dot products of a 4-row block are 16 accumulators, as are the 4 rows x 4 vectors of P.V.
# GCC's vector types keep them in registers (plain loops over arrays stay in memory).
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
static inline lm_vf lm_vld(const float *p) { lm_vf v; memcpy(&v, p, sizeof v); return v; }
static inline void lm_vst(float *p, lm_vf v) { memcpy(p, &v, sizeof v); }
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
        f"    const int64_t ib = (t % {cexpr(nb)}) * {_QB}, tq = t / {cexpr(nb)}; (void)tq;",
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


def _masked_tile_skip(k: K.Kernel, em: Emitter, dot: _ScoreDot) -> list[str]:
    """C that skips a tile of keys no row of the block gives weight: every score is -inf
    for both extreme finite dot products, so (the score being monotone in its dot) for every
    finite one; the tile would add exp2(-inf) = 0 to every sum (a causal mask's keys past the
    block's last row). The check is a vector loop per row and stops after the first row
    with a live score, so an unmasked tile pays for one row of it. Dot products that overflow to inf are not covered: like attention that skips
    causally masked keys, their masked scores then do not turn the row into NaN."""
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


def _blocked(k: K.Kernel, em: Emitter, dot: _ScoreDot) -> list[str]:
    """The blocked form for the task's ``rows`` query rows from ``ib`` (at least _RB)."""
    v = k.value
    assert isinstance(v, K.SoftmaxSum)
    n, cols, d = len(k.shape), k.shape[-1], dot.red.extent
    assert isinstance(d, int)
    row, jv, cv, rv = f"i{n - 2}", _c_name(v.var), f"i{n - 1}", _c_name(dot.red.var)
    ext_s = cexpr(v.extent)
    colp = f"(({cols} + LM_SM_T - 1) / LM_SM_T * LM_SM_T)"  # value width padded to tiles
    al = "__attribute__((aligned(64)))"
    out = [
        f"    float qs[{_QB}][{d}] {al}, oacc[{_QB}][{colp}] {al}, mrow[{_QB}], lrow[{_QB}];",
        f"    float kts[{d}][LM_SM_T] {al}, vts[LM_SM_T][{colp}] {al};",
        "    /* zero: the padding rows and columns of the copies below stay so */",
        "    memset(oacc, 0, sizeof oacc), memset(qs, 0, sizeof qs);",
        "    memset(kts, 0, sizeof kts), memset(vts, 0, sizeof vts);",
        f"    for (int64_t ri = 0; ri < {_QB}; ++ri) mrow[ri] = -INFINITY, lrow[ri] = 0;",
        "    /* the block's query operands, once per task */",
        "    for (int64_t ri = 0; ri < rows; ++ri) {",
        f"      const int64_t {row} = ib + ri;",
        f"      for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{",
    ]
    em.block(lambda: out.extend(_emit_into(em, dot.q, "        ", "qs[ri][" + rv + "] = {};")))
    out += [
        "      }",
        "    }",
        f"    for (int64_t j0 = 0; j0 < {ext_s}; j0 += LM_SM_T) {{",
        f"      const int64_t jn = lm_min(LM_SM_T, {ext_s} - j0);",
    ]
    if _monotone_in(v.score, dot.red):
        out += _masked_tile_skip(k, em, dot)
    out += [
        "      /* the tile's key operands transposed (keys along vectors) and its value rows;",
        "         keys past the end are zero (their scores are -inf below) */",
        "      for (int64_t jj = jn; jj < LM_SM_T; ++jj) {",
        f"        for (int c = 0; c < {d}; ++c) kts[c][jj] = 0;",
        f"        for (int c = 0; c < {cols}; ++c) vts[jj][c] = 0;",
        "      }",
        "      for (int64_t jj = 0; jj < jn; ++jj) {",
        f"        const int64_t {jv} = j0 + jj;",
        f"        for (int64_t {rv} = 0; {rv} < {d}; ++{rv}) {{",
    ]
    em.block(lambda: out.extend(_emit_into(em, dot.k, "          ", "kts[" + rv + "][jj] = {};")))
    out += ["        }", f"        for (int64_t {cv} = 0; {cv} < {cols}; ++{cv}) {{"]
    em.block(
        lambda: out.extend(_emit_into(em, v.weight, "          ", "vts[jj][" + cv + "] = {};"))
    )
    out += [
        "        }",
        "      }",
        f"      for (int64_t rb = 0; rb < rows; rb += {_RB}) {{",
        f"        float dots[{_RB}][LM_SM_T] {al}, ps[{_RB}][LM_SM_T] {al};",
        "        { /* dots = the block's query rows x the tile's keys */",
        f"          lm_vf c[{_RB}][4];",
        f"          for (int ri = 0; ri < {_RB}; ++ri)",
        "            for (int u = 0; u < 4; ++u) c[ri][u] = (lm_vf){0};",
        f"          for (int r = 0; r < {d}; ++r) {{",
        "            lm_vf kv[4];",
        "            for (int u = 0; u < 4; ++u) kv[u] = lm_vld(&kts[r][u * LM_VL]);",
        f"            for (int ri = 0; ri < {_RB}; ++ri) {{",
        "              const float a = qs[rb + ri][r];",
        "              for (int u = 0; u < 4; ++u) c[ri][u] += a * kv[u];",
        "            }",
        "          }",
        f"          for (int ri = 0; ri < {_RB}; ++ri)",
        "            for (int u = 0; u < 4; ++u) lm_vst(&dots[ri][u * LM_VL], c[ri][u]);",
        "        }",
        "        /* per row: scores, tile max, rescale; msub: the max to subtract, +inf for a",
        "           row without weight here (past the block's end, or every key masked) */",
        f"        float msub[{_RB}];",
        f"        for (int ri = 0; ri < {_RB}; ++ri) {{",
        "          msub[ri] = INFINITY;",
        "          if (rb + ri >= rows) { /* past the block's last row: no weight */",
        "            for (int jj = 0; jj < LM_SM_T; ++jj) ps[ri][jj] = -INFINITY;",
        "            continue;",
        "          }",
        f"          const int64_t {row} = ib + rb + ri;",
        "          for (int64_t jj = 0; jj < jn; ++jj) {",
        f"            const int64_t {jv} = j0 + jj;",
    ]

    def score() -> None:
        # the score as the IR has it, its dot product read from the micro-GEMM's result
        em.scopes[-1][dot.red] = "dots[ri][jj]"
        out.extend(_emit_into(em, v.score, "            ", "ps[ri][jj] = {};"))

    em.block(score)
    out += [
        "          }",
        "          for (int64_t jj = jn; jj < LM_SM_T; ++jj) ps[ri][jj] = -INFINITY;",
        "          /* the tile max as an integer max of order-preserving keys (it vectorizes);",
        "             NaN when a score is NaN */",
        "          int32_t key = (int32_t)0x807fffff, nan = 0;",
        "          #pragma omp simd reduction(max:key) reduction(|:nan)",
        "          for (int jj = 0; jj < LM_SM_T; ++jj) {",
        "            const uint32_t b = lm_f32_bits(ps[ri][jj]);",
        "            const int32_t kk = (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) >> 1));",
        "            key = kk > key ? kk : key;",
        "            nan |= ps[ri][jj] != ps[ri][jj];",
        "          }",
        "          const float tm = nan ? NAN : lm_bits_f32((uint32_t)key ^ ((uint32_t)(key >> 31) >> 1));",
        "          if (tm == -INFINITY) continue; /* every key of the tile masked */",
        "          float mm = mrow[rb + ri];",
        "          if (tm > mm) {",
        "            if (mm != -INFINITY) { /* before the first live tile the sums are 0 */",
        "              const float r = lm_exp2f(mm - tm);",
        "              lrow[rb + ri] *= r;",
        f"              for (int c = 0; c < {colp}; ++c) oacc[rb + ri][c] *= r;",
        "            }",
        "            mm = mrow[rb + ri] = tm;",
        "          }",
        "          msub[ri] = mm;",
        "        }",
        "        /* the exps of all the block's rows in one loop, independent chains that",
        "           overlap (exp2(-inf - inf) = 0 for rows without weight); then each row's sum",
        "           as vectors (a reduction clause would keep its lanes on the stack) */",
        "        for (int jj = 0; jj < LM_SM_T; jj += LM_VL) {",
        *(
            f"          lm_vst(&ps[{r}][jj], lm_vexp2f(lm_vld(&ps[{r}][jj]) - msub[{r}]));"
            for r in range(_RB)
        ),
        "        }",
        f"        for (int ri = 0; ri < {_RB}; ++ri) {{",
        "          lm_vf sv = lm_vld(&ps[ri][0]);",
        "          for (int u = 1; u < 4; ++u) sv += lm_vld(&ps[ri][u * LM_VL]);",
        "          float ls = 0;",
        "          for (int e = 0; e < LM_VL; ++e) ls += sv[e];",
        "          lrow[rb + ri] += ls;",
        "        }",
        "        /* P.V: rank-1 updates of the block's rows, four vectors of columns at a time */",
        f"        for (int c0 = 0; c0 < {colp}; c0 += LM_SM_T) {{",
        f"          lm_vf a[{_RB}][4];",
        f"          for (int ri = 0; ri < {_RB}; ++ri)",
        "            for (int u = 0; u < 4; ++u) a[ri][u] = lm_vld(&oacc[rb + ri][c0 + u * LM_VL]);",
        "          for (int jj = 0; jj < LM_SM_T; ++jj) {",
        "            lm_vf vv[4];",
        "            for (int u = 0; u < 4; ++u) vv[u] = lm_vld(&vts[jj][c0 + u * LM_VL]);",
        f"            for (int ri = 0; ri < {_RB}; ++ri) {{",
        "              const float p = ps[ri][jj];",
        "              for (int u = 0; u < 4; ++u) a[ri][u] += p * vv[u];",
        "            }",
        "          }",
        f"          for (int ri = 0; ri < {_RB}; ++ri)",
        "            for (int u = 0; u < 4; ++u) lm_vst(&oacc[rb + ri][c0 + u * LM_VL], a[ri][u]);",
        "        }",
        "      }",
        "    }",
        "    for (int64_t ri = 0; ri < rows; ++ri) {",
        f"      const int64_t {row} = ib + ri;",
        f"      for (int64_t {cv} = 0; {cv} < {cols}; ++{cv})",
        "        " + store_stmt("b0", _out_index(k), f"oacc[ri][{cv}] / lrow[ri]", k.dtype),
        "    }",
    ]
    return out
