"""Measured sensitivity: which matrices to keep at a higher precision.

A format's rounding does not cost every matrix the same: some layers' errors reach the logits
far more than others (llama.cpp's 4-bit mixes keep attention's v and ffn_down of some layers,
and the output head, at more bits; FP8 recipes leave the head in bf16). Instead of a fixed
list, ``measure`` rounds one matrix at a time to the target type, runs the f32 model over the
calibration tokens with only that matrix rounded, and takes the mean KL divergence of the f32
model's next-token distribution to that model's: what that matrix's rounding alone costs at
the output. The layers before the matrix's are run once (their outputs are cached), so one
measurement runs the layers from the matrix's on.

``choose`` keeps the matrices with the most KL per weight until a fraction of the matrices'
weights is reached: the greedy answer to "least summed KL for that many bytes" when the
matrices' costs add (they nearly do while each is small).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import numpy as np

from .calibrate import Calibration
from .rotate import Overlay

TOKENS = 128  # calibration tokens a measurement runs (one window: its cost is per token)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def measure(cal: Calibration, names: Iterable[str],
            rounded: Callable[[str, np.ndarray], np.ndarray], tokens: int = TOKENS,
            quiet: bool = True) -> dict[str, float]:  # fmt: skip
    """Mean KL (nats per token) over the first ``tokens`` of ``cal``'s tokens of the f32
    model's next-token distribution to that of the model with only ``name`` replaced by
    ``rounded(name, values)``, for each of ``names`` (2-D tensors: layer matrices, the
    embedding, the output head)."""
    c = cal.config
    ids = cal.tokens[: min(tokens, cal.window)]
    base = cal.weights
    xs = [np.asarray(base.values("token_embd.weight"), np.float32)[ids]]
    for i in range(c.n_layers):  # each layer's input, f32 model
        xs.append(cal._block(i, xs[-1], None))
    ref = _log_softmax(cal.final(xs[-1]) @ cal._w(cal.head()).T)
    out: dict[str, float] = {}
    todo = list(names)
    for k, name in enumerate(todo):
        if not quiet:
            print(f"\rsensitivity: {k + 1}/{len(todo)} matrices", end="", file=sys.stderr)
        q = np.asarray(rounded(name, np.asarray(base.values(name), np.float32)), np.float32)
        m = Calibration(c, Overlay(base, {name: q}), ids)
        lay = cal.key(name)
        if name == "token_embd.weight":  # the lookup, and the head when tied
            x, first = q[ids], 0
        elif lay is None or lay == "head":  # an untied head
            x, first = xs[-1], c.n_layers
        else:
            first = int(lay.split(".")[0])
            x = xs[first]
        for i in range(first, c.n_layers):
            x = m._block(i, x, None)
        logp = _log_softmax(m.final(x) @ m._w(m.head()).T)
        out[name] = float(np.mean(np.sum(np.exp(ref) * (ref - logp), axis=-1)))
    if not quiet:
        print(file=sys.stderr)
    return out


def choose(kl: dict[str, float], sizes: dict[str, int], fraction: float) -> list[str]:
    """The matrices to keep: by decreasing KL per weight, each that still fits in
    ``fraction`` of the summed ``sizes`` (weights per matrix)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"the kept fraction must be in [0, 1], got {fraction}")
    budget = fraction * sum(sizes[n] for n in kl)
    kept, used = [], 0
    for n in sorted(kl, key=lambda n: (-kl[n] / sizes[n], n)):
        if used + sizes[n] <= budget:
            kept.append(n)
            used += sizes[n]
    return kept
