"""A ``gemm`` library call rendered as a generated tensor-core CUDA kernel (mma.sync, inline PTX).

The descriptor, the tile loops and the epilogue are the shared GPU gemm's
(``codegen/gpu/gemm.py``). The operand dtypes come from the buffers: f32 operands use ``mma.m16n8k8`` on TF32 with the
three-pass split (big*big + big*small + small*big), which keeps f32 accuracy; f16 and bf16
operands use ``mma.m16n8k16`` with f32 accumulation. C may be f32, f16 or bf16.

Schedule: a block computes a BM x BN tile of C with WARPS_M x WARPS_N warps, each warp
TM x TN mma tiles (16 x 8). A and B tiles of BK along k go global -> registers -> shared
memory (two buffers, so the next tile loads while this one multiplies); shared rows are
padded so that the fragment reads of a warp hit 32 different banks. Every global read and
write is bounds-checked.

The mma helpers live in ``MMA_HELPERS`` so that tests can swap in a host emulation of the
PTX fragment layouts (tests/test_cuda_gemm.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.symbolic import sint
from ..gpu import gemm as G
from ..gpu.gemm import OPERAND_DTYPES, OUTPUT_DTYPES, gemm_fields, supports
from ..gpu.kernel import Rendered, dim_lines
from .dialect import CUDA

__all__ = ["MMA_HELPERS", "OPERAND_DTYPES", "OUTPUT_DTYPES", "GemmConfig", "GemmKernel",
           "choose_config", "gemm_fields", "render_gemm", "supports"]  # fmt: skip

MMA_HELPERS = r"""
#ifndef LM_MMA
#define LM_MMA
LM_FN uint32_t lm_tf32(float x) {
  uint32_t r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
LM_FN void lm_mma_tf32(float *d, const uint32_t *a, const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
LM_FN void lm_mma_f16(float *d, const uint32_t *a, const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
LM_FN void lm_mma_bf16(float *d, const uint32_t *a, const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
"""


@dataclass(frozen=True)
class GemmConfig:
    warps_m: int
    warps_n: int
    tm: int  # 16-row mma tiles per warp
    tn: int  # 8-column mma tiles per warp
    bk: int  # k per shared-memory tile

    @property
    def bm(self) -> int:
        return self.warps_m * self.tm * 16

    @property
    def bn(self) -> int:
        return self.warps_n * self.tn * 8

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


def choose_config(fields: Mapping[str, sint | float], operand: dt.DType) -> GemmConfig:
    """Tile shape from the largest M the plan allows: small M (decode) gets short, wide tiles
    so more of N is spread over blocks; otherwise 128 x 128 tiles."""
    bk = 16
    m_hi = sym.upper_bound(fields["m"])  # type: ignore[arg-type]
    if m_hi <= 64:
        return GemmConfig(1, 4, max(1, -(-m_hi // 16)), 2, bk)
    return GemmConfig(2, 4, 4, 4, bk)


GemmKernel = Rendered  # its args are C, A, B (output first, like every generated kernel)


def render_gemm(
    lc: K.LibCall,
    dtypes: Mapping[int, dt.DType],
    dim_names: Sequence[str],
    prelude: str,
    config: GemmConfig | None = None,
) -> GemmKernel:
    """CUDA C for one gemm call (``prelude`` is the CUDA prelude of codegen/cuda.py)."""
    g = G.prepare(lc, dtypes, "tensor-core")
    f, op, cdt, alpha, beta = g.fields, g.operand, g.out, g.alpha, g.beta
    cfg = config or choose_config(f, op)
    f32 = op is dt.f32
    kstep = 8 if f32 else 16
    if cfg.bk % kstep or (cfg.bm * cfg.bk) % cfg.threads or (cfg.bn * cfg.bk) % cfg.threads:
        raise ValueError(f"gemm tile config {cfg} does not divide evenly")
    st = "float" if f32 else "uint16_t"  # shared/staging element type (raw bits for 16-bit)
    pad = 4 if f32 else 8  # keeps fragment reads conflict-free and 16-bit pairs 4-byte aligned
    ld_s = cfg.bk + pad
    la, lb = cfg.bm * cfg.bk // cfg.threads, cfg.bn * cfg.bk // cfg.threads
    ctype = {dt.f32: "float", dt.f16: "uint16_t", dt.bf16: "uint16_t"}[cdt]
    params = [CUDA.param(0, ctype, True), CUDA.param(1, st, True), CUDA.param(2, st, True)]
    L = [CUDA.frame(lc.name, params, len(dim_names), cfg.threads),
         *dim_lines(CUDA, dim_names, "int64_t"), *G.field_lines(f)]  # fmt: skip
    add = L.append
    add(f"  __shared__ __align__(16) {st} As[2][{cfg.bm}][{ld_s}];")
    add(f"  __shared__ __align__(16) {st} Bs[2][{cfg.bn}][{ld_s}];")
    add("  const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;")
    add(f"  const int wm = warp / {cfg.warps_n}, wn = warp % {cfg.warps_n};")
    add("  const int g = lane >> 2, t = lane & 3;")
    add(f"  const int64_t KT = (K + {cfg.bk - 1}) / {cfg.bk};")
    L += G.tile_loops(CUDA, cfg.bm, cfg.bn, st, ctype)
    add(f"    float acc[{cfg.tm}][{cfg.tn}][4];")
    add(f"    for (int i = 0; i < {cfg.tm}; ++i) for (int j = 0; j < {cfg.tn}; ++j)"
        " for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;")  # fmt: skip
    add(f"    {st} ra[{la}], rb[{lb}];")
    zero = "0.0f" if f32 else "(uint16_t)0"

    # global -> registers for k tile `kt`; the thread-to-element map follows the operand's
    # contiguous axis so neighbouring threads read neighbouring addresses
    def load(kt: str) -> list[str]:
        out = [f"      const int64_t k0 = ({kt}) * {cfg.bk};"]
        for x, reg, n in (("A", "ra", la), ("B", "rb", lb)):
            r, c, ok, addr = G.operand_map(f, x, cfg.bm if x == "A" else cfg.bn, cfg.bk)
            out += ["#pragma unroll", f"      for (int i = 0; i < {n}; ++i) {{",
                    f"        const int e = tid + i * {cfg.threads}, r = {r}, c = {c};",
                    f"        {reg}[i] = ({ok}) ? {x}[{addr}] : {zero};",
                    "      }"]  # fmt: skip
        return out

    def store(buf: str) -> list[str]:
        out = []
        for x, reg, n in (("A", "ra", la), ("B", "rb", lb)):
            r, c, _, _ = G.operand_map(f, x, cfg.bm if x == "A" else cfg.bn, cfg.bk)
            out += ["#pragma unroll",
                    f"      for (int i = 0; i < {n}; ++i) {{ const int e = tid + i * {cfg.threads}; "
                    f"{x}s[{buf}][{r}][{c}] = {reg}[i]; }}"]  # fmt: skip
        return out

    add("    {")
    L += load("0")
    L += store("0")
    add("    }")
    add("    __syncthreads();")
    add("    for (int64_t kt = 0; kt < KT; ++kt) {")
    add("      const int cur = (int)(kt & 1);")
    add("      if (kt + 1 < KT) {")
    L += ["  " + x for x in load("kt + 1")]
    add("      }")
    add(f"      const int rb0 = wm * {cfg.tm * 16}, cb0 = wn * {cfg.tn * 8};")
    add("#pragma unroll")
    add(f"      for (int kk = 0; kk < {cfg.bk}; kk += {kstep}) {{")
    if f32:
        add(f"        uint32_t ah[{cfg.tm}][4], al[{cfg.tm}][4], bh[{cfg.tn}][2], bl[{cfg.tn}][2];")
        add("#pragma unroll")
        add(f"        for (int i = 0; i < {cfg.tm}; ++i) {{")
        add("          const int r = rb0 + i * 16 + g;")
        add(
            "          const float x[4] = {As[cur][r][kk + t], As[cur][r + 8][kk + t], "
            "As[cur][r][kk + t + 4], As[cur][r + 8][kk + t + 4]};"
        )
        add(
            "          for (int q = 0; q < 4; ++q) { ah[i][q] = lm_tf32(x[q]); "
            "al[i][q] = lm_tf32(x[q] - __uint_as_float(ah[i][q])); }"
        )
        add("        }")
        add("#pragma unroll")
        add(f"        for (int j = 0; j < {cfg.tn}; ++j) {{")
        add("          const int c = cb0 + j * 8 + g;")
        add("          const float y[2] = {Bs[cur][c][kk + t], Bs[cur][c][kk + t + 4]};")
        add(
            "          for (int q = 0; q < 2; ++q) { bh[j][q] = lm_tf32(y[q]); "
            "bl[j][q] = lm_tf32(y[q] - __uint_as_float(bh[j][q])); }"
        )
        add("        }")
        add("#pragma unroll")
        add(f"        for (int i = 0; i < {cfg.tm}; ++i)")
        add("#pragma unroll")
        add(f"          for (int j = 0; j < {cfg.tn}; ++j) {{")
        # small terms first: they are the least significant
        add("            lm_mma_tf32(acc[i][j], al[i], bh[j]);")
        add("            lm_mma_tf32(acc[i][j], ah[i], bl[j]);")
        add("            lm_mma_tf32(acc[i][j], ah[i], bh[j]);")
        add("          }")
    else:
        mma = "lm_mma_f16" if op is dt.f16 else "lm_mma_bf16"
        add(f"        uint32_t af[{cfg.tm}][4], bf[{cfg.tn}][2];")
        add("#pragma unroll")
        add(f"        for (int i = 0; i < {cfg.tm}; ++i) {{")
        add("          const int r = rb0 + i * 16 + g;")
        add("          af[i][0] = *(const uint32_t *)&As[cur][r][kk + 2 * t];")
        add("          af[i][1] = *(const uint32_t *)&As[cur][r + 8][kk + 2 * t];")
        add("          af[i][2] = *(const uint32_t *)&As[cur][r][kk + 2 * t + 8];")
        add("          af[i][3] = *(const uint32_t *)&As[cur][r + 8][kk + 2 * t + 8];")
        add("        }")
        add("#pragma unroll")
        add(f"        for (int j = 0; j < {cfg.tn}; ++j) {{")
        add("          const int c = cb0 + j * 8 + g;")
        add("          bf[j][0] = *(const uint32_t *)&Bs[cur][c][kk + 2 * t];")
        add("          bf[j][1] = *(const uint32_t *)&Bs[cur][c][kk + 2 * t + 8];")
        add("        }")
        add("#pragma unroll")
        add(f"        for (int i = 0; i < {cfg.tm}; ++i)")
        add("#pragma unroll")
        add(f"          for (int j = 0; j < {cfg.tn}; ++j) {mma}(acc[i][j], af[i], bf[j]);")
    add("      }")
    add("      if (kt + 1 < KT) {")
    L += ["  " + x for x in store("cur ^ 1")]
    add("      }")
    add("      __syncthreads();")
    add("    }")
    # epilogue: accumulator q of tile (i, j) is row g + 8 * (q >> 1), column 2t + (q & 1)
    add("#pragma unroll")
    add(f"    for (int i = 0; i < {cfg.tm}; ++i)")
    add("#pragma unroll")
    add(f"      for (int j = 0; j < {cfg.tn}; ++j)")
    add("#pragma unroll")
    add("        for (int q = 0; q < 4; ++q) {")
    add(f"          const int64_t r = m0 + wm * {cfg.tm * 16} + i * 16 + g + (q >> 1) * 8;")
    add(f"          const int64_t c = n0 + wn * {cfg.tn * 8} + j * 8 + 2 * t + (q & 1);")
    L += G.epilogue("acc[i][j][q]", alpha, beta, cdt, "          ")
    add("        }")
    add("  }")
    add("}")
    source = prelude + MMA_HELPERS + "\n".join(L) + "\n"
    return Rendered(
        lc.name,
        source,
        [g.c, g.a, g.b],
        G.grid(f, cfg.bm, cfg.bn),
        (cfg.threads, 1, 1),
        f"mma-{op.name}-{cfg.bm}x{cfg.bn}x{cfg.bk}",
    )
