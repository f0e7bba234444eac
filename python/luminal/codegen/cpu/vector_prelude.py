"""The C helpers of the explicit vector form (``vector.py``): native-width vector types
(``LM_VL`` lanes), widening and lane-limited loads, stores, ``exp2``, max and table lookups,
with AVX-512 and AVX2 forms and portable fallbacks. Part of every CPU kernel's prelude."""

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
/* a streamed run in two loops: a head loop of at most one lm_vstore_out up to the first
   64-byte boundary, then whole vectors by lm_vstore_s, whose address needs no test: one loop
   of lm_vstore_out, its step known only at run time, cost a softmax row's store pass 0.1 us
   of 1.4 (4096 wide, 1 thread). lm_stream_ok: whether the run at p streams at all (a float
   address off a 4-byte boundary never does); lm_stream_head: where the head loop ends */
static inline int lm_stream_ok(const float *p, int nt) { return nt && !((uintptr_t)p & 3); }
static inline int64_t lm_stream_head(const float *p, int s, int64_t lo, int64_t hi) {
  return s && ((uintptr_t)p & 63) && hi - lo >= LM_VL ? lo + LM_VL : lo;
}
static inline void lm_vstore_s(float *p, lm_f32v v, int s) {
  if (s) _mm512_stream_ps(p, (__m512)v);
  else memcpy(p, &v, sizeof v);
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
static inline int lm_stream_ok(const float *p, int nt) { (void)p; (void)nt; return 0; }
static inline int64_t lm_stream_head(const float *p, int s, int64_t lo, int64_t hi) { (void)p; (void)s; (void)hi; return lo; }
static inline void lm_vstore_s(float *p, lm_f32v v, int s) { (void)s; memcpy(p, &v, sizeof v); }
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
/* p[0], p[s], .. p[s * (LM_VL - 1)] with only lanes lo..hi-1 read (clamped to the vector),
   zeros in the others: a channels-last conv's taps along a row, one masked gather */
static inline lm_f32v lm_vload_f32_strided_lanes(const float *p, int64_t s, int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > LM_VL ? LM_VL : hi;
  if (hi <= lo) return lm_vsplatf(0.0f);
#if defined(__AVX512F__)
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32((int32_t)s));
  const __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
  return (lm_f32v)_mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, p, 4);
#else
  lm_f32v v = lm_vsplatf(0.0f);
  for (int64_t l = lo; l < hi; ++l) v[l] = p[s * l];
  return v;
#endif
}
/* v with the lanes outside lo..hi-1 (clamped to the vector) zero: a padding mask's window */
static inline lm_f32v lm_vwindow_f32(lm_f32v v, int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > LM_VL ? LM_VL : hi;
  if (lo == 0 && hi == LM_VL) return v;
  lm_i32v l;
  for (int k = 0; k < LM_VL; ++k) l[k] = k;
  return (lm_f32v)((lm_i32v)v & ((l >= (int32_t)lo) & (l < (int32_t)hi)));
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
