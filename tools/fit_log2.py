"""Fit the polynomial of the CPU kernels' ``lm_log2f`` (codegen/cpu/kernel.py, ``LM_LOG2_R*``).

x = 2^e * m with m in [sqrt(1/2), sqrt(2)) and f = m - 1, so log2(x) = e + log2(1 + f) and
log2(1 + f) = L*f + f^2 * R(f), L = log2(e) held as two floats (its rounding alone would cost
0.3 ulp near x = sqrt(2)). R is fit for relative error of the whole log2(1 + f) by weighted
least squares on Chebyshev nodes pushed toward minimax by Lawson reweighting. Prints the
coefficients as C defines and the largest error, in ulps of f64 log2, of the f32 evaluation
the kernels perform (Horner with fused multiply-adds), over a bit-pattern sweep of the normal
floats; the kernels themselves are checked compiled by tests/test_transcendental_log2.py.

    python tools/fit_log2.py             # degree 9 (0.95 ulp)
    python tools/fit_log2.py --degree 8
"""

from __future__ import annotations

import argparse

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as Pm

LO, HI = float(np.sqrt(0.5) - 1), float(np.sqrt(2) - 1)
L2E = 1 / np.log(2)
L_HI = np.float32(L2E)
L_LO = np.float32(L2E - float(L_HI))


def fit(degree: int) -> np.ndarray:
    """R's coefficients, lowest degree first, rounded to f32."""
    m = 20000
    s = np.cos(np.pi * (np.arange(m) + 0.5) / m)
    f = LO + (s + 1) * (HI - LO) / 2
    y = np.log2(1 + f)
    r = (y - L2E * f) / (f * f)
    v = C.chebvander(s, degree)
    lawson = np.ones(m)
    for _ in range(100):
        w = np.sqrt(lawson) * f * f / np.abs(y)
        c = np.linalg.lstsq(v * w[:, None], r * w, rcond=None)[0]
        err = np.abs(C.chebval(s, c) - r) * f * f / np.abs(y)
        lawson = lawson * err
        lawson /= lawson.sum()
    # from the Chebyshev basis in s = (2f - (LO + HI)) / (HI - LO) to powers of f
    a, b = 2 / (HI - LO), -(LO + HI) / (HI - LO)
    out = np.zeros(degree + 1)
    for k, ck in enumerate(C.cheb2poly(c)):
        out[: k + 1] += ck * Pm.polypow([b, a], k)
    return out.astype(np.float32)


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    # f32 products are exact in f64; the sum rounds once to f32 (double rounding is rarer
    # than the sweep can see)
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def evaluate(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """lm_log2f of positive normal f32 ``x``, as the C evaluates it."""
    t = x.astype(np.float32).view(np.uint32).astype(np.int64) - 0x3F3504F3
    e = (t >> 23).astype(np.float32)
    f = ((t & 0x7FFFFF) + 0x3F3504F3).astype(np.uint32).view(np.float32) - np.float32(1)
    q = np.full_like(f, r[-1])
    for c in r[-2::-1]:
        q = _fma(q, f, np.full_like(f, c))
    inner = _fma(f * f, q, f * L_LO)
    return (e + _fma(f, np.full_like(f, L_HI), inner)).astype(np.float32)


def max_ulp(r: np.ndarray, step: int = 61) -> tuple[float, float]:
    bits = np.arange(0x00800000, 0x7F800000, step, dtype=np.int64).astype(np.uint32)
    x = bits.view(np.float32)
    got = evaluate(x, r).astype(np.float64)
    ref = np.log2(x.astype(np.float64))
    keep = ref != 0
    spacing = np.spacing(np.abs(ref[keep]).astype(np.float32)).astype(np.float64)
    err = np.abs(got[keep] - ref[keep]) / spacing
    return float(err.max()), float(x[keep][err.argmax()])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--degree", type=int, default=9)
    args = p.parse_args()
    r = fit(args.degree)
    print(f"#define LM_LOG2E_HI {float(L_HI):.17e}f")
    print(f"#define LM_LOG2E_LO {float(L_LO):.17e}f")
    for k in range(len(r) - 1, -1, -1):
        print(f"#define LM_LOG2_R{k} {float(r[k]):.17e}f")
    worst, at = max_ulp(r)
    print(f"max error {worst:.3f} ulp (at {at!r}) over normal floats, step 61")


if __name__ == "__main__":
    main()
