"""Nearest-neighbour resizing kept whole through AOTAutograd.

``F.interpolate(mode="nearest")`` reaches ATen as ``upsample_nearest*d.vec``, which PyTorch
decomposes in Python while tracing (whatever the decomposition table says): source indices
computed in float from the sizes, then a gather by them. A 2x resize, the common one (U-Nets,
VAE decoders, FPN necks), is a view that reads each row twice, and a convolution after it can
then read the smaller map in place; the gather hides that. So for inference graphs the dynamo
graph's ``interpolate`` calls in nearest mode become ``luminal::interpolate_nearest``, an op
AOTAutograd keeps whole (its eager kernel is ``F.interpolate`` itself), and its converter
picks each axis's source indices as PyTorch's CPU kernel does (``nearest_idx``): the same
index at equal sizes, ``i >> 1`` at twice the size, else ``min(floor(i * s), n_in - 1)`` in
float32 with ``s = 1 / scale`` where a scale is given, ``n_in / n_out`` otherwise. Training
graphs keep the decomposition (the op has no derivative).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as TF

from .. import functional as F
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..tensor import Tensor
from .convert import Ctx, named_op

_lib = torch.library.Library("luminal", "FRAGMENT")
_lib.define(
    "interpolate_nearest(Tensor x, SymInt[]? size, float[]? scale_factor, "
    "bool? recompute_scale_factor) -> Tensor"
)


def _eager(x: torch.Tensor, size: Sequence[Any] | None, scale_factor: Sequence[float] | None,
           recompute_scale_factor: bool | None) -> torch.Tensor:  # fmt: skip
    sizes = None if size is None else list(size)
    scales = None if scale_factor is None else list(scale_factor)
    return TF.interpolate(x, size=sizes, scale_factor=scales, mode="nearest",
                          recompute_scale_factor=recompute_scale_factor)  # fmt: skip


_lib.impl("interpolate_nearest", _eager, "CompositeExplicitAutograd")
torch.library.register_fake("luminal::interpolate_nearest", _eager, lib=_lib)


def _spatial(v: Any, nd: int, kind: type) -> list[Any] | None:
    """``size`` / ``scale_factor`` as F.interpolate takes them, one per spatial dim; None when
    not given or not a plain number (a tensor or a symbolic float keeps the call as it is)."""
    if v is None:
        return None
    vals = list(v) if isinstance(v, (list, tuple)) else [v] * nd
    if len(vals) != nd:
        return None
    if kind is float and all(isinstance(s, (int, float)) and not isinstance(s, bool)
                             for s in vals):  # fmt: skip
        return [float(s) for s in vals]
    if kind is int and all(isinstance(s, (int, torch.fx.Node)) and not isinstance(s, bool)
                           for s in vals):  # fmt: skip
        return vals
    return None


def keep_nearest_whole(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s nearest-mode ``F.interpolate`` calls to ``luminal::interpolate_nearest``
    in place; the number rewritten."""
    op = torch.ops.luminal.interpolate_nearest.default
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not TF.interpolate:
            continue
        names = ("input", "size", "scale_factor", "mode", "align_corners",
                 "recompute_scale_factor", "antialias")  # fmt: skip
        bound = dict(zip(names, n.args, strict=False)) | dict(n.kwargs)
        x = bound.get("input")
        val = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not 3 <= val.ndim <= 5:
            continue
        if bound.get("mode", "nearest") != "nearest" or bound.get("antialias", False):
            continue
        if bound.get("align_corners") is not None:
            continue
        nd = val.ndim - 2
        size = _spatial(bound.get("size"), nd, int)
        scale = _spatial(bound.get("scale_factor"), nd, float)
        if (size is None) == (scale is None):
            continue
        if scale is not None and not all(f.is_integer() for f in scale) and \
                not all(isinstance(d, int) for d in val.shape[2:]):  # fmt: skip
            continue  # floor(s * 1.7) of a symbolic s: a float size the plan has no dim for
        n.target = op
        n.args = (x, size, scale, bound.get("recompute_scale_factor"))
        n.kwargs = {}
        done += 1
    if done:
        gm.recompile()
    return done


def _equal(a: Any, b: Any) -> bool:
    return sym.add(a, sym.mul(b, -1)) == 0


def _nearest_axis(cx: Ctx, x: Tensor, axis: int, n_out: Any, scale: float | None) -> Tensor:
    n_in = x.shape[axis]
    if _equal(n_out, n_in):
        return x
    shape = list(x.shape)
    if _equal(n_out, sym.mul(n_in, 2)):  # each row read twice: a view
        pairs = x.unsqueeze(axis + 1).expand([*shape[: axis + 1], 2, *shape[axis + 1 :]])
        return pairs.reshape([*shape[:axis], n_out, *shape[axis + 1 :]])
    given = scale is not None and scale > 0
    if isinstance(n_in, int) and isinstance(n_out, int):
        s = np.float32(1.0 / scale) if given else np.float32(n_in) / np.float32(n_out)  # type: ignore[operator]
        src = np.floor(np.arange(n_out, dtype=np.float32) * s).astype(np.int64)
        idx = cx.g.tensor(np.minimum(src, n_in - 1))
    else:
        pos = F.arange(cx.g, n_out, dtype=dt.i64).cast(dt.f32)
        if given:
            step: Any = float(np.float32(1.0 / scale))  # type: ignore[operator]
        else:
            size_in = F._base.iota(cx.g, (), n_in, dt.i64).cast(dt.f32)
            step = size_in / F._base.iota(cx.g, (), n_out, dt.i64).cast(dt.f32)
        src_t = F.floor(pos * step).cast(dt.i64)
        idx = F.minimum(src_t, F._base.iota(cx.g, (), sym.add(n_in, -1), dt.i64))
    return F.index_select(x, axis, idx)


@named_op("luminal.interpolate_nearest.default")
def _interpolate_nearest(cx: Ctx, x: Tensor, size: Any, scale_factor: Any,
                         recompute_scale_factor: Any) -> Tensor:  # fmt: skip
    nd = x.ndim - 2
    # the kernel gets the scales F.interpolate passes it: none for a size or a recomputed one
    scales = list(scale_factor) if scale_factor is not None and not recompute_scale_factor \
        else [None] * nd  # fmt: skip
    out = cx.shape()
    for j in range(nd):
        axis = 2 + j
        x = _nearest_axis(cx, x, axis, out[axis], scales[j])
    return x
