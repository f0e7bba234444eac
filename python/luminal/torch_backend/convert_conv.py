"""Converters of convolution, pooling and resampling: ``convolution`` (transposed too), max
pooling with its indices and their backward, average and adaptive pooling, antialiased bilinear
upsampling and 3-D grid sampling. Same contract as ``convert.py``: arguments arrive as luminal
values, ``Unsupported`` sends a node to eager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import functional as F
from ..functional._base import prod
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.view import idx_vars
from ..tensor import Tensor
from .convert import Ctx, op, output_used
from .symbols import Unsupported

aten = torch.ops.aten


# ----------------------------------------------------------------------------- convolution, pooling
@op(aten.convolution.default)
def _convolution(cx: Ctx, x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any,
                 dilation: Any, transposed: bool, output_padding: Any, groups: int
                 ) -> Tensor:  # fmt: skip
    nd = w.ndim - 2
    if transposed:
        fns = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
        if nd not in fns:
            raise Unsupported(f"conv_transpose{nd}d")
        return fns[nd](x, w, b, list(stride), list(padding), list(output_padding), groups,
                       list(dilation))  # fmt: skip
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(nd)
    if fn is None:
        raise Unsupported(f"conv{nd}d")
    return fn(x, w, b, list(stride), list(padding), list(dilation), groups)


@op(aten.max_pool2d_with_indices.default, aten.max_pool1d_with_indices.default)
def _max_pool(cx: Ctx, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> tuple:  # fmt: skip
    nd = len(kernel)
    if cx.node is not None and any(u.args[1] == 1 for u in cx.node.users):  # the indices
        return max_pool_indices(cx, x, kernel, stride, padding, dilation, nd)
    fn = F.max_pool2d if nd == 2 else F.max_pool1d
    return fn(x, list(kernel), list(stride) or None, padding, dilation, ceil_mode), None


@op(aten.avg_pool2d.default)
def _avg_pool2d(cx: Ctx, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Any = None) -> Tensor:  # fmt: skip
    return F.avg_pool2d(x, list(kernel), list(stride) or None, padding, ceil_mode,
                        count_include_pad, divisor_override)  # fmt: skip


@op(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(cx: Ctx, x: Tensor, output_size: Sequence[int]) -> Tensor:
    return F.adaptive_avg_pool2d(x, list(output_size))


def max_pool_indices(cx: Ctx, x: Tensor, kernel: Any, stride: Any, padding: Any, dilation: Any,
                     nd: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(values, indices) of a max pool, the output sizes as torch computed them: each window
    gathered (positions in the padding masked to -inf), the index the first maximum's flat
    position over the input's spatial dims in the window's row-major order."""

    def per_dim(v: Any) -> list[int]:
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return v * nd if len(v) == 1 else v

    ks, pd, dl = per_dim(kernel), per_dim(padding), per_dim(dilation)
    st = per_dim(stride) if stride else ks
    spatial = [v for v in x.shape[x.ndim - nd :] if isinstance(v, int)]
    outs = [v for v in cx.shape(0)[-nd:] if isinstance(v, int)]
    if len(spatial) != nd or len(outs) != nd or not x.dtype.is_float:
        raise Unsupported("max pool indices over symbolic sizes or a non-float input")
    shape: list[int] = []
    for o, k in zip(outs, ks, strict=True):
        shape += [o, k]
    iv = idx_vars(tuple(shape))
    flat: Any = 0
    valid: Any = 1
    stride_flat = 1
    for d in range(nd - 1, -1, -1):
        o_v, k_v = iv[2 * d], iv[2 * d + 1]
        pos = sym.add(sym.add(sym.mul(o_v, st[d]), -pd[d]), sym.mul(k_v, dl[d]))
        inside = sym.mul(sym.add(1, sym.mul(sym.lt(pos, 0), -1)), sym.lt(pos, spatial[d]))
        valid = sym.mul(valid, inside)
        pos = sym.minimum(sym.maximum(pos, 0), spatial[d] - 1)
        flat = sym.add(flat, sym.mul(pos, stride_flat))
        stride_flat *= spatial[d]
    g = cx.g
    idx = F._base.iota(g, tuple(shape), flat, dt.i64)
    ok = F._base.iota(g, tuple(shape), valid, dt.i32).cast(dt.bool_)
    lead = list(x.shape[: x.ndim - nd])
    xs = x.reshape([*lead, stride_flat])
    win = xs.index_select(-1, idx.reshape((F._base.prod(shape),))).reshape([*lead, *shape])
    okx = ok.expand(win.shape)
    win = F.where(okx, win, -math.inf)
    kaxes = [len(lead) + 2 * k + 1 for k in range(nd)]
    vals = win.max_reduce(kaxes, keepdim=True)
    hit = F.logical_and(F.logical_or(F.eq(win, vals.expand(win.shape)), F.isnan(win)), okx)
    big = F._base.iota(g, win.shape, stride_flat, dt.i64)
    ind = F.where(hit, idx.expand(win.shape), big).amin(kaxes)
    return vals.reshape(ind.shape), ind


# ----------------------------------------------------------------------------- adaptive pooling
@op(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max(cx: Ctx, x: Tensor, output_size: Any) -> tuple:
    nd = len(output_size)
    name = f"adaptive_max_pool{nd}d"
    if output_used(cx, 1):
        spatial = x.shape[x.ndim - nd :]
        if not all(isinstance(v, int) for v in spatial):
            raise Unsupported(f"{name} indices over symbolic sizes")
        return tuple(F.adaptive_max_pool_indices(name, x, list(output_size), nd))
    return F.conv._adaptive(name, x, list(output_size), nd, True), None


@op(aten._adaptive_avg_pool3d.default)
def _adaptive_avg3d(cx: Ctx, x: Tensor, output_size: Any) -> Tensor:
    return F.conv._adaptive("adaptive_avg_pool3d", x, list(output_size), 3, False)


@op(aten.avg_pool3d.default)
def _avg_pool3d(cx: Ctx, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Any = None) -> Tensor:  # fmt: skip
    return F.conv._pool("avg_pool3d", x, list(kernel), list(stride) or None, padding, 1,
                        ceil_mode, 3, False, count_include_pad, divisor_override)  # fmt: skip


@op(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(cx: Ctx, grad: Tensor, x: Tensor, kernel: Any, stride: Any, padding: Any,
                       dilation: Any, ceil_mode: bool, indices: Tensor) -> Tensor:  # fmt: skip
    """Each output's gradient added at its maximum's flat index in its (n, c) plane."""
    nd = len(kernel)
    if x.ndim <= nd or grad.ndim != x.ndim or indices.ndim != x.ndim:
        raise Unsupported(f"max pooling backward of {x.shape}")
    lead = list(x.shape[:-nd])
    plane = [*lead, -1]
    zeros = F.full(cx.g, [*lead, prod(x.shape[-nd:])], 0, dtype=grad.dtype)
    out = F.scatter_add(zeros, -1, indices.reshape(plane), grad.reshape(plane))
    return out.reshape(x.shape)


# ----------------------------------------------------------------------------- resampling
def _aa_weights(n_in: int, n_out: int, scale_opt: Any) -> np.ndarray:
    """(n_out, n_in) antialiased bilinear (triangle filter) weights, PyTorch's and PIL's:
    the filter widens by the scale when downsampling, each row normalized to sum 1."""
    scale = 1.0 / scale_opt if scale_opt else n_in / n_out
    support = scale if scale >= 1.0 else 1.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        xs = (np.arange(lo, hi) - center + 0.5) * inv
        row = np.clip(1.0 - np.abs(xs), 0.0, None)
        total = row.sum()
        w[i, lo:hi] = row / total if total != 0 else row
    return w


@op(aten._upsample_bilinear2d_aa.default)
def _upsample_aa(cx: Ctx, x: Tensor, output_size: Sequence[int], align_corners: bool,
                 scales_h: Any = None, scales_w: Any = None) -> Tensor:  # fmt: skip
    """Antialiased bilinear resizing as two products with constant (static-size) weights."""
    if align_corners or x.ndim != 4:
        raise Unsupported("antialiased upsampling with align_corners")
    h, w = x.shape[-2], x.shape[-1]
    if not isinstance(h, int) or not isinstance(w, int):
        raise Unsupported("antialiased upsampling of symbolic sizes")
    oh, ow = (int(v) for v in output_size)
    d = x.dtype if x.dtype.is_float else dt.f32
    wh = cx.g.tensor(_aa_weights(h, oh, scales_h).astype(np.float32)).cast(d)
    ww = cx.g.tensor(_aa_weights(w, ow, scales_w).astype(np.float32)).cast(d)
    return F.matmul(F.matmul(wh, x.cast(d)), ww.mT)


@op(aten.grid_sampler_3d.default)
def _grid_sampler_3d(cx: Ctx, x: Tensor, grid: Tensor, interpolation_mode: int,
                     padding_mode: int, align_corners: bool) -> Tensor:  # fmt: skip
    """Trilinear (mode 0) or nearest (mode 1) samples of (N, C, D, H, W) at grid (N, D', H',
    W', 3) positions (x, y, z in [-1, 1]), zeros (0) or border (1) padding."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1) or x.ndim != 5:
        raise Unsupported("grid_sampler_3d other than trilinear / nearest with zeros / border")
    if not all(isinstance(s, int) for s in (*x.shape, *grid.shape)):
        raise Unsupported("grid_sampler_3d of symbolic sizes")
    sizes = [int(x.shape[k]) for k in (4, 3, 2)]  # type: ignore[arg-type]  # W, H, D: x, y, z
    n, c = x.shape[0], x.shape[1]
    out_sp = list(grid.shape[1:4])
    g = grid.cast(dt.f64 if x.dtype is dt.f64 else dt.f32)
    coords = []
    for k, s in enumerate(sizes):
        v = g.slice(-1, k, 1).squeeze(-1)  # (N, D', H', W')
        if align_corners:
            v = F.mul(F.add(v, 1.0), (s - 1) / 2)
        else:
            v = F.mul(F.sub(F.mul(F.add(v, 1.0), s), 1.0), 0.5)
        if padding_mode == 1:
            v = F.clamp(v, 0.0, float(s - 1))
        coords.append(v)
    flat = x.reshape((n, c, -1))
    npos = int(np.prod(out_sp))  # type: ignore[arg-type]

    def corner(ix: list[Tensor], w: Tensor | None) -> Tensor:
        inside = None
        lin: Tensor | None = None
        for v, s, stride in zip(ix, sizes, (1, sizes[0], sizes[0] * sizes[1]), strict=True):
            ok = F.logical_and(F.ge(v, 0), F.lt(v, s))
            inside = ok if inside is None else F.logical_and(inside, ok)
            term = F.mul(F.clamp(v, 0, s - 1), stride)
            lin = term if lin is None else F.add(lin, term)
        assert lin is not None and inside is not None
        idx = lin.reshape((n, 1, npos)).expand((n, c, npos))
        vals = F.gather(flat, 2, idx)
        wt = inside.cast(vals.dtype) if w is None else F.mul(w, inside.cast(w.dtype))
        return F.mul(vals, wt.reshape((n, 1, npos)).cast(vals.dtype))

    if interpolation_mode == 1:  # nearest: round half to even, as nearbyint
        out = corner([F.round(v).cast(dt.i64) for v in coords], None)
    else:
        lo = [F.floor(v) for v in coords]
        fr = [F.sub(v, f) for v, f in zip(coords, lo, strict=True)]
        out = None
        for bits in range(8):
            ix, w = [], None
            for k in range(3):
                hi = (bits >> k) & 1
                ix.append(F.add(lo[k], float(hi)).cast(dt.i64))
                wk = fr[k] if hi else F.sub(1.0, fr[k])
                w = wk if w is None else F.mul(w, wk)
            term = corner(ix, w)
            out = term if out is None else F.add(out, term)
    assert out is not None
    return out.reshape((n, c, *out_sp)).cast(x.dtype)
