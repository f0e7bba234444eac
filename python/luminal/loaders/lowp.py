"""luminal's low-precision weight formats: fp8 (e4m3, e5m2) with per-channel or per-tensor f32
scales, int8 per-channel symmetric, OCP MX mxfp4 / mxfp8, nvfp4, bf16 and f16.

Each format is three things kept side by side: a reference **quantizer** (numpy, f32 rows ->
packed parts, with the rounding rule of the format's spec), a reference **dequantizer**
(numpy), and a **graph expression** over the packed parts, as the GGUF block formats in
``quants.py`` are: small-float codes are a GATHER from a 256- (or 16-) entry table of their
exact values, scales multiply once, so the search can fuse the whole expression into the matmul
that consumes it. A weight of shape (rows, cols) is a dict of *parts*, each a C-contiguous
array whose first dim is ``rows`` (per-row data and scales) or 1 (a per-tensor scale).

Rounding (all formats): round to nearest, ties to even, saturating at the element type's
largest finite value (OCP MX v1.0 section 6.3 for the MX formats; NVIDIA's nvfp4 recipe; the
``satfinite`` conversions).

Scales: each format's own rule, given with its layout below (a row's, block's or tensor's
largest magnitude maps to the element type's largest value), is ``scales="amax"``. The default,
``scales="mse"``, tries a few candidates around it and keeps, per row or block (per tensor for
``*_tensor``), the one whose dequantized values have the least squared error: fp8 and int8
scale the amax rule's by 1 down to 0.9 and 0.86; MX shared exponents e, e + 1 and e - 1;
nvfp4 block scales the e4m3 code of the rule and its neighbours, -2 to +1. Ties keep the amax
rule's; a kept scale is always one the amax rule gives back from the dequantized values, so
quantizing quantized values gives the same bytes. Layouts:

- ``fp8_e4m3`` / ``fp8_e5m2``: ``q`` u8 (rows, cols) codes, ``scale`` f32 (rows, 1) =
  amax(row) / max_finite; ``*_tensor`` variants: one scale (1, 1) for the tensor.
- ``int8``: ``q`` i8 (rows, cols) in [-127, 127], ``scale`` f32 (rows, 1) = amax(row) / 127.
- ``mxfp8``: ``q`` u8 e4m3 codes, ``e`` u8 (rows, cols / 32) e8m0 scales 2^(e - 127),
  e = floor(log2(amax(block))) - 8 + 127 clamped to [0, 254].
- ``mxfp4``: GGUF MXFP4 blocks (``blocks`` u8 (rows, cols / 32 * 17): e8m0 byte, 16 bytes of
  e2m1 codes, values 0..15 in the low nibbles, 16..31 in the high), e = floor(log2(amax)) - 2
  + 127; the file is a plain GGUF MXFP4 tensor.
- ``nvfp4``: GGUF NVFP4 blocks (``blocks`` u8 (rows, cols / 64 * 36): four e4m3 scales, one
  per 16 values, then 32 bytes of e2m1 codes) and ``scale`` f32 (1, 1) = amax(tensor) / (6 *
  448); block scale = e4m3(amax(block) / 6 / scale).
- ``bf16`` / ``f16``: ``data`` (rows, cols) of that type, cast to f32 in the graph.

Each quantizer is its format's ``Grid`` applied to the whole matrix at once: the scale rule,
the rounding with fixed scales, and the packing. Calibrated quantization (``quant.calibrate``)
uses the same three pieces a few columns at a time, so its output is the format's own bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import ml_dtypes
import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.symbolic import sint
from ..tensor import Graph, Tensor
from . import quants

_CHUNK = 1 << 14  # values per numpy pass in the quantizers' loops: temporaries stay in cache

# --------------------------------------------------------------------------- element types


@dataclass(frozen=True)
class SmallFloat:
    """A sign + ``eb`` exponent bits + ``mb`` mantissa bits float; ``ieee``: the top exponent
    is inf/NaN (e5m2); otherwise only the all-ones code is NaN (e4m3fn) or none is (e2m1)."""

    name: str
    eb: int
    mb: int
    bias: int
    ieee: bool
    nan_code: bool

    @property
    def bits(self) -> int:
        return 1 + self.eb + self.mb

    def decode(self, code: int) -> float:
        mag = code & ((1 << (self.eb + self.mb)) - 1)
        e, m = mag >> self.mb, mag & ((1 << self.mb) - 1)
        top = (1 << self.eb) - 1
        if self.ieee and e == top:
            v = float("nan") if m else float("inf")
        elif self.nan_code and mag == (1 << (self.eb + self.mb)) - 1:
            v = float("nan")
        elif e == 0:
            v = m * 2.0 ** (1 - self.bias - self.mb)
        else:
            v = (1 + m / (1 << self.mb)) * 2.0 ** (e - self.bias)
        return -v if code >> (self.eb + self.mb) else v

    @cached_property
    def table(self) -> list[float]:
        """f32 value of every code (what the graph gathers from)."""
        return [self.decode(c) for c in range(1 << self.bits)]

    @cached_property
    def max_finite(self) -> float:
        return max(v for v in self.table if np.isfinite(v))

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value (OCP MX's emax_elem)."""
        return int(np.floor(np.log2(self.max_finite)))

    def round(self, x: np.ndarray) -> np.ndarray:
        """Nearest representable value, ties to even, saturating at +-max_finite; f32 in, f32
        out, any other input in float64."""
        x = np.asarray(x)
        ft, ut, mbits, ebias = (
            (np.float32, np.uint32, 23, 127) if x.dtype == np.float32
            else (np.float64, np.uint64, 52, 1023)
        )  # fmt: skip
        a = np.abs(x.astype(ft, copy=False))
        # The grid step near a is 2^(E - mb), E = a's exponent within [1 - bias, emax]. The sum
        # a + c, c = 2^(E - mb + mbits), has that step as its ulp: the float addition rounds a
        # to the grid, ties to even, and subtracting c is exact.
        e = np.clip(a.view(ut) >> ut(mbits), ebias + 1 - self.bias, ebias + self.emax)
        c = ((e + ut(mbits - self.mb)) << ut(mbits)).view(ft)
        q = (a + c) - c
        return np.copysign(np.minimum(q, ft(self.max_finite)), x)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Codes (u8) of the rounded values of ``x`` (finite)."""
        x = np.asarray(x)
        flat, out = x.reshape(-1), np.empty(x.size, np.uint8)
        for lo in range(0, x.size, _CHUNK):  # whole-tensor temporaries would miss the cache
            out[lo : lo + _CHUNK] = self._encode(flat[lo : lo + _CHUNK])
        return out.reshape(x.shape)

    def _encode(self, x: np.ndarray) -> np.ndarray:
        q = self.round(x)
        a = np.abs(q)
        _, ex = np.frexp(a)
        e = np.maximum(ex - 1, 1 - self.bias)  # the exponent field is e + bias, 0 if subnormal
        m = np.ldexp(a, self.mb - e).astype(np.int64)  # 2^mb + mantissa (normal), else m
        normal = a >= 2.0 ** (1 - self.bias)
        mag = np.where(normal, ((e + self.bias) << self.mb) + m - (1 << self.mb), m)
        sign = np.signbit(q).astype(np.int64) << (self.eb + self.mb)
        return (mag | sign).astype(np.uint8)


E4M3 = SmallFloat("e4m3", 4, 3, 7, ieee=False, nan_code=True)
E5M2 = SmallFloat("e5m2", 5, 2, 15, ieee=True, nan_code=False)
E2M1 = SmallFloat("e2m1", 2, 1, 1, ieee=False, nan_code=False)
E8M0 = [float("nan") if c == 255 else float(np.ldexp(1.0, c - 127)) for c in range(256)]

# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Part:
    name: str
    dtype: np.dtype
    per_row: bool  # leading dim is the weight's rows (gathered for embedding rows), else 1


class Quantizer(Protocol):
    def __call__(self, x: np.ndarray, scales: str = "mse",
                 importance: np.ndarray | None = None) -> dict[str, np.ndarray]: ...  # fmt: skip


@dataclass(frozen=True)
class Grid:
    """A format's rounding split at its scales, for one weight: ``group`` adjacent columns of
    a row share a scale (the row length for per-row and per-tensor scales). ``scale(v, imp)``:
    the quantizer's scale rule for values v (rows, k * group) -> scales (rows or 1, k), ``imp``
    (k * group,) or None weighing each column's squared error in ``mse``'s choice; ``fake(v,
    s)``: the dequantized values of v (rows, m <= group) rounded with one group's scales s
    (rows or 1, 1); ``pack(v, s)``: the parts of v (rows, cols) given all its scales."""

    group: int
    scale: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
    fake: Callable[[np.ndarray, np.ndarray], np.ndarray]
    pack: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


# A format's Grid for weight x (rows, cols) and a scale rule (SCALES); a tensor-wide scale
# (nvfp4's) is taken from x here, not from the values the scale rule later sees.
GridFor = Callable[[np.ndarray, str], Grid]


def _whole(fmt: str, block: int, grid: GridFor) -> Quantizer:
    """The quantizer of a format: its grid's scales for the whole matrix, then its packing."""

    def quantize(x: np.ndarray, scales: str = "mse",
                 importance: np.ndarray | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        x = _rows2d(x, fmt, block, scales)
        if importance is not None and importance.shape != (x.shape[1],):
            raise ValueError(f"{fmt}: importance is {importance.shape}, x has {x.shape[1]} columns")
        g = grid(x, scales)
        return g.pack(x, g.scale(x, importance))

    return quantize


@dataclass(frozen=True)
class LowpFormat:
    name: str
    block: int  # columns must be a multiple of this
    parts: tuple[Part, ...]  # the first is the weight's own tensor in a file
    bits: float  # bits per weight, scales included (for a 4096-column row)
    quantize: Quantizer  # f32 (rows, cols) -> parts; ``scales``: one of SCALES
    dequantize: Callable[[dict[str, np.ndarray]], np.ndarray]
    build: Callable[[Graph, dict[str, Tensor], sint, int], Tensor]
    gguf_type: str | None = None  # a plain GGUF tensor of this type when set
    grid: GridFor | None = None  # None: no scales to fix (bf16, f16)


def _rows2d(x: np.ndarray, fmt: str, block: int, scales: str) -> np.ndarray:
    if scales not in SCALES:
        raise ValueError(f"{fmt}: scales must be one of {', '.join(SCALES)}, got {scales!r}")
    x = np.asarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"{fmt}: quantize takes a 2-D (rows, cols) array, got shape {x.shape}")
    if x.shape[1] % block:
        raise ValueError(
            f"{fmt}: row length {x.shape[1]} is not a multiple of the {fmt} block ({block})"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{fmt}: cannot quantize NaN or infinite values")
    return x


def _amax_scale(x: np.ndarray, vmax: float, per_row: bool) -> np.ndarray:
    amax = np.abs(x).max(axis=1, keepdims=True) if per_row else np.abs(x).max(keepdims=True)
    s = (amax / np.float32(vmax)).astype(np.float32)
    return np.where(s > 0, s, np.float32(1.0)).astype(np.float32)  # an all-zero row: any scale


SCALES = ("mse", "amax")  # how the quantizers choose scales (see the module's docstring)


def _errors(x: np.ndarray, group: int, cands: Sequence[np.ndarray],
            fake: Callable[[np.ndarray, np.ndarray], np.ndarray],
            imp: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """(candidates, rows, cols / group) squared errors: per candidate ``c`` (an array whose
    first dim is rows, or 1 when shared), per ``group`` adjacent values of a row, the squared
    error of ``fake(x, c)`` (the dequantized values of x quantized with c) in f64, each
    column's weighted by ``imp`` (cols,) when given (its input's mean square: the diagonal of
    the output error)."""
    wt = None if imp is None else np.sqrt(np.maximum(imp, 0)).reshape(-1, group)
    rows, cols = x.shape
    err = np.empty((len(cands), rows, cols // group))
    step = max(1, _CHUNK // cols)
    for lo in range(0, rows, step):
        xs = x[lo : lo + step]
        for k, c in enumerate(cands):
            r = fake(xs, c if c.shape[0] == 1 else c[lo : lo + step]) - xs
            r = r.reshape(len(xs), -1, group)
            if wt is not None:
                r = r * wt
            err[k, lo : lo + step] = np.einsum("ijk,ijk->ij", r, r, dtype=np.float64)
    return err


def _choose(err: np.ndarray, cands: Sequence[np.ndarray]) -> np.ndarray:
    """Per group, the candidate of least error (np.argmin: the first of equals)."""
    best = np.argmin(err, axis=0)
    return np.take_along_axis(np.stack(cands), best[None], axis=0)[0]


_lookup = quants._lookup


def _per_block(s: Tensor, rows: sint, cols: int, block: int) -> Tensor:
    """(rows, cols / block) -> (rows, cols), each scale repeated over its block."""
    return s.reshape(rows, cols // block, 1).expand(rows, cols // block, block).reshape(rows, cols)


# fp8 with f32 scales ------------------------------------------------------------------------


def _search_scale(x: np.ndarray, s: np.ndarray, mults: np.ndarray,
                  fake: Callable[[np.ndarray, np.ndarray], np.ndarray],
                  imp: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The f32 scale of least error among ``s * mults`` (mults[0] = 1: the amax rule), per row
    for ``s`` (rows, 1), for the tensor for ``s`` (1, 1). Multipliers below 1 clip the row's
    largest values to the top code, so its amax still gives the chosen scale back."""
    cands = [(s * np.float32(m)).astype(np.float32) for m in mults]
    err = _errors(x, x.shape[1], cands, fake, imp)
    if s.shape[0] == 1:
        return cands[int(np.argmin(err.sum(axis=(1, 2))))]
    return _choose(err, cands)


# multipliers of amax / max_finite: a float format's error is nearly scale invariant, so the
# search only moves the binade boundaries (and the saturation point) against the row's values
_FP8_MULTS = np.linspace(1.0, 0.9, 6)


def _fp8(name: str, et: SmallFloat, per_row: bool) -> LowpFormat:
    def fake(x: np.ndarray, s: np.ndarray) -> np.ndarray:
        return et.round(x / s) * s

    def grid(x: np.ndarray, scales: str) -> Grid:
        def scale(v: np.ndarray, imp: np.ndarray | None = None) -> np.ndarray:
            s = _amax_scale(v, et.max_finite, per_row)
            return _search_scale(v, s, _FP8_MULTS, fake, imp) if scales == "mse" else s

        return Grid(x.shape[1], scale, fake, lambda v, s: {"q": et.encode(v / s), "scale": s})

    def dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
        v = np.asarray(et.table, np.float32)[p["q"]]
        return v * p["scale"]

    def build(g: Graph, w: dict[str, Tensor], rows: sint, cols: int) -> Tensor:
        return _lookup(g, et.table, w["q"]).mul(w["scale"])

    parts = (Part("q", np.dtype(np.uint8), True), Part("scale", np.dtype(np.float32), per_row))
    bits = 8 + (32 / 4096 if per_row else 0)
    return LowpFormat(name, 1, parts, bits, _whole(name, 1, grid), dequantize, build, grid=grid)


# int8 per channel ---------------------------------------------------------------------------


def _int8_codes(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x.astype(np.float64) / s), -127, 127)


_INT8_MULTS = np.linspace(1.0, 0.86, 8)  # clipping the row's outliers for a finer step


def _int8_fake(v: np.ndarray, s: np.ndarray) -> np.ndarray:
    return _int8_codes(v, s).astype(np.float32) * s


def _int8_grid(x: np.ndarray, scales: str) -> Grid:
    def scale(v: np.ndarray, imp: np.ndarray | None = None) -> np.ndarray:
        s = _amax_scale(v, 127.0, True)
        return _search_scale(v, s, _INT8_MULTS, _int8_fake, imp) if scales == "mse" else s

    def pack(v: np.ndarray, s: np.ndarray) -> dict[str, np.ndarray]:
        return {"q": _int8_codes(v, s).astype(np.int8), "scale": s}

    return Grid(x.shape[1], scale, _int8_fake, pack)


def _int8_dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
    return p["q"].astype(np.float32) * p["scale"]


def _int8_build(g: Graph, w: dict[str, Tensor], rows: sint, cols: int) -> Tensor:
    return w["q"].cast(dt.f32).mul(w["scale"])


# OCP MX -------------------------------------------------------------------------------------


def _mx_exponent(x: np.ndarray, block: int, et: SmallFloat, scales: str,
                 imp: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Shared e8m0 byte per block: floor(log2(amax)) - emax_elem + 127, in [0, 254] (the
    amax rule); with "mse", that, one more (a block amax that the rule saturates fits) or one
    less (a finer grid for the rest, the amax clipped to the top code)."""
    amax = np.abs(x.reshape(x.shape[0], -1, block)).max(axis=-1).astype(np.float64)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - et.emax, -127)
    e = np.clip(e + 127, 0, 254).astype(np.int64)
    if scales == "mse":

        def fake(v: np.ndarray, c: np.ndarray) -> np.ndarray:
            s = np.ldexp(np.float32(1.0), c - 127).astype(np.float32)[..., None]
            vb = v.reshape(len(v), -1, block)
            return (et.round(vb / s) * s).reshape(v.shape)  # x / 2^k is exact in f32

        cands = [np.clip(e + o, 0, 254) for o in (0, 1, -1)]
        e = _choose(_errors(x, block, cands, fake, imp), cands)
    return e.astype(np.uint8)


def _mx_elements(x: np.ndarray, e: np.ndarray, block: int, et: SmallFloat) -> np.ndarray:
    scale = np.ldexp(1.0, e.astype(np.int64) - 127)
    xs = x.reshape(x.shape[0], -1, block).astype(np.float64) / scale[..., None]
    return et.encode(xs).reshape(x.shape)


def _mx_grid(et: SmallFloat, pack: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]],
             x: np.ndarray, scales: str) -> Grid:  # fmt: skip
    def fake(v: np.ndarray, e: np.ndarray) -> np.ndarray:
        s = np.ldexp(1.0, e.astype(np.int64) - 127)
        return et.round(v.astype(np.float64) / s).astype(np.float32) * s.astype(np.float32)

    def scale(v: np.ndarray, imp: np.ndarray | None = None) -> np.ndarray:
        return _mx_exponent(v, 32, et, scales, imp)

    return Grid(32, scale, fake, pack)


def _mxfp8_grid(x: np.ndarray, scales: str) -> Grid:
    return _mx_grid(E4M3, lambda v, e: {"q": _mx_elements(v, e, 32, E4M3), "e": e}, x, scales)


def _mxfp8_dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
    v = np.asarray(E4M3.table, np.float32)[p["q"]]
    s = np.asarray(E8M0, np.float32)[p["e"]]
    return v * np.repeat(s, 32, axis=1)


def _mxfp8_build(g: Graph, w: dict[str, Tensor], rows: sint, cols: int) -> Tensor:
    s = _per_block(_lookup(g, E8M0, w["e"]), rows, cols, 32)
    return _lookup(g, E4M3.table, w["q"]).mul(s)


def _pack_nibbles(codes: np.ndarray, half: int) -> np.ndarray:
    """(n, 2 * half) codes -> (n, half) bytes: codes [0, half) low nibbles, the rest high."""
    return (codes[:, :half] | (codes[:, half:] << 4)).astype(np.uint8)


def _unpack_nibbles(b: np.ndarray) -> np.ndarray:
    return np.concatenate([b & 15, b >> 4], axis=-1)


def _mxfp4_pack(x: np.ndarray, e: np.ndarray) -> dict[str, np.ndarray]:
    rows, cols = x.shape
    codes = _mx_elements(x, e, 32, E2M1).reshape(-1, 32)
    blocks = np.concatenate([e.reshape(-1, 1), _pack_nibbles(codes, 16)], axis=1)
    return {"blocks": blocks.reshape(rows, cols // 32 * 17)}


def _mxfp4_grid(x: np.ndarray, scales: str) -> Grid:
    return _mx_grid(E2M1, _mxfp4_pack, x, scales)


def _mxfp4_dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
    b = p["blocks"].reshape(-1, 17)
    v = np.asarray(E2M1.table, np.float32)[_unpack_nibbles(b[:, 1:])]
    s = np.asarray(E8M0, np.float32)[b[:, :1]]
    return (v * s).reshape(p["blocks"].shape[0], -1)


def _mxfp4_build(g: Graph, w: dict[str, Tensor], rows: sint, cols: int) -> Tensor:
    f = quants.FORMATS["MXFP4"]
    return f.build(g, {"u8": w["blocks"]}, sym.mul(rows, cols // 32)).reshape(rows, cols)


# nvfp4 --------------------------------------------------------------------------------------


_E4M3_F64, _E4M3_F32 = np.asarray(E4M3.table, np.float64), np.asarray(E4M3.table, np.float32)
_NVFP4_STEPS = (0, -1, 1, -2)  # e4m3 block-scale codes around the amax rule's


def _nvfp4_scaled(xb: np.ndarray, dv: np.ndarray) -> np.ndarray:
    """Blocks ``xb`` (..., 16) over their scales ``dv`` (..., 1), in f64 (0 where dv is)."""
    xb = xb.astype(np.float64)
    return np.divide(xb, dv, out=np.zeros_like(xb), where=dv > 0)


def _nvfp4_search(x: np.ndarray, d: np.ndarray, t: np.ndarray, tmax: float,
                  imp: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The e4m3 block-scale codes of least error among ``d``'s neighbours, per block. A
    candidate must still round its block's amax to 6, so the amax rule gives it back from the
    dequantized block; a block holding the tensor's amax ``tmax`` keeps its code (and the
    tensor scale its value)."""
    rows, cols = x.shape
    t64 = np.float64(t[0, 0])
    amax = np.abs(x.reshape(rows, -1, 16)).max(axis=-1).astype(np.float64)

    def fake(v: np.ndarray, c: np.ndarray) -> np.ndarray:
        q = E2M1.round(_nvfp4_scaled(v.reshape(len(v), -1, 16), _E4M3_F64[c][..., None] * t64))
        return ((q.astype(np.float32) * _E4M3_F32[c][..., None]).reshape(v.shape)) * t

    d = d.reshape(rows, -1).astype(np.int64)
    cands = [np.clip(d + o, 0, 0x7E) for o in _NVFP4_STEPS]
    err = _errors(x, 16, cands, fake, imp)
    keep = amax == tmax
    for k, c in enumerate(cands[1:], 1):
        dv = _E4M3_F64[c] * t64
        top = E2M1.round(np.divide(amax, dv, out=np.zeros_like(amax), where=dv > 0)) == 6
        err[k][keep | ~top] = np.inf
    return _choose(err, cands).astype(np.uint8).reshape(-1)


def _nvfp4_grid(x: np.ndarray, scales: str) -> Grid:
    """Block scales (rows, cols / 16) are e4m3 codes; the tensor scale is x's."""
    t = _amax_scale(x, 6.0 * E4M3.max_finite, per_row=False)  # (1, 1)
    t64, tmax = np.float64(t[0, 0]), float(np.abs(x).max())

    def scale(v: np.ndarray, imp: np.ndarray | None = None) -> np.ndarray:
        xb = v.reshape(-1, 16).astype(np.float64)
        d = E4M3.encode(np.abs(xb).max(axis=1) / 6.0 / t64)  # positive codes
        if scales == "mse":
            d = _nvfp4_search(v, d, t, tmax, imp)
        return d.reshape(v.shape[0], -1)

    def fake(v: np.ndarray, d: np.ndarray) -> np.ndarray:
        q = E2M1.round(_nvfp4_scaled(v, _E4M3_F64[d] * t64)).astype(np.float32)
        return (q * _E4M3_F32[d]) * t

    def pack(v: np.ndarray, d: np.ndarray) -> dict[str, np.ndarray]:
        rows, cols = v.shape
        d = d.reshape(-1)
        xb = v.reshape(-1, 16).astype(np.float64)
        codes = E2M1.encode(_nvfp4_scaled(xb, _E4M3_F64[d][:, None] * t64))
        qs = _pack_nibbles(codes, 8).reshape(-1, 32)
        blocks = np.concatenate([d.reshape(-1, 4), qs], axis=1)
        return {"blocks": blocks.reshape(rows, cols // 64 * 36), "scale": t}

    return Grid(16, scale, fake, pack)


def _nvfp4_dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
    b = p["blocks"].reshape(-1, 36)
    v = np.asarray(E2M1.table, np.float32)[_unpack_nibbles(b[:, 4:].reshape(-1, 8))]
    d = np.asarray(E4M3.table, np.float32)[b[:, :4].reshape(-1, 1)]
    return (v * d).reshape(p["blocks"].shape[0], -1) * p["scale"]


def _nvfp4_build(g: Graph, w: dict[str, Tensor], rows: sint, cols: int) -> Tensor:
    f = quants.FORMATS["NVFP4"]
    y = f.build(g, {"u8": w["blocks"]}, sym.mul(rows, cols // 64)).reshape(rows, cols)
    return y.mul(w["scale"])


# bf16 / f16 ---------------------------------------------------------------------------------


def _half(name: str, np_type: type) -> LowpFormat:
    def quantize(x: np.ndarray, scales: str = "mse",
                 importance: np.ndarray | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        return {"data": _rows2d(x, name, 1, scales).astype(np_type)}  # no scales: nearest even

    def dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
        return p["data"].astype(np.float32)

    def build(g: Graph, w: dict[str, Tensor], rows: sint, cols: int) -> Tensor:
        return w["data"].cast(dt.f32)

    parts = (Part("data", np.dtype(np_type), True),)
    return LowpFormat(name, 1, parts, 16, quantize, dequantize, build, name.upper())


_U8, _F32 = np.dtype(np.uint8), np.dtype(np.float32)
FORMATS: dict[str, LowpFormat] = {
    f.name: f
    for f in (
        _fp8("fp8_e4m3", E4M3, per_row=True),
        _fp8("fp8_e5m2", E5M2, per_row=True),
        _fp8("fp8_e4m3_tensor", E4M3, per_row=False),
        _fp8("fp8_e5m2_tensor", E5M2, per_row=False),
        LowpFormat("int8", 1, (Part("q", np.dtype(np.int8), True), Part("scale", _F32, True)),
                   8 + 32 / 4096, _whole("int8", 1, _int8_grid), _int8_dequantize, _int8_build,
                   grid=_int8_grid),
        LowpFormat("mxfp8", 32, (Part("q", _U8, True), Part("e", _U8, True)), 8.25,
                   _whole("mxfp8", 32, _mxfp8_grid), _mxfp8_dequantize, _mxfp8_build,
                   grid=_mxfp8_grid),
        LowpFormat("mxfp4", 32, (Part("blocks", _U8, True),), 4.25,
                   _whole("mxfp4", 32, _mxfp4_grid), _mxfp4_dequantize, _mxfp4_build, "MXFP4",
                   grid=_mxfp4_grid),
        LowpFormat("nvfp4", 64, (Part("blocks", _U8, True), Part("scale", _F32, False)), 4.5,
                   _whole("nvfp4", 64, _nvfp4_grid), _nvfp4_dequantize, _nvfp4_build,
                   grid=_nvfp4_grid),
        _half("bf16", ml_dtypes.bfloat16),
        _half("f16", np.float16),
    )
}  # fmt: skip


def get(fmt: str) -> LowpFormat:
    f = FORMATS.get(fmt)
    if f is None:
        raise ValueError(f"unknown low-precision format {fmt!r} (known: {', '.join(FORMATS)})")
    return f


def check_parts(fmt: LowpFormat, parts: dict[str, np.ndarray], shape: tuple[int, int],
                what: str) -> None:  # fmt: skip
    """Raise a ValueError naming ``what`` unless ``parts`` are ``fmt``'s for ``shape``."""
    rows, cols = shape
    if cols % fmt.block:
        raise ValueError(
            f"{what}: row length {cols} is not a multiple of the {fmt.name} block ({fmt.block})"
        )
    ref = fmt.quantize(np.zeros((1, cols), np.float32))
    for p in fmt.parts:
        a = parts.get(p.name)
        if a is None:
            raise ValueError(f"{what}: {fmt.name} needs a part {p.name!r}, got {sorted(parts)}")
        want = ((rows if p.per_row else 1), ref[p.name].shape[1])
        if a.shape != want or a.dtype != p.dtype:
            raise ValueError(
                f"{what}: {fmt.name} part {p.name!r} is {a.dtype}{list(a.shape)}, "
                f"needs {p.dtype}{list(want)}"
            )


def weight(g: Graph, name: str, fmt: str, parts: dict[str, np.ndarray],
           shape: tuple[int, int]) -> Tensor:  # fmt: skip
    """The f32 (rows, cols) expression of a weight stored as ``fmt``'s ``parts`` (mapped
    arrays); registers each part as a weight ``<name>#<part>`` of ``g``."""
    f = get(fmt)
    check_parts(f, parts, shape, f"tensor {name!r}")
    return f.build(g, _inputs(g, name, f, parts), shape[0], shape[1])


def rows(g: Graph, name: str, fmt: str, parts: dict[str, np.ndarray], shape: tuple[int, int],
         idx: Tensor) -> Tensor:  # fmt: skip
    """``weight[idx]`` as (len(idx), cols) f32: GATHER the per-row parts, then dequantize."""
    f = get(fmt)
    check_parts(f, parts, shape, f"tensor {name!r}")
    ws = _inputs(g, name, f, parts)
    picked = {
        p.name: Tensor(g.add_op(Op.GATHER, [ws[p.name].edge, idx.edge])) if p.per_row
        else ws[p.name]
        for p in f.parts
    }  # fmt: skip
    return f.build(g, picked, idx.numel(), shape[1])


def _inputs(g: Graph, name: str, f: LowpFormat, parts: dict[str, np.ndarray]) -> dict[str, Tensor]:
    ws = {}
    for p in f.parts:
        wname = f"{name}#{p.name}"
        ws[p.name] = (
            Tensor(g.inputs[wname]) if wname in g.inputs else g.weight(wname, data=parts[p.name])
        )
    return ws


def dequantize(fmt: str, parts: dict[str, np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """Run the graph expression with the reference interpreter (tests, tools)."""
    g = Graph(f"dequant_{fmt}")
    g.output("y", weight(g, "w", fmt, parts, shape))
    return g.run()["y"]
