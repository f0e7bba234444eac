"""Cheaper exp2 and reciprocal forms against the ones the CPU kernels ship (issue 21): each
form's largest error against f64 on a sweep of floats, and its cost per vector in three loop
bodies with data in L1 (so memory does not hide it): exp2 alone, softmax's exponential pass
(``2^((x - m) log2 e)`` stored and summed) and the GELU chain (``z / (1 + 2^(-2.30 (z +
0.044715 z^3)))`` with ``z = x a + b``, times ``c``). AVX-512 only (the shipped vector forms'
target). Results are in docs/cpu-kernels.md.

    python tools/transcendental_forms.py             # sweep step 8 bit patterns: ~1 minute
    python tools/transcendental_forms.py --step 1    # every float

Forms: ``exp2`` the shipped ``lm_vexp2f`` (vreduceps, degree-6 polynomial, vscalefps),
``exp2_rndscale`` the same with vrndscaleps and clamps (its AVX-512F branch, the same bits),
``exp2_deg5`` a degree-5 minimax polynomial (one FMA less); ``div`` the IEEE division
(vdivps, ``div`` below), ``rcp_nr`` vrcp14ps refined by one Newton step, NaN-free at 0 and infinity.
Compiled with the kernels' flags (``cc``, or ``$CC``); prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tempfile

# 2^f on [-0.5, 0.5], constant term 1: minimax in relative error (iteratively reweighted
# least squares on Chebyshev nodes), 1.53 * 2^-24 before rounding
DEG5 = (0.6931470036506653, 0.24022242426872253, 0.05550733581185341, 0.009671512991189957,
        0.001326472731307149)  # fmt: skip

_FORMS = r"""
static inline lm_f32v exp2_rndscale(lm_f32v v) {
  __m512 x = _mm512_max_ps(_mm512_set1_ps(-160.0f), (__m512)v);
  x = _mm512_min_ps(_mm512_set1_ps(130.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n), p = _mm512_set1_ps(LM_EXP2_C6);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C5));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM_EXP2_C1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return (lm_f32v)_mm512_scalef_ps(p, n);
}
static inline lm_f32v exp2_deg5(lm_f32v v) {
  __m512 x = (__m512)v;
  __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 n = _mm512_sub_ps(x, f), p = _mm512_set1_ps(D5_5);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(D5_4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(D5_3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(D5_2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(D5_1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return (lm_f32v)_mm512_scalef_ps(p, n);
}
static inline lm_f32v rcp_div(lm_f32v d) { return 1.0f / d; }
/* e = 1 - d r is NaN only where r is 0 or infinite (d infinite, zero or tiny): r kept there */
static inline lm_f32v rcp_nr(lm_f32v d) {
  __m512 x = (__m512)d, r = _mm512_rcp14_ps(x);
  __m512 e = _mm512_fnmadd_ps(x, r, _mm512_set1_ps(1.0f));
  return (lm_f32v)_mm512_mask_fmadd_ps(r, _mm512_cmp_ps_mask(e, e, _CMP_ORD_Q), e, r);
}
static inline lm_f32v exp2_cur(lm_f32v v) { return lm_vexp2f(v); }
"""

_DRIVER = r"""
#include <stdio.h>
#include <time.h>
static double ulp_err(float y, double ref) {
  if (isnan(ref)) return isnan(y) ? 0 : 1e9;
  if (fabs(ref) >= 0x1.ffffffp127) ref = ref > 0 ? INFINITY : -INFINITY; /* rounds to inf */
  if (isinf(ref)) return (isinf(y) && (y > 0) == (ref > 0)) ? 0 : 1e9;
  const float r = (float)ref;
  double u = (double)nextafterf(fabsf(r), INFINITY) - fabsf(r);
  if (fabsf(r) < 1.1754943508222875e-38f) u = 1.401298464324817e-45;
  return fabs((double)y - ref) / u;
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
#define N 4096
static float X[N] __attribute__((aligned(64))), A[N], B[N], C[N], Y[N] __attribute__((aligned(64)));
static float sink;
#define EXP_ONLY(E, R) for (int i = 0; i < N; i += LM_VL) { \
  lm_f32v y = E(lm_vload_f32(X + i)); memcpy(Y + i, &y, sizeof y); }
#define SOFTMAX(E, R) lm_f32v acc = {0}; for (int i = 0; i < N; i += LM_VL) { \
  lm_f32v e = E((lm_vload_f32(X + i) + -1.3f) * 1.4426950408889634f); \
  memcpy(Y + i, &e, sizeof e); acc += e; } sink += lm_vsum_f32(acc);
#define GELU(E, R) for (int i = 0; i < N; i += LM_VL) { \
  lm_f32v z = lm_vload_f32(X + i) * lm_vload_f32(A + i) + lm_vload_f32(B + i); \
  lm_f32v u = (z + z * z * z * 0.044715f) * -2.302208185195923f; \
  lm_f32v y = z * R(E(u) + 1.0f) * lm_vload_f32(C + i); memcpy(Y + i, &y, sizeof y); }
#define KERNEL(body, E, R) static void body##_##E##_##R(void) { body(E, R) }
#define FORMS(body) KERNEL(body, exp2_cur, rcp_div) KERNEL(body, exp2_rndscale, rcp_div) \
  KERNEL(body, exp2_deg5, rcp_div) KERNEL(body, exp2_cur, rcp_nr)
FORMS(EXP_ONLY) FORMS(SOFTMAX) FORMS(GELU)
typedef void (*fn)(void);
static const fn kernels[3][4] = {
#define ROW(body) {body##_exp2_cur_rcp_div, body##_exp2_rndscale_rcp_div, \
  body##_exp2_deg5_rcp_div, body##_exp2_cur_rcp_nr}
  ROW(EXP_ONLY), ROW(SOFTMAX), ROW(GELU)};
int main(int argc, char **argv) {
  const uint64_t step = (uint64_t)atoll(argv[1]);
  double err[5] = {0}; float at[5] = {0};
  float buf[LM_VL];
  int k = 0;
  for (uint64_t b = 0; b <= 0xffffffffu; b += step) {
    const uint32_t bits = (uint32_t)b;
    memcpy(&buf[k], &bits, 4);
    if (++k < LM_VL) continue;
    k = 0;
    lm_f32v v;
    memcpy(&v, buf, sizeof v);
    const lm_f32v r[5] = {lm_vexp2f(v), exp2_rndscale(v), exp2_deg5(v), rcp_div(v), rcp_nr(v)};
    for (int l = 0; l < LM_VL; ++l) {
      const double x = buf[l];
      for (int f = 0; f < 5; ++f) {
        if (f < 3 && !(x >= -152.0 && x <= 130.0) && !isinf(x) && !isnan(x)) continue;
        const double e = ulp_err(r[f][l], f < 3 ? exp2(x) : 1.0 / x);
        if (e > err[f]) err[f] = e, at[f] = buf[l];
      }
    }
  }
  printf("ERR");
  for (int f = 0; f < 5; ++f) printf(" %.4f %.9g", err[f], at[f]);
  printf("\n");
  for (int i = 0; i < N; ++i)
    X[i] = (i % 997) * 0.01f - 5.0f, A[i] = 1.1f, B[i] = 0.1f, C[i] = 0.7f;
  for (int body = 0; body < 3; ++body) {
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    for (int rep = 0; rep < 200; ++rep)
      for (int f = 0; f < 4; ++f) {
        double t = now();
        for (int j = 0; j < 20; ++j) kernels[body][f]();
        t = (now() - t) / 20 / (N / LM_VL);
        if (t < best[f]) best[f] = t;
      }
    printf("NS");
    for (int f = 0; f < 4; ++f) printf(" %.4f", best[f] * 1e9);
    printf("\n");
  }
  return 0;
}
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step", type=int, default=8, help="sweep every STEP-th float bit pattern")
    a = p.parse_args()
    from luminal.codegen.cpu.kernel import PRELUDE

    flags = ["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=fast",
             "-fno-trapping-math", "-mprefer-vector-width=512", "-fopenmp-simd"]  # fmt: skip
    consts = "".join(f"#define D5_{i + 1} {c!r}f\n" for i, c in enumerate(DEG5))
    with tempfile.TemporaryDirectory(prefix="luminal-forms-") as tmp:
        src, exe = os.path.join(tmp, "forms.c"), os.path.join(tmp, "forms")
        with open(src, "w") as f:
            f.write(PRELUDE + "#include <stdlib.h>\n#if !defined(__AVX512F__)\n"
                    "#error AVX-512 only\n#endif\n" + consts + _FORMS + _DRIVER)  # fmt: skip
        cc = shlex.split(os.environ.get("CC") or "cc")
        subprocess.run([*cc, *flags, src, "-o", exe, "-lm"], check=True)
        out = subprocess.run([exe, str(a.step)], check=True, capture_output=True, text=True)
    lines = out.stdout.split("\n")
    err = lines[0].split()[1:]
    names = ["exp2", "exp2_rndscale", "exp2_deg5", "div", "rcp_nr"]
    result: dict[str, object] = {"step": a.step}
    print(f"max error against f64 (every {a.step}th float; exp2 over [-152, 130] and +-inf, NaN):")
    for i, n in enumerate(names):
        e, x = float(err[2 * i]), err[2 * i + 1]
        # 1e9: a special value wrong (NaN, an infinity or an overflow missed)
        result[f"{n}_max_ulp"] = e if e < 1e9 else None
        print(f"  {n:14s} " + (f"{e:8.4f} ulp (at {x})" if e < 1e9 else f"wrong at {x}"))
    print("ns per vector, data in L1 (best of 200 x 20 passes over 4096 floats):")
    forms = ["exp2+div", "exp2_rndscale+div", "exp2_deg5+div", "exp2+rcp_nr"]
    print(f"  {'loop':10s}" + "".join(f"{f:>19s}" for f in forms))
    for body, line in zip(("exp2", "softmax", "gelu"), lines[1:4], strict=True):
        ns = [float(v) for v in line.split()[1:]]
        result[f"{body}_ns"] = dict(zip(forms, ns, strict=True))
        print(f"  {body:10s}" + "".join(f"{v:19.3f}" for v in ns))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
