"""The helpers every C-style backend's kernels share (C, CUDA): integer division and modulo
with floor semantics, NaN-propagating max, bf16/f16/small-float conversions, a branch-free
exp2. Each backend's kernel renderer puts them after a head of its own."""

from __future__ import annotations

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
