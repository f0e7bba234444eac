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

VECTOR_HELPERS = r"""
/* LM_VL lanes: the compile target's native vector width (512, 256 or 128 bits). GCC splits
   wider generic vectors into native pieces badly (a modulo or a scalar operand lane by lane,
   accumulators through memory: 5x slower on an AVX2 CPU than native-width code). */
#if defined(__AVX512F__)
#define LM_VL 16
#elif defined(__AVX__)
#define LM_VL 8
#else
#define LM_VL 4
#endif
typedef float lm_f32v __attribute__((vector_size(4 * LM_VL)));
typedef int32_t lm_i32v __attribute__((vector_size(4 * LM_VL)));
typedef uint32_t lm_u32v __attribute__((vector_size(4 * LM_VL)));
static inline lm_f32v lm_vload_f32(const float *p) { lm_f32v v; memcpy(&v, p, sizeof v); return v; }
static inline lm_i32v lm_vload_i32(const int32_t *p) { lm_i32v v; memcpy(&v, p, sizeof v); return v; }
typedef uint16_t lm_u16v __attribute__((vector_size(2 * LM_VL)));
static inline lm_f32v lm_vload_bf16(const uint16_t *p) {
  lm_i32v v; for (int l = 0; l < LM_VL; ++l) v[l] = (int32_t)((uint32_t)p[l] << 16);
  return (lm_f32v)v;
}
/* each lane's bf16 bits as lm_f32_to_bf16 gives them (nearest even, a NaN kept a quiet NaN),
   in integer lanes: the same bits as the scalar loop, where vcvtneps2bf16 would flush
   subnormals */
static inline lm_u32v lm_vbf16_bits(lm_f32v v) {
  lm_u32v u = (lm_u32v)v;
  lm_u32v nan = (lm_u32v)((u & 0x7fffffffu) > 0x7f800000u);
  lm_u32v r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (((u >> 16) | 0x40u) & nan) | (r & ~nan);
}
static inline lm_f32v lm_vround_bf16(lm_f32v v) { return (lm_f32v)(lm_vbf16_bits(v) << 16); }
static inline void lm_vstore_bf16(uint16_t *p, lm_f32v v) {
  lm_u16v h = __builtin_convertvector(lm_vbf16_bits(v), lm_u16v);
  memcpy(p, &h, sizeof h);
}
/* f16 lanes by the C conversion the scalar lm_f32_to_f16 makes (vcvtps2ph where the CPU has
   it): the same bits */
typedef _Float16 lm_h16v __attribute__((vector_size(2 * LM_VL)));
static inline lm_f32v lm_vround_f16(lm_f32v v) {
  return __builtin_convertvector(__builtin_convertvector(v, lm_h16v), lm_f32v);
}
static inline void lm_vstore_f16(uint16_t *p, lm_f32v v) {
  lm_h16v h = __builtin_convertvector(v, lm_h16v);
  memcpy(p, &h, sizeof h);
}
#if defined(__AVX512F__)
#include <immintrin.h>
/* one widening load each; __builtin_convertvector from a byte vector is extracted byte by byte
   by GCC 12 */
static inline lm_i32v lm_vload_u8(const uint8_t *p) { return (lm_i32v)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline lm_i32v lm_vload_i8(const int8_t *p) { return (lm_i32v)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline lm_i32v lm_vload_u16(const uint16_t *p) { return (lm_i32v)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)); }
static inline lm_i32v lm_vload_i16(const int16_t *p) { return (lm_i32v)_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)p)); }
static inline lm_f32v lm_vload_f16(const uint16_t *p) { return (lm_f32v)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline float lm_vsum_f32(lm_f32v v) { return _mm512_reduce_add_ps((__m512)v); }
/* 2^x of each lane, lm_exp2f's polynomial and results (NaN and the infinities included) in 9-11
   instructions where GCC's vectorized lm_exp2f takes 22: x clamped by min/max (each returns its
   second operand when one is NaN, so NaN passes), n = rint(x) by vrndscaleps, and p * 2^n by
   vscalefps, which rounds a subnormal result once. Loops of exp-heavy bodies (softmax's
   exponentials, GELU, SiLU) run in this form (vector_loop). */
static inline lm_f32v lm_vexp2f(lm_f32v v) {
#if defined(__AVX512DQ__)
  /* f = x - rint(x) in one vreduceps and n = x - f (exact), no clamps: vreduceps gives 0 for
     +-inf (n stays +-inf) and NaN for NaN, and vscalefps saturates to inf or 0 past the range;
     the same bits as the clamped form everywhere, 9 instructions (12% faster, measured) */
  __m512 x = (__m512)v;
  __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 n = _mm512_sub_ps(x, f);
#else
  __m512 x = _mm512_min_ps(_mm512_set1_ps(130.0f), _mm512_max_ps(_mm512_set1_ps(-160.0f), (__m512)v));
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
#endif
  __m512 p = _mm512_set1_ps(LM_EXP2_C6);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C5));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return (lm_f32v)_mm512_scalef_ps(p, n);
}
static inline lm_f32v lm_vsqrtf(lm_f32v v) { return (lm_f32v)_mm512_sqrt_ps((__m512)v); }
#if defined(__AVX512DQ__)
#define LM_VMAX 1
/* a float max that orders -0 below +0 and passes over NaN (vrangeps: 1 instruction where the
   integer-key form takes 8), with NaN flagged apart; folded into the scalar key and flag of
   the loop's rest (cstyle's _max_f32) */
static inline lm_f32v lm_vmaxf(lm_f32v m, lm_f32v x) { return (lm_f32v)_mm512_range_ps((__m512)m, (__m512)x, 0x05); }
static inline int32_t lm_vnanmask(lm_f32v x) { return (int32_t)_mm512_cmp_ps_mask((__m512)x, (__m512)x, _CMP_UNORD_Q); }
#endif
/* stores a vector of an output run and returns the elements stored. Streamed (no read for
   ownership) when the kernel streams its output: from an address off a 64-byte boundary (a
   caller's numpy array is 16-byte aligned) only the lanes before the boundary are stored,
   plainly, so every later vector streams whole lines and no line is written both ways */
static inline int64_t lm_vstore_out(float *p, lm_f32v v, int nt) {
  const uintptr_t off = (uintptr_t)p & 63;
  if (!nt || (off & 3)) {
    memcpy(p, &v, sizeof v);
    return LM_VL;
  }
  if (!off) {
    _mm512_stream_ps(p, (__m512)v);
    return LM_VL;
  }
  const int64_t head = (int64_t)((64 - off) >> 2);
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << head) - 1), (__m512)v);
  return head;
}
#define LM_VEXP2 1
/* tab[idx] per lane, tab a table of n <= 256 floats (n a multiple of 16, every idx in
   [0, n)): one permute for 16 entries, two-source permutes of 32 then blends on the index's
   higher bits. Zen's gather instruction loads lane by lane, slower than GCC's scalar loads
   (measured); this takes 1 instruction per 16 values from a 16-entry table (9x faster) and
   15 from a 256-entry one (1.7x). Inlined always, so the table stays in registers. */
#define LM_VLUT 1
static inline __attribute__((always_inline)) lm_f32v lm_vlut_f32(const float *tab, int n, lm_i32v idx) {
  const __m512i i = (__m512i)idx;
  if (n <= 16) return (lm_f32v)_mm512_permutexvar_ps(i, _mm512_loadu_ps(tab));
  __m512 r[8];
  const int m = (n + 31) / 32;
  for (int j = 0; j < m; ++j)
    r[j] = _mm512_permutex2var_ps(_mm512_loadu_ps(tab + 32 * j), i, _mm512_loadu_ps(tab + 32 * j + 16));
  for (int b = 32, w = m; w > 1; b *= 2, w = (w + 1) / 2) {
    const __mmask16 hi = _mm512_test_epi32_mask(i, _mm512_set1_epi32(b));
    for (int j = 0; j < w / 2; ++j) r[j] = _mm512_mask_blend_ps(hi, r[2 * j], r[2 * j + 1]);
    if (w & 1) r[w / 2] = r[w - 1];
  }
  return (lm_f32v)r[0];
}
#elif defined(__AVX2__)
#include <immintrin.h>
static inline lm_i32v lm_vload_u8(const uint8_t *p) { return (lm_i32v)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline lm_i32v lm_vload_i8(const int8_t *p) { return (lm_i32v)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline lm_i32v lm_vload_u16(const uint16_t *p) { return (lm_i32v)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline lm_i32v lm_vload_i16(const int16_t *p) { return (lm_i32v)_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)p)); }
#if defined(__F16C__)
static inline lm_f32v lm_vload_f16(const uint16_t *p) { return (lm_f32v)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#else
static inline lm_f32v lm_vload_f16(const uint16_t *p) { lm_f32v v; for (int l = 0; l < LM_VL; ++l) v[l] = lm_f16_to_f32(p[l]); return v; }
#endif
static inline float lm_vsum_f32(lm_f32v v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}
#endif
#if !defined(LM_VEXP2)
/* without AVX-512 the vector loops keep GCC's own vectorization of the scalar functions */
static inline lm_f32v lm_vexp2f(lm_f32v v) { lm_f32v r; for (int l = 0; l < LM_VL; ++l) r[l] = lm_exp2f(v[l]); return r; }
static inline lm_f32v lm_vsqrtf(lm_f32v v) { lm_f32v r; for (int l = 0; l < LM_VL; ++l) r[l] = sqrtf(v[l]); return r; }
static inline int64_t lm_vstore_out(float *p, lm_f32v v, int nt) { (void)nt; memcpy(p, &v, sizeof v); return LM_VL; }
#endif
#if !defined(LM_VLUT)
static inline lm_f32v lm_vlut_f32(const float *tab, int n, lm_i32v idx) {
  lm_f32v v; (void)n; for (int l = 0; l < LM_VL; ++l) v[l] = tab[idx[l]]; return v;
}
#endif
#if !defined(LM_VMAX)
/* lanes' maxima on order-preserving integer keys (as cstyle's scalar _max_f32) */
static inline lm_f32v lm_vmaxf(lm_f32v m, lm_f32v x) {
  for (int l = 0; l < LM_VL; ++l) {
    const uint32_t a = lm_f32_bits(m[l]), b = lm_f32_bits(x[l]);
    const int32_t ka = (int32_t)(a ^ ((uint32_t)((int32_t)a >> 31) >> 1));
    const int32_t kb = (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) >> 1));
    m[l] = kb > ka && x[l] == x[l] ? x[l] : m[l];
  }
  return m;
}
static inline int32_t lm_vnanmask(lm_f32v x) {
  int32_t n = 0;
  for (int l = 0; l < LM_VL; ++l) n |= x[l] != x[l];
  return n;
}
#endif
static inline lm_f32v lm_vsplatf(float x) { lm_f32v v; for (int l = 0; l < LM_VL; ++l) v[l] = x; return v; }
static inline lm_i32v lm_vsplati(int32_t x) { lm_i32v v; for (int l = 0; l < LM_VL; ++l) v[l] = x; return v; }
/* lanes 0..n-1 of v stored to p (n < LM_VL: a row's last columns) */
static inline void lm_vstore_f32_lanes(float *p, lm_f32v v, int64_t n) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#else
  for (int64_t l = 0; l < n; ++l) p[l] = v[l];
#endif
}
/* p[0], p[2], .. p[2 * (LM_VL - 1)] with only lanes lo..hi-1 read (clamped to the vector),
   zeros in the others: a stride-2 conv's taps along a row. Two loads and one two-source
   permute under AVX-512 */
static inline lm_f32v lm_vload_f32_s2_lanes(const float *p, int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > LM_VL ? LM_VL : hi;
  if (hi <= lo) return lm_vsplatf(0.0f);
#if defined(__AVX512F__)
  const uint32_t lanes = ((1u << hi) - 1) & ~((1u << lo) - 1);
  uint32_t even = 0x55555555u; /* element 2l of the 32 for each lane l */
  if (lanes != 0xffffu) {
#if defined(__BMI2__)
    even = _pdep_u32(lanes, 0x55555555u);
#else
    even = 0;
    for (int l = 0; l < 16; ++l) even |= ((lanes >> l) & 1u) << (2 * l);
#endif
  }
  const __m512 a = _mm512_maskz_loadu_ps((__mmask16)(even & 0xffffu), p);
  const __m512 b = _mm512_maskz_loadu_ps((__mmask16)(even >> 16), p + 16);
  const __m512i idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return (lm_f32v)_mm512_permutex2var_ps(a, idx, b);
#else
  lm_f32v v = lm_vsplatf(0.0f);
  for (int64_t l = lo; l < hi; ++l) v[l] = p[2 * l];
  return v;
#endif
}
/* p[0..LM_VL) with only lanes lo..hi-1 read (clamped to the vector), zeros in the others: a
   padded window's edge, where the other lanes' addresses lie outside the input */
static inline lm_f32v lm_vload_f32_lanes(const float *p, int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > LM_VL ? LM_VL : hi;
  if (lo == 0 && hi == LM_VL) return lm_vload_f32(p);
  if (hi <= lo) return lm_vsplatf(0.0f);
#if defined(__AVX512F__)
  return (lm_f32v)_mm512_maskz_loadu_ps((__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1)), p);
#else
  lm_f32v v = lm_vsplatf(0.0f);
  for (int64_t l = lo; l < hi; ++l) v[l] = p[l];
  return v;
#endif
}
/* lm_max2f lane by lane (NaN propagates, +0 beats -0): three compares and a blend */
static inline lm_f32v lm_vmax2f(lm_f32v a, lm_f32v b) {
  const lm_i32v ai = (lm_i32v)a, bi = (lm_i32v)b;
  const lm_i32v m = (b > a) | (b != b) | ((b == a) & (ai >> 31));
  return (lm_f32v)((bi & m) | (ai & ~m));
}
static inline void lm_vmax_fold(lm_f32v m, int32_t nm, int32_t *key, int32_t *nan) {
  for (int l = 0; l < LM_VL; ++l) {
    const uint32_t b = lm_f32_bits(m[l]);
    const int32_t k = (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) >> 1));
    *key = k > *key ? k : *key;
  }
  *nan |= nm != 0;
}
#if defined(__AVX512F__) || defined(__AVX2__)
#else
static inline lm_i32v lm_vload_u8(const uint8_t *p) { lm_i32v v; for (int l = 0; l < LM_VL; ++l) v[l] = p[l]; return v; }
static inline lm_i32v lm_vload_i8(const int8_t *p) { lm_i32v v; for (int l = 0; l < LM_VL; ++l) v[l] = p[l]; return v; }
static inline lm_i32v lm_vload_u16(const uint16_t *p) { lm_i32v v; for (int l = 0; l < LM_VL; ++l) v[l] = p[l]; return v; }
static inline lm_i32v lm_vload_i16(const int16_t *p) { lm_i32v v; for (int l = 0; l < LM_VL; ++l) v[l] = p[l]; return v; }
static inline lm_f32v lm_vload_f16(const uint16_t *p) { lm_f32v v; for (int l = 0; l < LM_VL; ++l) v[l] = lm_f16_to_f32(p[l]); return v; }
static inline float lm_vsum_f32(lm_f32v v) {
  for (int w = LM_VL / 2; w >= 1; w /= 2) for (int l = 0; l < w; ++l) v[l] += v[l + w];
  return v[0];
}
#endif
"""

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


class _Vec:
    def __init__(
        self,
        em: Emitter,
        ri: sym.Expr,
        ind: str,
        over: dict[K.Value, str] | None = None,
        lanes: str | None = None,
    ) -> None:
        self.em, self.ri, self.ind = em, ri, ind
        # a C expression: only this many lanes exist (a row's last columns), the loads of
        # the others are not made
        self.lanes = lanes
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
                return load_expr(ptr, cexpr(v.index), v.dtype), "s"
            if _step(v.index, self.ri) == 2 and v.dtype is dt.f32:  # a stride-2 conv's taps
                n = self.lanes or "LM_VL"
                return f"lm_vload_f32_s2_lanes(&{ptr}[{cexpr(v.index)}], 0, {n})", "f"
            if _step(v.index, self.ri) != 1:
                raise _Unsupported
            if self.lanes is not None:
                if v.dtype is not dt.f32:
                    raise _Unsupported
                return f"lm_vload_f32_lanes(&{ptr}[{cexpr(v.index)}], 0, {self.lanes})", "f"
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
        raise _Unsupported

    def _padded_load(self, v: K.Load, ptr: str) -> str:
        """An f32 load zero outside a padding mask (a product of comparisons): the mask's
        comparisons of the lanes' variable ``x`` (``c*x + r < 0``) bound the lanes read, the
        rest is one test for all lanes (a padded conv's taps: the row in range, the columns a
        window of lanes). Unit-stride in ``x``, or stride 2 (a strided conv's taps)."""
        from ..cstyle import _c_name, cexpr

        x = self.ri
        if not isinstance(v.index, sym.Expr) or x not in v.index.vars():
            raise _Unsupported  # the same for every lane: the scalar form broadcasts it
        stride = _step(v.index, x)
        if stride not in (1, 2) or not isinstance(v.valid, sym.Expr):
            raise _Unsupported
        at = _c_name(x)  # the first lane's index
        lo, hi, rest = "0", self.lanes or "LM_VL", []
        for f in sym._factors(v.valid):
            if x not in f.vars():
                rest.append(f"({cexpr(f)})")
                continue
            if f.kind != sym.LT:
                raise _Unsupported
            a, b = f.args
            terms, const = sym._lin(sym.add(a, sym.mul(b, -1)))  # c*x + r < 0
            c = terms.pop(x, 0)
            if c == 0 or any(x in t.vars() for t in terms):
                raise _Unsupported
            r = cexpr(sym._from_lin(terms, const))
            if c == 1:  # lane < -r - at
                hi = f"lm_min({hi}, -({r}) - {at})"
            elif c == -1:  # lane > r - at
                lo = f"lm_max({lo}, ({r}) - {at} + 1)"
            elif c > 0:  # x < ceil(-r / c)
                hi = f"lm_min({hi}, lm_fdiv(-({r}) - 1, {c}) + 1 - {at})"
            else:  # x > r / -c
                lo = f"lm_max({lo}, lm_fdiv({r}, {-c}) + 1 - {at})"
        if rest:
            hi = f"({' && '.join(rest)}) ? {hi} : 0"
        load = "lm_vload_f32_lanes" if stride == 1 else "lm_vload_f32_s2_lanes"
        return f"{load}(&{ptr}[{cexpr(v.index)}], {lo}, {hi})"

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
        inner = _Vec(self.em, self.ri, self.ind + "  ", lanes=self.lanes)
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
    if sym.upper_bound(var) + 1 < BLOCK_LANES:
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
    """Whether ``value`` holds a float sum (more than a few terms) that a vector along the
    output variable ``var`` computes with plain loads where one along its own variable would
    gather: every load varying with the summed variable is unit-stride in ``var`` or does not
    depend on it, and one that depends on ``var`` is not unit-stride in the summed variable (a
    column sum, a mean over an outer axis, a channel norm of an NCHW tensor) or the sum is
    shorter than a vector (a conv's taps along a row: lanes of the summed axis would be mostly
    idle). Stride 2 in ``var`` counts as plain (a stride-2 conv: two loads and a permute)."""
    for r in K.walk(value):
        if not (isinstance(r, K.Reduce) and r.op is Op.SUM_REDUCE and r.dtype is dt.f32):
            continue
        nested = any(isinstance(y, K.Reduce) for y in K.walk(r.body))
        if isinstance(r.extent, int) and r.extent <= 4 and not nested:
            continue  # a few terms, written out (a 3x3 conv's taps count as 9)
        loads = [x for x in K.walk(r.body) if isinstance(x, K.Load)]
        varying = [x for x in loads if isinstance(x.index, sym.Expr) and r.var in x.index.vars()]
        lanes = [x for x in varying if isinstance(x.index, sym.Expr) and var in x.index.vars()]
        short = isinstance(r.extent, int) and r.extent < BLOCK_LANES
        if (
            lanes
            and all(_step(x.index, var) in (1, 2) for x in lanes)
            and (short or any(_step(x.index, r.var) != 1 for x in lanes))
        ):
            return True
    return False


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
