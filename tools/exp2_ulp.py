"""The generated CPU kernels' exp2 forms against f64 exp2 on every float of a range: the
largest error in units of the last place of the correctly rounded result, for the scalar
``lm_exp2f`` and the vector ``lm_vexp2f`` (AVX-512's form where the compiler targets it).

    python tools/exp2_ulp.py                 # every float in [-152, 130]: about a minute
    python tools/exp2_ulp.py --lo -20 --hi 20

Compiles a small C driver around the kernels' prelude with the flags kernels get (``cc``, or
``$CC``) and prints one line per form and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tempfile

_DRIVER = r"""
#include <stdio.h>
static double ulp_err(float y, double ref) {
  if (isnan(ref)) return isnan(y) ? 0 : 1e9;
  if (isinf(ref)) return (isinf(y) && (y > 0) == (ref > 0)) ? 0 : 1e9;
  const float r = (float)ref;
  double u = (double)nextafterf(fabsf(r), INFINITY) - fabsf(r);
  if (fabsf(r) < 1.1754943508222875e-38f) u = 1.401298464324817e-45; /* subnormal spacing */
  return fabs((double)y - ref) / u;
}
int main(int argc, char **argv) {
  const float lo = (float)atof(argv[1]), hi = (float)atof(argv[2]);
  double worst[2] = {0, 0}, at[2] = {0, 0};
  long n = 0;
  float buf[LM_VL];
  for (uint64_t b = 0; b <= 0xffffffffu; ++b) {
    float x;
    const uint32_t bits = (uint32_t)b;
    memcpy(&x, &bits, 4);
    if (!(x >= lo && x <= hi)) continue;
    buf[n++ % LM_VL] = x;
    if (n % LM_VL) continue;
    lm_f32v v;
    memcpy(&v, buf, sizeof v);
    const lm_f32v r = lm_vexp2f(v);
    for (int l = 0; l < LM_VL; ++l) {
      const double ref = exp2((double)buf[l]);
      const double e[2] = {ulp_err(lm_exp2f(buf[l]), ref), ulp_err(r[l], ref)};
      for (int f = 0; f < 2; ++f)
        if (e[f] > worst[f]) worst[f] = e[f], at[f] = buf[l];
    }
  }
  printf("%ld %.4f %.9g %.4f %.9g\n", n - n % LM_VL, worst[0], at[0], worst[1], at[1]);
  return 0;
}
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lo", type=float, default=-152.0)
    p.add_argument("--hi", type=float, default=130.0)
    a = p.parse_args()
    from luminal.codegen.cpu.kernel import PRELUDE

    flags = ["-O2", "-march=native", "-fno-math-errno", "-ffp-contract=fast",
             "-fno-trapping-math", "-fopenmp-simd"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="luminal-exp2-") as tmp:
        src, exe = os.path.join(tmp, "ulp.c"), os.path.join(tmp, "ulp")
        with open(src, "w") as f:
            f.write(PRELUDE + "#include <stdlib.h>\n" + _DRIVER)
        cc = shlex.split(os.environ.get("CC") or "cc")
        subprocess.run([*cc, *flags, src, "-o", exe, "-lm"], check=True)
        out = subprocess.run([exe, str(a.lo), str(a.hi)], check=True, capture_output=True,
                             text=True).stdout.split()  # fmt: skip
    n, es, xs, ev, xv = int(out[0]), float(out[1]), out[2], float(out[3]), out[4]
    print(f"{n} floats in [{a.lo:g}, {a.hi:g}] against f64 exp2")
    print(f"lm_exp2f   max {es:.3f} ulp (at {xs})")
    print(f"lm_vexp2f  max {ev:.3f} ulp (at {xv})")
    print(json.dumps({"floats": n, "lo": a.lo, "hi": a.hi, "lm_exp2f_max_ulp": es,
                      "lm_vexp2f_max_ulp": ev}))  # fmt: skip


if __name__ == "__main__":
    main()
