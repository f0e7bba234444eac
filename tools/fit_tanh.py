"""Fit the rational tanh used by ``luminal.functional`` (``_TANH_P``, ``_TANH_Q``).

tanh(x) = x * P(x^2) / Q(x^2) on |x| <= 9.5, P of degree 6 and Q of degree 3 in x^2 with
Q(0) = 1. Linear least squares on Chebyshev nodes in t = x^2 (a Chebyshev basis for
conditioning), made a relative-error fit by Sanathanan-Koerner reweighting (divide by the last
Q) and pushed toward minimax by Lawson reweighting. One heavily weighted point asks for a
value just above 1 at x = 9.5, so that clamping the argument to +-9.5 and the result to +-1
gives exactly +-1 for large arguments. Prints the coefficients (highest degree first) and the
maximum relative error of the f32 evaluation the graph performs (Horner, then x * P * (1/Q)).

    python tools/fit_tanh.py
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as Pm

CLAMP, DP, DQ = 9.5, 6, 3


def fit() -> tuple[np.ndarray, np.ndarray]:
    span = CLAMP**2
    m = 40000
    s = np.cos(np.pi * (np.arange(m) + 0.5) / m)
    t = (s + 1) * span / 2
    x = np.sqrt(t)
    yx = np.tanh(x) / x  # P / Q
    end = 50  # the pinned point at the clamp
    s = np.concatenate([s, np.ones(end)])
    yx = np.concatenate([yx, np.full(end, (1 + 1.5e-7) / CLAMP)])
    q_prev, lawson = np.ones(len(s)), np.ones(len(s))
    vp, vq = C.chebvander(s, DP), C.chebvander(s, DQ)
    a = np.concatenate([vp, -yx[:, None] * vq[:, 1:]], axis=1)
    for it in range(60):
        w = lawson / (yx * np.abs(q_prev))
        sol = np.linalg.lstsq(a * w[:, None], yx * w, rcond=None)[0]
        cp, cq = sol[: DP + 1], np.concatenate([[1.0], sol[DP + 1 :]])
        p, q = C.chebval(s, cp), C.chebval(s, cq)
        err = np.abs(p / q / yx - 1)
        q_prev = q
        if it >= 10:
            lawson = lawson * (err / err.max()) ** 0.3
            lawson /= lawson.max()
    assert q.min() > 0, "Q has a root on the interval"

    def in_t(c: np.ndarray) -> np.ndarray:  # Chebyshev in s = 2t/span - 1 -> monomials in t
        poly, out = C.cheb2poly(c), np.zeros(len(c))
        for k, ck in enumerate(poly):
            out[: k + 1] += ck * Pm.polypow([-1.0, 2 / span], k)[: k + 1]
        return out

    pt, qt = in_t(cp), in_t(cq)
    return pt[::-1] / qt[0], qt[::-1] / qt[0]


def evaluate_f32(x: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    f = np.float32
    xc = np.clip(x.astype(f), -CLAMP, CLAMP).astype(f)
    x2 = (xc * xc).astype(f)

    def horner(cs: np.ndarray) -> np.ndarray:
        acc = (x2 * f(cs[0]) + f(cs[1])).astype(f)
        for c in cs[2:]:
            acc = (acc * x2 + f(c)).astype(f)
        return acc

    r = (xc * horner(p)).astype(f) * (f(1) / horner(q)).astype(f)
    return np.clip(r.astype(f), -1, 1)


if __name__ == "__main__":
    p, q = fit()
    xs = np.concatenate([np.geomspace(1e-7, 30, 400000), -np.geomspace(1e-7, 30, 1000)])
    xs = xs.astype(np.float32)
    ref = np.tanh(xs.astype(np.float64))
    rel = np.abs(evaluate_f32(xs, p, q) - ref) / np.abs(ref)
    big = evaluate_f32(np.array([1e30, -np.inf, np.inf], np.float32), p, q)
    print(f"max relative error (f32) {rel.max():.2e}; tanh(1e30, -inf, inf) = {big}")
    print("P =", ", ".join(f"{c:.15e}" for c in p))
    print("Q =", ", ".join(f"{c:.15e}" for c in q))
