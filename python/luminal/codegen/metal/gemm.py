"""A ``gemm`` library call rendered as a Metal kernel on the simdgroup matrices (8x8 MMA).

The descriptor is the one every target reads (``codegen/cuda/gemm.py``'s ``gemm_fields``):
row-major ``C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]`` with leading dimensions, batch
strides and element offsets as expressions over plan dims. A threadgroup computes a BM x BN
tile of C (``schedule.GemmTile``, ranked by the cost model): A and B tiles of BK along k go
global -> threadgroup memory (bounds-checked, zero-filled), each simdgroup multiplies its
tm x tn 8x8 matrices with ``simdgroup_multiply_accumulate`` into f32 accumulators, and the
accumulators are staged in threadgroup memory so the store is bounds-checked too: M, N and K
may be anything (odd, 0, symbolic). f16 operands stay half in threadgroup memory; bf16 ones
widen to f32 (Metal's bfloat matrices need MSL 3.1). Grid: x over N tiles, y over M tiles,
z over the batch (y and z stride when they exceed 65535).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.symbolic import sint
from ..cstyle import cexpr, store_stmt
from ..cuda.gemm import gemm_fields, supports
from .kernel import PRELUDE, dim_lines, frame
from .schedule import GemmTile, choose_tile

_MAX_GRID_YZ = 65535
_FIELDS = (("m", "M"), ("n", "N"), ("k", "K"), ("lda", "LDA"), ("ldb", "LDB"), ("ldc", "LDC"),
           ("batch", "BATCH"), ("stride_a", "SA"), ("stride_b", "SB"), ("stride_c", "SC"),
           ("a_offset", "OA"), ("b_offset", "OB"), ("c_offset", "OC"))  # fmt: skip


@dataclass
class MetalGemm:
    name: str
    source: str
    args: list[int]  # buffer ids: C, A, B (output first, like every generated kernel)
    grid: tuple[sint, sint, sint]
    block: tuple[int, int, int]
    schedule: str
    tile: GemmTile


def _c(e: sint | float) -> str:
    return cexpr(e)  # type: ignore[arg-type]


def render_gemm(
    lc: K.LibCall,
    dtypes: Mapping[int, dt.DType],
    dim_names: Sequence[str],
    tile: GemmTile | None = None,
) -> MetalGemm:
    why = supports(lc, dtypes)
    if why is not None:
        raise ValueError(f"gemm {lc.name}: cannot generate a simdgroup-matrix kernel: {why}")
    f = gemm_fields(lc)
    a_id, b_id, c_id = lc.args
    op, cdt = dtypes[a_id], dtypes[c_id]
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
    alpha, beta = float(f["alpha"]), float(f["beta"])  # type: ignore[arg-type]
    ctype = "float" if cdt is dt.f32 else "uint16_t"
    params = [f"device {ctype} *b0 [[buffer(0)]]", f"device const {glob} *b1 [[buffer(1)]]",
              f"device const {glob} *b2 [[buffer(2)]]"]  # fmt: skip
    L = [frame(lc.name, params, 3)]
    add = L.append
    add(f"  threadgroup {tt} As[{bm * bk}];  // [BM][BK]")
    add(f"  threadgroup {tt} Bs[{bk * bn}];  // [BK][BN]")
    add(f"  threadgroup float Cs[{bm * bn}];  // [BM][BN]")
    L += dim_lines(dim_names, "int64_t")
    for name, var in _FIELDS:
        add(f"  const int64_t {var} = (int64_t)({_c(f[name])});")
    add("  const int tid = (int)lm_tid.x;")
    add(f"  const int wm = (int)lm_sg / {t.sg_n}, wn = (int)lm_sg % {t.sg_n};")
    add(f"  const int64_t tiles_m = (M + {bm - 1}) / {bm};")
    add(f"  const int64_t n0 = (int64_t)lm_tg.x * {bn};")
    add("  for (int64_t bz = lm_tg.z; bz < BATCH; bz += lm_ntg.z)")
    add("  for (int64_t by = lm_tg.y; by < tiles_m; by += lm_ntg.y) {")
    add(f"    const int64_t m0 = by * {bm};")
    add(f"    device const {glob} *A = b1 + OA + bz * SA;")
    add(f"    device const {glob} *B = b2 + OB + bz * SB;")
    add(f"    device {ctype} *C = b0 + OC + bz * SC;")
    add(f"    simdgroup_float8x8 acc[{t.tm}][{t.tn}];")
    add(f"    for (int i = 0; i < {t.tm}; ++i) for (int j = 0; j < {t.tn}; ++j) "
        "acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);")  # fmt: skip
    add(f"    for (int64_t k0 = 0; k0 < K; k0 += {bk}) {{")
    # the thread-to-element map follows each operand's contiguous axis in global memory
    if f["trans_a"] == 0:  # A[m][k]
        r, c, addr = f"e / {bk}", f"e % {bk}", "(m0 + r) * LDA + k0 + c"
    else:  # A stored [k][m]
        r, c, addr = f"e % {bm}", f"e / {bm}", "(k0 + c) * LDA + m0 + r"
    add(f"      for (int e = tid; e < {bm * bk}; e += {nt}) {{ const int r = {r}, c = {c};")
    add(f"        As[r * {bk} + c] = (m0 + r < M && k0 + c < K) ? ({tt})"
        f"{conv.format(f'A[{addr}]')} : ({tt})0; }}")  # fmt: skip
    if f["trans_b"] == 0:  # B[k][n]
        r, c, addr = f"e / {bn}", f"e % {bn}", "(k0 + r) * LDB + n0 + c"
    else:  # B stored [n][k]
        r, c, addr = f"e % {bk}", f"e / {bk}", "(n0 + c) * LDB + k0 + r"
    add(f"      for (int e = tid; e < {bk * bn}; e += {nt}) {{ const int r = {r}, c = {c};")
    add(f"        Bs[r * {bn} + c] = (k0 + r < K && n0 + c < N) ? ({tt})"
        f"{conv.format(f'B[{addr}]')} : ({tt})0; }}")  # fmt: skip
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
    add("      if (r >= M || c >= N) continue;")
    add(f"      float v = Cs[e]{'' if alpha == 1.0 else f' * {alpha!r}f'};")
    if beta != 0.0:
        old = {dt.f32: "C[r * LDC + c]", dt.f16: "lm_f16_to_f32(C[r * LDC + c])",
               dt.bf16: "lm_bf16_to_f32(C[r * LDC + c])"}[cdt]  # fmt: skip
        add(f"      v += {beta!r}f * {old};")
    add("      " + store_stmt("C", "r * LDC + c", "v", cdt))
    add("    }")
    add("    threadgroup_barrier(mem_flags::mem_threadgroup);  // Cs is reused by the next tile")
    add("  }")
    add("}")
    m, n, batch = f["m"], f["n"], f["batch"]
    grid = (
        sym.ceildiv(n, bn),  # type: ignore[arg-type]
        sym.minimum(sym.ceildiv(m, bm), _MAX_GRID_YZ),  # type: ignore[arg-type]
        sym.minimum(batch, _MAX_GRID_YZ),  # type: ignore[arg-type]
    )
    source = PRELUDE + "\n".join(L) + "\n"
    return MetalGemm(lc.name, source, [c_id, a_id, b_id], grid, (nt, 1, 1),
                     f"simdgroup-{op.name}-{bm}x{bn}x{bk}", t)  # fmt: skip
