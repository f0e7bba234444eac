"""RoPE tables for every scaling a transformers config carries (``rope_type``):

- default: frequencies ``theta ** (-2i / d)``;
- linear: default / factor;
- llama3: long wavelengths / factor, short ones kept, smooth in between;
- yarn: interpolated (/ factor) and extrapolated frequencies blended by a ramp over the
  dims; cos/sin times ``attention_factor`` (default 0.1 ln factor + 1);
- longrope (``su``): default / ``long_factor`` once the sequence passes the original
  context, else / ``short_factor``; cos/sin times sqrt(1 + ln factor / ln original);
- dynamic (NTK): the base grows past the original context M, for T tokens
  ``theta * (f T / M - f + 1) ** (d / (d - 2))``.

The last two depend on the sequence length T = pos + seq of the step (as transformers'
``dynamic_rope_update`` does with the largest position id + 1), so their tables are graph
expressions of the symbolic dims: one plan serves lengths on both sides of the switch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..functional import exp, log, where
from ..functional._base import iota
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..tensor import Tensor

KINDS = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")


def resolve_scaling(scaling: dict[str, Any] | None, max_positions: int) -> dict[str, Any] | None:
    """A config's ``rope_scaling`` made self-contained: ``rope_type`` named (``su`` is
    longrope), the factor and original context that transformers derives from
    ``max_position_embeddings`` filled in. None for plain RoPE; an unknown type is an error."""
    if not scaling:
        return None
    s = dict(scaling)
    kind = s.pop("type", None) or s.get("rope_type") or "default"
    kind = {"su": "longrope"}.get(kind, kind)
    if kind not in KINDS:
        raise NotImplementedError(f"rope scaling {kind!r} is not supported (supported: {KINDS})")
    if kind == "default":
        return None
    s["rope_type"] = kind
    s.pop("rope_theta", None)
    s.pop("partial_rotary_factor", None)
    if kind == "dynamic":  # transformers grows the base past max_position_embeddings
        s["original_max_position_embeddings"] = max_positions
    need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
            "original_max_position_embeddings"), "yarn": ("original_max_position_embeddings",),
            "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
            "dynamic": ("factor",)}[kind]  # fmt: skip
    missing = [k for k in need if s.get(k) is None]
    if missing:
        raise ValueError(f"rope scaling {kind!r} needs {', '.join(missing)}; got {scaling!r}")
    if kind in ("yarn", "longrope") and s.get("factor") is None:
        s["factor"] = max_positions / float(s["original_max_position_embeddings"])
    return s


def attention_factor(s: dict[str, Any] | None) -> float:
    """The scale applied to cos and sin (YaRN's and LongRoPE's attention factor)."""
    if not s or s["rope_type"] not in ("yarn", "longrope"):
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor = float(s["factor"])
    if factor <= 1:
        return 1.0
    if s["rope_type"] == "longrope":
        return math.sqrt(1 + math.log(factor) / math.log(s["original_max_position_embeddings"]))

    def mscale(m: float) -> float:
        return 0.1 * m * math.log(factor) + 1.0

    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(float(s["mscale"])) / mscale(float(s["mscale_all_dim"]))
    return mscale(1.0)


def inv_freq(dim: int, theta: float, s: dict[str, Any] | None, long: bool = False) -> np.ndarray:
    """The ``dim // 2`` inverse frequencies (float64) of a length-independent scaling;
    ``long`` picks LongRoPE's long factors. Dynamic NTK has none (see ``rope_tables``)."""
    exps = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv = 1.0 / theta**exps
    kind = s["rope_type"] if s else "default"
    if kind == "default":
        return inv
    assert s is not None
    if kind == "linear":
        return inv / float(s["factor"])
    if kind == "llama3":
        factor, lo = float(s["factor"]), float(s["low_freq_factor"])
        hi = float(s["high_freq_factor"])
        old = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        return np.where(wavelen > old / lo, inv / factor, np.where(wavelen < old / hi, inv, mid))
    if kind == "yarn":
        return _yarn(dim, theta, s)
    if kind == "longrope":
        ext = np.asarray(s["long_factor" if long else "short_factor"], np.float64)
        if ext.shape != inv.shape:
            raise ValueError(
                f"longrope: {ext.size} {'long' if long else 'short'} factors for {dim} rotated "
                f"dims (need {dim // 2})"
            )
        return inv / ext
    raise ValueError(f"rope scaling {kind!r} depends on the sequence length")


def _yarn(dim: int, theta: float, s: dict[str, Any]) -> np.ndarray:
    factor = float(s["factor"])
    orig = float(s["original_max_position_embeddings"])
    fast, slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def dim_of(rotations: float) -> float:  # the dim that turns ``rotations`` times over orig
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_of(fast), dim_of(slow)
    if s.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    base = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return (1 / (factor * base)) * ramp + (1 / base) * (1 - ramp)


def rope_tables(
    positions: Tensor,
    total: Any,
    dim: int,
    theta: float,
    interleaved: bool = False,
    scaling: dict[str, Any] | None = None,
) -> tuple[Tensor, Tensor]:
    """cos and sin (``positions.shape + (dim,)``, f32) for ``apply_rotary_emb``; ``total``
    is the sequence length the step reaches (pos + seq), which LongRoPE and dynamic NTK read.
    ``scaling`` is a ``resolve_scaling`` dict (or None)."""
    if dim % 2:
        raise ValueError(f"rope: rotated dims must be even, got {dim}")
    g = positions.graph
    kind = scaling["rope_type"] if scaling else "default"
    pos = positions.cast(dt.f32).unsqueeze(-1)
    if kind == "dynamic":
        assert scaling is not None
        factor, m = float(scaling["factor"]), int(scaling["original_max_position_embeddings"])
        length = iota(g, (1,), sym.maximum(total, m)).cast(dt.f32)
        # ln of the grown base over ln theta: inv_i = theta' ** (-2i/d), theta' as above
        grow = log(length.mul(factor / m).add(1.0 - factor))
        i2 = np.arange(0, dim, 2, dtype=np.float64)
        a = g.tensor((-(i2 / dim) * math.log(theta)).astype(np.float32))
        b = g.tensor((-i2 / (dim - 2)).astype(np.float32))
        inv = exp(a.add(b.mul(grow)))
        ang = pos.mul(inv)
    elif kind == "longrope":
        assert scaling is not None
        orig = int(scaling["original_max_position_embeddings"])
        short = g.tensor(inv_freq(dim, theta, scaling).astype(np.float32))
        long = g.tensor(inv_freq(dim, theta, scaling, long=True).astype(np.float32))
        past = iota(g, (1,), sym.lt(orig, total)).cast(dt.bool_)
        ang = pos.mul(where(past, long, short))
    else:
        ang = pos.mul(g.tensor(inv_freq(dim, theta, scaling).astype(np.float32)))
    half = dim // 2
    lead = list(ang.shape[:-1])
    if interleaved:
        ang = ang.unsqueeze(-1).expand([*lead, half, 2]).reshape([*lead, dim])
    else:
        ang = ang.unsqueeze(-2).expand([*lead, 2, half]).reshape([*lead, dim])
    sin = ang.sin()
    s2 = ang.mul(0.5).sin()
    cos = s2.mul(s2).mul(-2.0).add(1.0)  # 1 - 2 sin^2(x/2): exact at large x
    scale = attention_factor(scaling)
    if scale != 1.0:
        cos, sin = cos.mul(scale), sin.mul(scale)
    return cos, sin
