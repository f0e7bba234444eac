"""The C source every generated CPU kernel starts with (one guarded copy per translation
unit), and the helpers the C-style backends share (C, CUDA): integer division and modulo with
floor semantics, NaN-propagating max, bf16/f16/small-float conversions, a branch-free exp2."""

from __future__ import annotations

from .c_rows import ROW_HELPERS
from .c_vector import VECTOR_HELPERS

# Helpers shared by every C-style backend (C, CUDA): the backend's head defines LM_FN (the
# function qualifier), the fixed-width integer types, INFINITY/NAN, the f32 bit casts and f16.
SHARED_HELPERS = r"""
LM_FN int64_t lm_fdiv(int64_t a, int64_t b) { int64_t q = a / b; return q - ((a % b != 0) & ((a < 0) != (b < 0))); }
LM_FN int64_t lm_fmod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
LM_FN int64_t lm_min(int64_t a, int64_t b) { return a < b ? a : b; }
LM_FN int64_t lm_max(int64_t a, int64_t b) { return a > b ? a : b; }
LM_FN int64_t lm_imod(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
LM_FN float lm_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
LM_FN double lm_maxd(double a, double b) { return (a > b || a != a) ? a : b; }
LM_FN float lm_bf16_to_f32(uint16_t h) { return lm_bits_f32((uint32_t)h << 16); }
LM_FN uint16_t lm_f32_to_bf16(float f) {
  uint32_t u = lm_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* small float formats: decode by fields; encode = nearest representable, ties to even code */
LM_FN float lm_small_to_f32(uint32_t code, int eb, int mb, int bias, int fn) {
  uint32_t s = code >> (eb + mb), e = (code >> mb) & ((1u << eb) - 1), m = code & ((1u << mb) - 1);
  float v;
  if (fn == 1 && e == (1u << eb) - 1 && m == (1u << mb) - 1) return NAN; /* e4m3fn */
  if (fn == 0 && e == (1u << eb) - 1) return m ? NAN : (s ? -INFINITY : INFINITY); /* IEEE-like */
  if (e == 0) v = ldexpf((float)m, 1 - bias - mb); else v = ldexpf((float)(m | (1u << mb)), (int)e - bias - mb);
  return s ? -v : v;
}
LM_FN uint32_t lm_f32_to_small(float x, int eb, int mb, int bias, int fn) {
  uint32_t sign = signbit(x) ? 1u << (eb + mb) : 0u, n = 1u << (eb + mb), best = 0, lo = 0, hi;
  float ax = fabsf(x);
  hi = (fn == 1) ? n - 2 : (fn == 0) ? ((1u << eb) - 1) << mb : n - 1; /* largest finite code + 1 */
  if (fn == 0) hi -= 1;
  if (x != x) return fn == 2 ? n - 1 : sign | ((fn == 1) ? n - 1 : (((1u << eb) - 1) << mb) | 1u);
  if (fn != 2 && ax > lm_small_to_f32(hi, eb, mb, bias, fn)) {
    float top = lm_small_to_f32(hi, eb, mb, bias, fn), prev = lm_small_to_f32(hi - 1, eb, mb, bias, fn);
    if (ax >= top + (top - prev) * 0.5f) return fn == 1 ? sign | (n - 1) : sign | (((1u << eb) - 1) << mb);
  }
  while (lo < hi) { uint32_t mid = (lo + hi + 1) / 2; if (lm_small_to_f32(mid, eb, mb, bias, fn) <= ax) lo = mid; else hi = mid - 1; }
  best = lo;
  if (best + 1 <= ((fn == 1) ? n - 2 : n - 1)) {
    float a = lm_small_to_f32(best, eb, mb, bias, fn), b = lm_small_to_f32(best + 1, eb, mb, bias, fn);
    if (b == b && (ax - a > b - ax || (ax - a == b - ax && (best & 1)))) best += 1;
  }
  return sign | best;
}
LM_FN float lm_e8m0_to_f32(uint8_t c) { return c == 255 ? NAN : ldexpf(1.0f, (int)c - 127); }
LM_FN uint8_t lm_f32_to_e8m0(float x) {
  if (!(x > 0) || x != x) return 255;
  int e; float m = frexpf(x, &e); /* x = m * 2^e, m in [0.5, 1) */
  int k = e - 1 + (m > 0.75f ? 1 : 0) + 127;
  return (uint8_t)(k < 0 ? 0 : k > 254 ? 254 : k);
}
"""

_C_HEAD = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#define LM_FN static inline
static inline float lm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t lm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
#if defined(__F16C__)
#include <immintrin.h>
/* F16C's conversion writes its whole register; _Float16's (AVX512-FP16 vcvtsh2ss) merges into
   the old value, a false dependency that chained the iterations of quantized-weight loops */
static inline float lm_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float lm_f16_to_f32(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
#endif
static inline uint16_t lm_f32_to_f16(float f) { _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h; }
/* max(a, b) propagating NaN, without branches (the select of lm_maxf stays a branch): b when
   it is larger, NaN, or +0 against a's -0, as the larger order-preserving integer key of the
   bits would pick. A select on a compare mask: GCC makes it a compare and a blend per vector. */
static inline float lm_max2f(float a, float b) {
  uint32_t m = -(uint32_t)((b > a) | (b != b) | ((b == a) & (int)(lm_f32_bits(a) >> 31)));
  return lm_bits_f32((lm_f32_bits(b) & m) | (lm_f32_bits(a) & ~m));
}
/* the same when c is a constant, neither NaN nor -0 (>=: +0 beats -0); a NaN a stays */
static inline float lm_maxcf(float a, float c) {
  uint32_t m = -(uint32_t)(c >= a);
  return lm_bits_f32((lm_f32_bits(c) & m) | (lm_f32_bits(a) & ~m));
}
/* 2^x without branches, so loops calling it vectorize (libm's exp2f is a scalar call, 7x
   slower). x is clamped to [-151, 129] through bit masks (NaN passes); n = rint(x) by the
   1.5 * 2^23 trick, whose low bits also give n << 23; 2^x = p(x - n) * 2^n, p a degree-6
   minimax polynomial of 2^f on [-0.5, 0.5] (within 2 ulp of exp2f); 2^n is applied as two
   normal factors so results down to the subnormals round once; inf, -inf and NaN behave as
   in exp2f. About 17 vector instructions. */
static inline float lm_exp2f(float x) {
  uint32_t lo = -(uint32_t)(x < -151.0f);
  float c = lm_bits_f32((0xc3170000u & lo) | (lm_f32_bits(x) & ~lo)); /* two selects: 4 ops */
  uint32_t hi = -(uint32_t)(c > 129.0f);
  c = lm_bits_f32((0x43010000u & hi) | (lm_f32_bits(c) & ~hi));
  float t = c + 12582912.0f, n = t - 12582912.0f, f = c - n, p = 1.5353361959569156e-04f;
  p = p * f + 1.3398875016719103e-03f;
  p = p * f + 9.6184369176626200e-03f;
  p = p * f + 5.5503323674201965e-02f;
  p = p * f + 2.4022647738456726e-01f;
  p = p * f + 6.9314718246459961e-01f;
  p = p * f + 1.0f;
  uint32_t k = lm_f32_bits(t) << 23, k1 = (uint32_t)((int32_t)k >> 1) & 0xff800000u;
  return p * lm_bits_f32(k1 + 0x3f800000u) * lm_bits_f32(k - k1 + 0x3f800000u);
}
"""

PRELUDE = (
    "\n#ifndef LM_PRELUDE\n#define LM_PRELUDE"
    + _C_HEAD
    + SHARED_HELPERS
    + VECTOR_HELPERS
    + ROW_HELPERS
    + "#endif\n"
)
