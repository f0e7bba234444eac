"""C for attention's online softmax (``K.SoftmaxSum``) in row form: one pass over the keys
per query row serves every output column of that row."""

from __future__ import annotations

from ..compiler import kernel_ir as K
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.symbolic import sint
from ..graph.view import contiguous_strides
from .c import _c_name, _emit_into, _Emitter, cexpr, ctype, store_stmt

_SM_TILE = (
    32  # keys per tile of the row form: scores of a tile are computed, then exp'd, as vectors
)


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


def _render_softmax_rows(k: K.Kernel, em: _Emitter, lines: list[str], ext: list[str]) -> sint:
    """The row form: per task (one row), for each tile of keys: scores, the tile max, rescale
    of the running sums, exp of the tile, then the weighted columns accumulate as a vector."""
    v = k.value
    assert isinstance(v, K.SoftmaxSum)
    n, cols = len(k.shape), k.shape[-1]
    t, T = ctype(v.dtype), _SM_TILE
    jv, cv = _c_name(v.var), f"i{n - 1}"
    tasks: sint = 1
    for sz in k.shape[:-1]:
        tasks = sym.mul(tasks, sz)
    lines.append("  for (int64_t t = begin; t < end; ++t) {")
    rem = "t"
    for j in range(n - 2, -1, -1):
        if j == 0:
            lines.append(f"    const int64_t i0 = {rem};")
        else:
            lines.append(f"    const int64_t i{j} = {rem} % {ext[j]};")
            lines.append(f"    const int64_t q{j} = {rem} / {ext[j]}; (void)q{j};")
            rem = f"q{j}"
    for j in range(n - 1):
        lines.append(f"    (void)i{j};")
    em.lines = []
    em.hoist(v.score, frozenset({v.var.name}), "    ")
    em.hoist(v.weight, frozenset({v.var.name, f"_i{n - 1}"}), "    ")
    lines += em.lines
    ext_s = cexpr(v.extent)
    lines += [
        f"    {t} acc[{cols}] = {{0}}, m = -INFINITY, l = 0;",
        f"    for (int64_t j0 = 0; j0 < {ext_s}; j0 += {T}) {{",
        f"      const int64_t jn = lm_min({T}, {ext_s} - j0);",
        f"      {t} sc[{T}];",
        "      for (int64_t jj = 0; jj < jn; ++jj) {",
        f"        const int64_t {jv} = j0 + jj;",
    ]
    em.lines = []
    em.block(lambda: lines.extend(_emit_into(em, v.score, "        ", "sc[jj] = {};")))
    lines += [
        "      }",
        f"      {t} tm = -INFINITY;",
        "      for (int64_t jj = 0; jj < jn; ++jj) tm = sc[jj] > tm ? sc[jj] : tm;",
        "      if (tm == -INFINITY) continue; /* every key of the tile masked */",
        "      if (tm > m) {",
        f"        const {t} r = {em.exp2('m - tm', v.dtype)};",
        "        l *= r;",
        f"        for (int c = 0; c < {cols}; ++c) acc[c] *= r;",
        "        m = tm;",
        "      }",
        "      for (int64_t jj = 0; jj < jn; ++jj) {",
        f"        sc[jj] = {em.exp2('sc[jj] - m', v.dtype)};",
        "        l += sc[jj];",
        "      }",
        "      for (int64_t jj = 0; jj < jn; ++jj) {",
        f"        const int64_t {jv} = j0 + jj;",
        f"        const {t} p = sc[jj];",
        "        #pragma omp simd",
        f"        for (int64_t {cv} = 0; {cv} < {cols}; ++{cv}) {{",
    ]
    em.lines = []
    em.block(
        lambda: lines.extend(_emit_into(em, v.weight, "          ", "acc[" + cv + "] += p * {};"))
    )
    lines += ["        }", "      }", "    }"]
    flat: sint = 0
    for j, (s_, st) in enumerate(zip(k.shape, contiguous_strides(k.shape))):
        flat = sym.add(flat, sym.mul(sym.index_var(j, s_), st))
    lines.append(f"    for (int64_t {cv} = 0; {cv} < {cols}; ++{cv})")
    lines.append("      " + store_stmt("b0", cexpr(flat), f"acc[{cv}] / l", k.dtype))
    lines.append("  }")
    return tasks
