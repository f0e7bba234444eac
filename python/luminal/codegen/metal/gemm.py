"""A ``gemm`` library call rendered as a Metal kernel on the simdgroup matrices (8x8 MMA).

The descriptor, the tile loops over C, the operand tiles' element map and the epilogue are
the shared GPU gemm's (``codegen/gpu/gemm.py``). A threadgroup computes a BM x BN
tile of C (``schedule.GemmTile``, ranked by the cost model): A and B tiles of BK along k go
global -> threadgroup memory (bounds-checked, zero-filled), each simdgroup multiplies its
tm x tn 8x8 matrices with ``simdgroup_multiply_accumulate`` into f32 accumulators, and the
accumulators are staged in threadgroup memory so the store is bounds-checked too. f16
operands stay half in threadgroup memory; bf16 ones widen to f32 (Metal's bfloat matrices
need MSL 3.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ..gpu import gemm as G
from ..gpu.kernel import Rendered, dim_lines
from .kernel import METAL, PRELUDE
from .schedule import GemmTile, choose_tile

MetalGemm = Rendered  # its args are C, A, B (output first, like every generated kernel)


def render_gemm(
    lc: K.LibCall,
    dtypes: Mapping[int, dt.DType],
    dim_names: Sequence[str],
    tile: GemmTile | None = None,
) -> MetalGemm:
    g = G.prepare(lc, dtypes, "simdgroup-matrix")
    f, op, cdt, alpha, beta = g.fields, g.operand, g.out, g.alpha, g.beta
    # (global element type, threadgroup element type, global -> threadgroup conversion)
    glob, tt, conv = {
        dt.f32: ("float", "float", "{}"),
        dt.f16: ("half", "half", "{}"),
        dt.bf16: ("uint16_t", "float", "lm_bf16_to_f32({})"),
    }[op]
    t = tile or choose_tile(f, op.bits // 8)
    if t.bk % 8:
        raise ValueError(f"gemm tile {t}: bk must be a multiple of 8")
    bm, bn, bk, nt = t.bm, t.bn, t.bk, t.threads
    ctype = "float" if cdt is dt.f32 else "uint16_t"
    params = [METAL.param(0, ctype, False), METAL.param(1, glob, False),
              METAL.param(2, glob, False)]  # fmt: skip
    L = [METAL.frame(lc.name, params, len(dim_names), nt)]
    add = L.append
    add(f"  threadgroup {tt} As[{bm * bk}];  // [BM][BK]")
    add(f"  threadgroup {tt} Bs[{bk * bn}];  // [BK][BN]")
    add(f"  threadgroup float Cs[{bm * bn}];  // [BM][BN]")
    L += dim_lines(METAL, dim_names, "int64_t") + G.field_lines(f)
    add("  const int tid = (int)lm_tid.x;")
    add(f"  const int wm = (int)lm_sg / {t.sg_n}, wn = (int)lm_sg % {t.sg_n};")
    L += G.tile_loops(METAL, bm, bn, glob, ctype)
    add(f"    simdgroup_float8x8 acc[{t.tm}][{t.tn}];")
    add(f"    for (int i = 0; i < {t.tm}; ++i) for (int j = 0; j < {t.tn}; ++j) "
        "acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);")  # fmt: skip
    add(f"    for (int64_t k0 = 0; k0 < K; k0 += {bk}) {{")
    for x, outer, put in (("A", bm, f"As[r * {bk} + c]"), ("B", bn, f"Bs[c * {bn} + r]")):
        r, c, ok, addr = G.operand_map(f, x, outer, bk)
        add(f"      for (int e = tid; e < {outer * bk}; e += {nt}) {{ const int r = {r}, c = {c};")
        add(f"        {put} = ({ok}) ? ({tt}){conv.format(f'{x}[{addr}]')} : ({tt})0; }}")
    add("      threadgroup_barrier(mem_flags::mem_threadgroup);")
    add(f"      for (int kk = 0; kk < {bk}; kk += 8) {{")
    add(f"        simdgroup_matrix<{tt}, 8, 8> a[{t.tm}], b[{t.tn}];")
    add(f"        for (int i = 0; i < {t.tm}; ++i) "
        f"simdgroup_load(a[i], As + (wm * {t.tm * 8} + i * 8) * {bk} + kk, {bk});")  # fmt: skip
    add(f"        for (int j = 0; j < {t.tn}; ++j) "
        f"simdgroup_load(b[j], Bs + kk * {bn} + wn * {t.tn * 8} + j * 8, {bn});")  # fmt: skip
    add(f"        for (int i = 0; i < {t.tm}; ++i) for (int j = 0; j < {t.tn}; ++j)")
    add("          simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);")
    add("      }")
    add("      threadgroup_barrier(mem_flags::mem_threadgroup);")
    add("    }")
    add(f"    for (int i = 0; i < {t.tm}; ++i) for (int j = 0; j < {t.tn}; ++j)")
    add(f"      simdgroup_store(acc[i][j], Cs + (wm * {t.tm * 8} + i * 8) * {bn} + "
        f"wn * {t.tn * 8} + j * 8, {bn});")  # fmt: skip
    add("    threadgroup_barrier(mem_flags::mem_threadgroup);")
    add(f"    for (int e = tid; e < {bm * bn}; e += {nt}) {{")
    add(f"      const int64_t r = m0 + e / {bn}, c = n0 + e % {bn};")
    L += G.epilogue("Cs[e]", alpha, beta, cdt, "      ")
    add("    }")
    add("    threadgroup_barrier(mem_flags::mem_threadgroup);  // Cs is reused by the next tile")
    add("  }")
    add("}")
    source = PRELUDE + "\n".join(L) + "\n"
    return Rendered(
        lc.name,
        source,
        [g.c, g.a, g.b],
        G.grid(f, bm, bn),
        (nt, 1, 1),
        f"simdgroup-{op.name}-{bm}x{bn}x{bk}",
    )
