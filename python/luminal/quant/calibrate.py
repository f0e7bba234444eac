"""Calibrated quantization: GPTQ error feedback over the second moments of each matrix's inputs.

Round-to-nearest minimises each weight's own error; what matters is the layer's output. For a
linear layer y = x W^T and inputs X (tokens, in) the output error ||X (W - Q)^T||^2 is a
quadratic form in each row's weight error with H = X^T X. GPTQ (Frantar et al. 2022,
arXiv:2210.17323) quantizes the input columns in order and, after each, moves the rounding
error onto the columns not quantized yet, weighted by the Cholesky factor of H^-1, so that they
compensate for it. Columns go in blocks of 128 whose updates to the later columns are applied
once per block (the paper's lazy batch updates).

The formats are luminal's (``lowp.Grid``): a group's scale is chosen by the format's own rule
(``mse`` or ``amax``) when the column loop enters the group, from the weights as the error
feedback has left them (a per-row or per-tensor scale: from the whole matrix, before the
loop); each column is then rounded with that fixed scale, and the values that were rounded are
packed by the format's own packing, so the parts are the format's bytes.

Statistics: a numpy forward of the llama-family graph (``models/llama.py``: llama, smollm,
qwen2) over the source's f32 values, run over a calibration text one layer at a time for all
windows, gives per layer the X^T X of the attention projections' input (the attention norm's
output: q, k, v), of ``attn_output`` (the attention output), of ``ffn_gate`` / ``ffn_up`` (the
ffn norm's output) and of ``ffn_down`` (silu(gate) * up), and after the last layer that of the
output head (the final norm's output). A tied head is ``token_embd.weight``: it is calibrated
against the head's inputs, and the embedding lookup reads the same values. An untied
``token_embd.weight`` has no inputs to weigh (a lookup): it is rounded to nearest.

Activation-aware input scales (``METHODS`` with ``awq``; Lin et al. 2023, arXiv:2306.00978):
a weight's columns that meet large inputs matter more, so before rounding each group of
matrices reading one input is multiplied column-wise by s = rms(input channel)^alpha, and 1/s
is folded into what produces that input (the RMSNorm's weight, ``attn_v``'s rows for
``attn_output``, ``ffn_up``'s rows for ``ffn_down``), so the graph and its exact value are
unchanged. alpha is searched per group for the least output error tr(E H E^T) of the rounded
weights (alpha 0, no scaling, is a candidate).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..loaders import lowp

BLOCK = 128  # columns per lazy batch update
DAMP = 0.1  # added to H's diagonal, relative to its mean (see METHOD)
CALIB_TOKENS = 512
CALIB_KEY = "luminal.calibration"  # metadata of a calibrated file: a JSON object
TEXT = os.path.join(os.path.dirname(__file__), "calibration.txt")  # the shipped text
# gptq: error feedback; awq: input scales, then round to nearest; awq+gptq: both
METHODS = ("gptq", "awq", "awq+gptq")
# The defaults: with a few hundred tokens (X^T X of a 1536-wide input is not full rank at 512)
# GPTQ fits the text unless damped well past the paper's 0.01; input scales then GPTQ had the
# lowest KL on SmolLM2 for int8, nvfp4 and mxfp4 (docs/quantization.md)
METHOD = "awq+gptq"
ALPHAS = tuple(a / 10 for a in range(11))  # exponents of the input scales tried (0: none)
# (values, their columns' input mean squares) -> the rounded (dequantized) values
Rounder = Callable[[np.ndarray, np.ndarray], np.ndarray]

# matrix name suffix -> the input it multiplies (per layer)
_INPUTS = {"attn_q": "attn", "attn_k": "attn", "attn_v": "attn", "attn_output": "attn_out",
           "ffn_gate": "ffn", "ffn_up": "ffn", "ffn_down": "ffn_mid"}  # fmt: skip
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight$")


def gptq(x: np.ndarray, u: np.ndarray, grid: lowp.Grid, order: np.ndarray | None = None,
         importance: np.ndarray | None = None,
         ) -> tuple[dict[str, np.ndarray], np.ndarray]:  # fmt: skip
    """Quantize ``x`` (rows, cols) on ``grid`` minimising ||X (x - q)^T|| for inputs whose
    X^T X has the ``inverse_factor`` ``u`` (cols, cols). Returns the parts and the dequantized
    values q. ``order``: quantize the columns in this order (``act_order``), ``u`` being the
    factor of X^T X permuted by it; the scales are then fixed first, from ``x``.
    ``importance`` (cols,): weighs each column's error in the scale rule's choice (X^T X's
    diagonal)."""
    rows, cols = x.shape
    if u.shape != (cols, cols):
        raise ValueError(f"gptq: the factor is {u.shape}, the weight has {cols} columns")
    u = u.astype(np.float32)
    if order is not None:
        return _gptq_ordered(x, u, grid, order, importance)
    w = np.array(x, np.float32)  # updated in place: the values each column is rounded from
    q = np.empty_like(w)
    group = min(grid.group, cols)
    step = max(group, BLOCK // group * group) if group < cols else BLOCK
    scales: list[np.ndarray] = []
    s = grid.scale(w, importance) if group == cols else None
    for i1 in range(0, cols, step):
        i2 = min(i1 + step, cols)
        wb, ub = w[:, i1:i2], u[i1:i2, i1:i2]
        err = np.empty((rows, i2 - i1), np.float32)
        for j in range(i2 - i1):
            if group < cols and j % group == 0:
                imp = None if importance is None else importance[i1 + j : i1 + j + group]
                s = grid.scale(wb[:, j : j + group], imp)
                scales.append(s)
            assert s is not None
            q[:, i1 + j] = grid.fake(wb[:, j : j + 1], s)[:, 0]
            e = (wb[:, j] - q[:, i1 + j]) / ub[j, j]
            wb[:, j + 1 :] -= np.outer(e, ub[j, j + 1 :])
            err[:, j] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    if group < cols:
        s = np.concatenate(scales, axis=1)
    assert s is not None
    return grid.pack(w, s), q


def _gptq_ordered(x: np.ndarray, u: np.ndarray, grid: lowp.Grid, order: np.ndarray,
                  importance: np.ndarray | None,
                  ) -> tuple[dict[str, np.ndarray], np.ndarray]:  # fmt: skip
    """``gptq`` over the columns in ``order``; a group's columns are then quantized apart, so
    every scale is the rule's on ``x`` itself, fixed before the loop (GPTQ's static groups)."""
    rows, cols = x.shape
    s = grid.scale(np.asarray(x, np.float32), importance)
    group = min(grid.group, cols)
    w = np.array(x[:, order], np.float32)
    q = np.empty_like(w)
    for i1 in range(0, cols, BLOCK):
        i2 = min(i1 + BLOCK, cols)
        wb, ub = w[:, i1:i2], u[i1:i2, i1:i2]
        err = np.empty((rows, i2 - i1), np.float32)
        for j in range(i2 - i1):
            g = order[i1 + j] // group
            q[:, i1 + j] = grid.fake(wb[:, j : j + 1], s[:, g : g + 1])[:, 0]
            e = (wb[:, j] - q[:, i1 + j]) / ub[j, j]
            wb[:, j + 1 :] -= np.outer(e, ub[j, j + 1 :])
            err[:, j] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    back = np.argsort(order)
    return grid.pack(np.ascontiguousarray(w[:, back]), s), np.ascontiguousarray(q[:, back])


def gptq_importance(u: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Per column (in the weight's order), what an error left in it costs once GPTQ has moved
    it onto the later columns: 1 / [H^-1]_jj of the columns from j on (OBS's saliency), i.e.
    1 / u_jj^2 for the ``inverse_factor`` ``u`` (of X^T X permuted by ``order`` when given).
    Round to nearest's cost is X^T X's diagonal instead."""
    imp = 1.0 / np.square(np.diag(u).astype(np.float64))
    if order is None:
        return imp
    out = np.empty_like(imp)
    out[order] = imp
    return out


def act_order(h: np.ndarray) -> np.ndarray:
    """Columns by decreasing X^T X diagonal: the loudest inputs are quantized first, while
    the most columns are left to absorb their error (GPTQ's act-order)."""
    return np.argsort(-np.diag(h), kind="stable")


def input_scale(h: np.ndarray, ws: Sequence[tuple[np.ndarray, Rounder]],
                tie: np.ndarray | None = None,
                alphas: Sequence[float] = ALPHAS) -> np.ndarray:  # fmt: skip
    """Column scales s (cols,) for matrices ``ws`` (each with its ``Rounder``) reading inputs
    with second moment ``h``: of s = rms^alpha (normalised
    to a geometric mid-range of 1) over ``alphas``, the one whose rounded ``w * s / s`` has the
    least summed output error tr(E h E^T). ``tie`` (cols,) gives columns that must share a
    scale one index (their rms is pooled). Columns no input reaches keep 1."""
    d = np.maximum(np.diag(h), 0.0)
    tie = np.arange(len(d)) if tie is None else tie
    m = np.sqrt(np.bincount(tie, d) / np.bincount(tie))
    live = m > 0
    best, least = np.ones(len(d), np.float32), np.inf
    for a in alphas:
        s = np.ones_like(m)
        if a and live.any():
            s[live] = m[live] ** a
            s[live] /= np.sqrt(s[live].max() * s[live].min())
        sf = s[tie].astype(np.float32)
        err = 0.0
        for w, rtn in ws:
            e = (rtn(w * sf, d / np.square(sf, dtype=np.float64)) / sf).astype(np.float64) - w
            err += float(np.einsum("ij,ij->", e @ h, e))
        if err < least:  # ties keep the smaller alpha (0 first: no scaling)
            best, least = sf, err
    return best


def inverse_factor(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """Upper U with U^T U = (H + damping)^-1 (computed once per input, shared by the matrices
    that read it). A column no input reaches (zero diagonal) is
    decoupled: rounded to nearest, no error sent to or from it."""
    h = np.array(h, np.float64)
    dead = np.diag(h) <= 0
    h[dead, :] = 0
    h[:, dead] = 0
    h[dead, dead] = 1
    lam = damp * float(np.mean(np.diag(h)))
    for _ in range(6):  # numerically semi-definite H: more damping until the factor exists
        try:
            hd = h + lam * np.eye(len(h))
            hinv = np.linalg.inv(hd)
            return np.ascontiguousarray(np.linalg.cholesky((hinv + hinv.T) / 2).T)
        except np.linalg.LinAlgError:
            lam = lam * 10 if lam > 0 else 1e-6
    raise ValueError("gptq: X^T X is not positive definite even after damping")


def read_text(calibration: str | os.PathLike[str]) -> str:
    """The calibration text: a path (``os.PathLike``, or a str without whitespace) is read;
    another str is the text itself."""
    if isinstance(calibration, str) and any(c.isspace() for c in calibration):
        text = calibration
    else:
        path = os.fspath(calibration)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"calibration text {path}: no such file")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    if not text.strip():
        raise ValueError("calibration text is empty")
    return text


class Calibration:
    """X^T X of every calibrated matrix's inputs over ``tokens``, computed a layer at a time
    by ``hessians``. ``config``: a ``LlamaConfig``; ``weights``: has ``has(name)`` and
    ``values(name)`` (f32 arrays by GGUF tensor name, e.g. ``GGUFWeights``)."""

    def __init__(self, config: Any, weights: Any, tokens: Sequence[int]) -> None:
        from ..functional.attention import _inv_freq

        if not tokens:
            raise ValueError("calibration: no tokens")
        self.config, self.weights, self.tokens = config, weights, list(tokens)
        c = config
        self.tied = not weights.has("output.weight")
        self.window = min(c.context_length, len(self.tokens))
        inv = _inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
        if weights.has("rope_freqs.weight"):
            inv = inv / self._w("rope_freqs.weight").astype(np.float64)
        ang = np.arange(self.window, dtype=np.float64)[:, None] * inv[None]  # (T, hd / 2)
        ang = np.repeat(ang, 2, axis=1) if c.rope_interleaved else np.concatenate([ang, ang], 1)
        self.cos, self.sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    @staticmethod
    def from_gguf(f: Any, weights: Any, tokens: Sequence[int]) -> Calibration:
        """For GGUF file ``f`` read through ``weights`` (its ``GGUFWeights``)."""
        from ..models.llama import config_from_gguf

        try:
            config = config_from_gguf(f)
        except NotImplementedError as e:
            raise ValueError(f"calibration runs llama-family models: {e}") from None
        return Calibration(config, weights, tokens)

    def _w(self, name: str) -> np.ndarray:
        return np.asarray(self.weights.values(name), np.float32)

    def head(self) -> str:
        return "token_embd.weight" if self.tied else "output.weight"

    def key(self, name: str) -> str | None:
        """Which input's statistics ``name`` uses (None: not a calibrated matrix)."""
        if name == self.head():
            return "head"
        m = _LAYER.match(name)
        if m and m.group(2) in _INPUTS and int(m.group(1)) < self.config.n_layers:
            return f"{m.group(1)}.{_INPUTS[m.group(2)]}"
        return None

    def hessians(self, quiet: bool = True) -> Iterator[tuple[str, np.ndarray]]:
        """(key, X^T X) per input, layer by layer, then ``"head"``."""
        for hs in self.layers(quiet):
            yield from hs.items()

    def layers(self, quiet: bool = True) -> Iterator[dict[str, np.ndarray]]:
        """{key: X^T X} of each layer's inputs, layer by layer, then {"head": ...}."""
        c = self.config
        xs = [self._w("token_embd.weight")[self.tokens[i : i + self.window]]
              for i in range(0, len(self.tokens), self.window)]  # fmt: skip
        for layer in range(c.n_layers):
            if not quiet:
                print(f"\rcalibrate: layer {layer + 1}/{c.n_layers}", end="", file=sys.stderr)
            hs: dict[str, np.ndarray] = {}
            xs = [self._block(layer, x, hs) for x in xs]
            yield {f"{layer}.{k}": v for k, v in hs.items()}
        if not quiet:
            print(file=sys.stderr)
        yield {"head": sum((_xtx(self.final(x)) for x in xs), np.zeros((c.hidden_size,) * 2))}

    def fold_scales(self, hs: dict[str, np.ndarray], get: Callable[[str], np.ndarray],
                    rounder: Callable[[str], Rounder],
                    alphas: Sequence[float] = ALPHAS) -> dict[str, np.ndarray]:  # fmt: skip
        """Activation-aware input scales for one of ``layers``' dicts ``hs``: the tensors they
        change (matrices' columns times s, the producers of their inputs over s: norm weights,
        ``attn_v``'s and ``ffn_up``'s rows and biases), from values ``get(name)`` and each
        matrix's ``rounder(name)``; ``hs`` is updated to the scaled inputs' X^T X. A tied head
        is left alone (its matrix is also the embedding)."""
        c = self.config
        new: dict[str, np.ndarray] = {}

        def val(name: str) -> np.ndarray:
            return new[name] if name in new else np.asarray(get(name), np.float32)

        def group(key: str, mats: list[str], norm: str | None, rows: str | None,
                  tie: np.ndarray | None = None) -> None:  # fmt: skip
            ws = [(val(n), rounder(n)) for n in mats]
            s = input_scale(hs[key], ws, tie, alphas)
            if np.all(s == 1):
                return
            for n, (w, _) in zip(mats, ws):
                new[n] = (w * s).astype(np.float32)
            if norm is not None:
                new[norm] = (val(norm) / s).astype(np.float32)
            if rows is not None:  # the producer's output channels, one per distinct scale
                idx = np.unique(tie if tie is not None else np.arange(len(s)), return_index=True)[1]
                for n in (rows + ".weight", rows + ".bias"):
                    if self.weights.has(n):
                        v = val(n)
                        new[n] = (v / s[idx].reshape(-1, *([1] * (v.ndim - 1)))).astype(np.float32)
            hs[key] = hs[key] / np.outer(s, s)

        if "head" in hs:
            if not self.tied:
                group("head", ["output.weight"], "output_norm.weight", None)
            return new
        i = int(next(iter(hs)).split(".")[0])
        p = f"blk.{i}."
        hd, per_kv = c.head_dim, c.n_heads // c.n_kv_heads
        col = np.arange(c.n_heads * hd)
        kv = (col // hd // per_kv) * hd + col % hd  # o's input column -> v's output row
        # the producers' own scales first, so the groups after them see their final rows
        group(f"{i}.attn_out", [p + "attn_output.weight"], None, p + "attn_v", kv)
        group(f"{i}.ffn_mid", [p + "ffn_down.weight"], None, p + "ffn_up")
        qkv = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
        group(f"{i}.attn", qkv, p + "attn_norm.weight", None)
        group(f"{i}.ffn", [p + "ffn_gate.weight", p + "ffn_up.weight"], p + "ffn_norm.weight", None)
        return new

    def final(self, x: np.ndarray) -> np.ndarray:
        """The head's input for the last layer's output ``x``."""
        return self._norm(x, "output_norm.weight")

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        r = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + self.config.rms_eps)
        return (x * r * self._w(name)).astype(np.float32)

    def _proj(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self._w(name + ".weight").T
        return y + self._w(name + ".bias") if self.weights.has(name + ".bias") else y

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """x (T, heads, hd) rotated: adjacent pairs (GGUF llama) or halves (qwen2)."""
        t = len(x)
        if self.config.rope_interleaved:
            p = x.reshape(*x.shape[:-1], -1, 2)
            rot = np.stack([-p[..., 1], p[..., 0]], axis=-1).reshape(x.shape)
        else:
            a, b = np.split(x, 2, axis=-1)
            rot = np.concatenate([-b, a], axis=-1)
        return x * self.cos[:t, None] + rot * self.sin[:t, None]

    def _block(self, i: int, x: np.ndarray, hs: dict[str, np.ndarray] | None) -> np.ndarray:
        """Layer ``i`` on one window ``x`` (T, hidden); adds its inputs' X^T X to ``hs``
        (None: no statistics)."""
        c, p, t = self.config, f"blk.{i}.", len(x)
        nh, nkv, hd = c.n_heads, c.n_kv_heads, c.head_dim

        def add(k: str, v: np.ndarray) -> None:
            if hs is not None:
                hs[k] = hs[k] + _xtx(v) if k in hs else _xtx(v)

        h = self._norm(x, p + "attn_norm.weight")
        add("attn", h)
        q = self._rope(self._proj(h, p + "attn_q").reshape(t, nh, hd))
        k = self._rope(self._proj(h, p + "attn_k").reshape(t, nkv, hd))
        v = self._proj(h, p + "attn_v").reshape(t, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.float32(np.sqrt(hd))
        s = np.where(np.tri(t, dtype=bool)[None], s, -np.inf)
        a = np.exp(s - s.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", a, v).reshape(t, nh * hd).astype(np.float32)
        add("attn_out", o)
        x = x + self._proj(o, p + "attn_output")
        h = self._norm(x, p + "ffn_norm.weight")
        add("ffn", h)
        g, u = self._proj(h, p + "ffn_gate"), self._proj(h, p + "ffn_up")
        m = (g / (1.0 + np.exp(-g)) * u).astype(np.float32)
        add("ffn_mid", m)
        return (x + self._proj(m, p + "ffn_down")).astype(np.float32)


def _xtx(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return x.T @ x


def text_tokens(f: Any, text: str, n: int) -> list[int]:
    """The first ``n`` tokens of ``text`` with the model's tokenizer."""
    from ..tokenizer import Tokenizer

    if n < 1:
        raise ValueError(f"calib_tokens must be at least 1, got {n}")
    try:
        tok = Tokenizer.from_gguf(f)
    except (NotImplementedError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"calibration needs the model's tokenizer: {e}") from None
    ids = tok.encode(text)[:n]
    if not ids:
        raise ValueError("calibration text gives no tokens")
    return ids


@dataclass(frozen=True)
class Options:
    """How to calibrate: ``method`` (``METHODS``); ``damp``: added to X^T X's diagonal,
    relative to its mean; ``act_order``: GPTQ's columns loudest input first; ``importance``:
    ``mse`` scale choices weigh each column's error (round to nearest: X^T X's diagonal, as
    llama.cpp's importance matrix; GPTQ: ``gptq_importance``)."""

    method: str = METHOD
    damp: float = DAMP
    act_order: bool = False
    importance: bool = True


def describe(text: str, tokens: Sequence[int], opts: Options | None = None) -> dict[str, Any]:
    """What the output's ``CALIB_KEY`` metadata records."""
    opts = opts or Options()
    sha = hashlib.sha256(text.encode()).hexdigest()[:16]
    return {"method": opts.method, "tokens": len(tokens), "text_sha256": sha, "damp": opts.damp,
            "block": BLOCK, "act_order": opts.act_order,
            "importance": opts.importance}  # fmt: skip
