"""Rotating the residual stream before quantizing (QuaRot / SpinQuant style, offline only).

A trained Llama's residual stream has a few channels far louder than the rest; folded through
the RMSNorm weights they become a few loud columns in every matrix that reads the stream, and a
block format's scale, set by the block's largest value, then rounds the rest of that block
coarsely. An orthogonal Q (d x d) spreads every channel over all channels, and since
RMSNorm without a weight commutes with it (||x Q|| = ||x||), the model computes the same
function in the rotated basis x -> x Q:

- each RMSNorm weight g is folded into the linears that read its output (W -> W diag(g):
  q/k/v after the attention norm, gate/up after the FFN norm, the output head after the final
  norm) and becomes ones;
- the embedding E -> E Q (its rows are residual vectors);
- every linear reading the stream (y = x W^T) W -> W Q, so that (x Q)(W Q)^T = x W^T;
- every linear writing it (``attn_output``, ``ffn_down``) W -> Q^T W (and a bias b -> b Q), so
  that its output lands in the rotated basis.

A tied head is the embedding, which now holds E Q while the head must read E diag(g) Q: unless
the final norm's weight is a constant (which commutes), the head is untied, stored as its own
matrix (``output.weight``, vocab x d more weights in the file). Optionally (``heads``) each
attention head's values are rotated too by an orthogonal R (head_dim square): ``attn_v``'s rows
of head j -> R^T W_j, ``attn_output``'s columns of every query head reading it -> W_h R, exact
as the attention weights mix value rows linearly.

Loud channels stay out of the rotation. A few residual channels carry "massive activations"
(SmolLM2's channel 507: a mean square 15000 times the median channel's); the weights learn to
meet them with small columns, which round-to-nearest then rounds finely where the inputs are
loudest. Rotating such a channel spreads it over every column, and the error of the rounded
rotated weights meets it in full (SmolLM2 in mxfp4, round to nearest: KL 0.99 unrotated, 1.24
with every channel rotated, 0.73 with the 3 loudest left alone). So Q is the identity on the
channels whose mean square (over ``LOUD_TOKENS`` tokens of a text, summed over the layers'
inputs) is above ``LOUD`` times the median channel's (``loud_channels``), and ``orthogonal`` on
the rest: still orthogonal, still exact.

No online rotation (that would need an op at run time): the output is an ordinary GGUF Llama
whose norm weights are ones, which llama.cpp runs. Q: ``orthogonal`` (``KINDS``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

ROTATION_KEY = "luminal.rotation"  # metadata of a rotated file: a JSON object
# hadamard: a Hadamard matrix (Sylvester / Paley products) times random signs; random: a
# seeded Haar-random orthogonal matrix. Hadamard had the lower KL on SmolLM2 for fp8_e4m3,
# nvfp4 and mxfp4 rounded to nearest (docs/quantization.md, "Rotation")
KINDS = ("hadamard", "random")
KIND = "hadamard"
SEED = 0
LOUD = 100.0  # a channel whose mean square is above this times the median's is not rotated
LOUD_TOKENS = 128  # tokens of the text the channels are measured on

_READERS = {"attn_norm": ("attn_q", "attn_k", "attn_v"), "ffn_norm": ("ffn_gate", "ffn_up")}
_WRITERS = ("attn_output", "ffn_down")
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL = ("token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight")


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n**0.5) + 1))


@functools.cache
def _factors(n: int) -> tuple[int, ...] | None:
    """Orders whose Kronecker product is ``n``, each a power of 2 (Sylvester) or q + 1 for a
    prime q = 3 (mod 4) (Paley I); None when this search finds none."""
    if n & (n - 1) == 0:
        return (n,)
    for f in range(n, 3, -1):
        if n % f == 0 and f % 4 == 0 and _is_prime(f - 1) and (f - 1) % 4 == 3:
            rest = _factors(n // f)
            if rest is not None:
                return (f, *rest)
    return None


def _paley(n: int) -> np.ndarray:
    """Paley's construction I: a Hadamard matrix of order n = q + 1, q prime = 3 (mod 4)."""
    q = n - 1
    residues = {i * i % q for i in range(1, q)}
    chi = np.array([0] + [1 if i in residues else -1 for i in range(1, q)])
    jac = chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]  # skew: q = 3 (mod 4)
    s = np.zeros((n, n))
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jac
    return np.eye(n) + s


def hadamard(n: int) -> np.ndarray | None:
    """A Hadamard matrix of order ``n`` (entries +-1, H H^T = n I) as a Kronecker product of
    Sylvester and Paley I matrices, or None when ``n`` has no such factorization."""
    fs = _factors(n)
    if fs is None:
        return None
    h: np.ndarray = np.ones((1, 1))
    for f in fs:
        if f & (f - 1) == 0:
            part: np.ndarray = np.ones((1, 1))
            while len(part) < f:
                part = np.block([[part, part], [part, -part]])
        else:
            part = _paley(f)
        h = np.kron(h, part)
    return h


def orthogonal(n: int, kind: str = KIND, seed: int = SEED,
               keep: Sequence[int] = ()) -> np.ndarray:  # fmt: skip
    """An orthogonal n x n matrix (float64). ``hadamard``: D H / sqrt(n), D random signs; where
    no Hadamard matrix of order n is built, block-diagonal: blocks of the largest order that
    is, then the same for the rest (573 = 512 + 48 + 12 + 1). ``random``: Haar-random (QR of a
    Gaussian, R's diagonal made positive). ``keep``: indices the matrix leaves alone (the
    identity there, the kind's matrix on the others). Seeded: the same arguments give the same
    matrix."""
    if kind not in KINDS:
        raise ValueError(f"rotation kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if len(keep):
        k = np.asarray(keep, np.int64)
        rest = np.setdiff1d(np.arange(n), k)
        q = np.zeros((n, n))
        q[k, k] = 1
        q[np.ix_(rest, rest)] = orthogonal(len(rest), kind, seed)
        return q
    rng = np.random.default_rng(seed)
    if kind == "random":
        q, r = np.linalg.qr(rng.standard_normal((n, n)))
        return q * np.sign(np.diag(r))
    q, at = np.zeros((n, n)), 0
    while at < n:
        b = next(b for b in range(n - at, 0, -1) if _factors(b) is not None)
        h = hadamard(b)
        assert h is not None
        q[at : at + b, at : at + b] = h / np.sqrt(b)
        at += b
    return rng.choice([-1.0, 1.0], size=n)[:, None] * q


def loud_channels(config: Any, weights: Any, tokens: Sequence[int],
                  ratio: float = LOUD) -> list[int]:  # fmt: skip
    """The residual channels whose mean square over the first ``LOUD_TOKENS`` of ``tokens``,
    summed over every layer's input and the final norm's, is above ``ratio`` times the median
    channel's (the f32 model's numpy forward, ``calibrate.Calibration``)."""
    from .calibrate import Calibration

    cal = Calibration(config, weights, list(tokens)[:LOUD_TOKENS])
    x = np.asarray(weights.values("token_embd.weight"), np.float32)[cal.tokens[: cal.window]]
    ms = np.zeros(config.hidden_size)
    for i in range(config.n_layers):
        ms += np.mean(np.square(x, dtype=np.float64), axis=0)
        x = cal._block(i, x, None)
    ms += np.mean(np.square(x, dtype=np.float64), axis=0)
    return [int(i) for i in np.flatnonzero(ms > ratio * np.median(ms))]


class Overlay:
    """Weights (``has``, ``values``, ``shape``: e.g. ``GGUFWeights``) with some tensors' values
    replaced or added."""

    def __init__(self, base: Any, new: dict[str, np.ndarray]) -> None:
        self.base, self.new = base, new

    def has(self, name: str) -> bool:
        return name in self.new or self.base.has(name)

    def values(self, name: str) -> np.ndarray:
        return self.new[name] if name in self.new else self.base.values(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.new[name].shape) if name in self.new else self.base.shape(name)


def rotate(config: Any, weights: Any, names: Iterable[str], kind: str = KIND, seed: int = SEED,
           heads: bool = True,
           keep: Sequence[int] = ()) -> tuple[dict[str, np.ndarray], dict[str, Any]]:  # fmt: skip
    """The rotated model's tensors that change (f32, by GGUF name; ``output.weight`` added when
    a tied head must be untied) and the record of the rotation (``ROTATION_KEY``) for the
    llama-family model ``config`` (a ``LlamaConfig``) whose tensors ``names`` ``weights`` holds
    (``has``, ``values``); ``keep``: residual channels left out of the rotation
    (``loud_channels``). A tensor the rotation does not know is an error naming it."""
    c = config
    names = list(names)
    unknown = [n for n in names if n not in _GLOBAL and not _known(n, c.n_layers)]
    if unknown:
        more = f" and {len(unknown) - 4} more" if len(unknown) > 4 else ""
        raise ValueError(f"rotate: tensors a llama-family rotation does not know: "
                         f"{', '.join(unknown[:4])}{more}")  # fmt: skip
    q = orthogonal(c.hidden_size, kind, seed, keep)
    r = orthogonal(c.head_dim, kind, seed + 1) if heads else None
    new: dict[str, np.ndarray] = {}

    def val(name: str) -> np.ndarray:
        return np.asarray(weights.values(name), np.float64)

    def put(name: str, a: np.ndarray) -> None:
        new[name] = np.ascontiguousarray(a, np.float32)

    emb = val("token_embd.weight")
    put("token_embd.weight", emb @ q)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        for norm, readers in _READERS.items():
            g = val(p + norm + ".weight")
            for m in readers:
                w = val(p + m + ".weight") * g
                if r is not None and m == "attn_v":  # head j's rows: R^T W_j
                    w = np.einsum("ji,kjd->kid", r, w.reshape(-1, c.head_dim, w.shape[1]))
                    w = w.reshape(-1, c.hidden_size)
                    if weights.has(p + "attn_v.bias"):
                        put(p + "attn_v.bias", (val(p + "attn_v.bias").reshape(-1, c.head_dim)
                                                @ r).reshape(-1))  # fmt: skip
                put(p + m + ".weight", w @ q)
            put(p + norm + ".weight", np.ones_like(g))
        for m in _WRITERS:
            w = val(p + m + ".weight")
            if r is not None and m == "attn_output":  # every query head's columns: W_h R
                w = (w.reshape(w.shape[0], -1, c.head_dim) @ r).reshape(w.shape)
            put(p + m + ".weight", q.T @ w)
            if weights.has(p + m + ".bias"):
                put(p + m + ".bias", val(p + m + ".bias") @ q)
    g = val("output_norm.weight")
    tied = not weights.has("output.weight")
    untied = tied and not np.all(g == g[0])
    if not tied or untied:
        put("output.weight", ((emb if tied else val("output.weight")) * g) @ q)
        put("output_norm.weight", np.ones_like(g))
    record = {"kind": kind, "seed": seed, "dim": c.hidden_size, "heads": heads,
              "untied_head": bool(untied), "kept": [int(i) for i in keep]}  # fmt: skip
    return new, record


def _known(name: str, n_layers: int) -> bool:
    m = _LAYER.match(name)
    if m is None or int(m.group(1)) >= n_layers:
        return False
    part = m.group(2)
    if m.group(3) == "bias":
        return part in (*_READERS["attn_norm"], *_READERS["ffn_norm"], *_WRITERS)
    return part in _READERS or part in _WRITERS or any(part in v for v in _READERS.values())
