"""Movement ops named as in PyTorch. Almost all are views (no op, nothing copied): a new
index expression over the source (permute, expand, slices, flips, rolls through ``mod``,
reflect/replicate padding through ``min``/``max``, diagonals), or a ``valid`` mask (tril/triu,
zero padding). ``cat`` lays padded views side by side and adds them (exact: the other side
reads 0). Indexing with tensors is in ``index.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.symbolic import sint
from ..graph.view import idx_vars
from ..tensor import Tensor, broadcast_shapes
from ._base import (
    const,
    fill_mask,
    iota,
    lnot,
    lor,
    need_tensor,
    remap,
    same,
    shape_str,
    with_valid,
)

__all__ = [
    "broadcast_tensors", "broadcast_to", "cat", "chunk", "clone", "concat", "concatenate",
    "contiguous", "diag", "diagonal", "expand", "expand_as", "flatten", "flip", "movedim",
    "moveaxis", "narrow", "pad", "permute", "repeat", "repeat_interleave", "reshape", "roll",
    "select", "split", "squeeze", "stack", "swapaxes", "swapdims", "t", "tile", "transpose",
    "tril", "triu", "unbind", "unflatten", "unsqueeze", "view",
]  # fmt: skip


def _sizes(args: Sequence[Any]) -> list[Any]:
    return list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)


def reshape(input: Tensor, *shape: Any) -> Tensor:  # noqa: A002
    return need_tensor("reshape", input).reshape(*shape)


view = reshape


def permute(input: Tensor, *dims: Any) -> Tensor:  # noqa: A002
    return need_tensor("permute", input).permute(*dims)


def expand(input: Tensor, *sizes: Any) -> Tensor:  # noqa: A002
    return need_tensor("expand", input).expand(*sizes)


def squeeze(input: Tensor, dim: Any = None) -> Tensor:  # noqa: A002
    return need_tensor("squeeze", input).squeeze(dim)


def unsqueeze(input: Tensor, dim: int) -> Tensor:  # noqa: A002
    return need_tensor("unsqueeze", input).unsqueeze(dim)


def contiguous(input: Tensor) -> Tensor:  # noqa: A002
    return need_tensor("contiguous", input)


clone = contiguous


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:  # noqa: A002
    x = need_tensor("transpose", input)
    if x.ndim == 0:
        return x
    a, b = x._axis(dim0), x._axis(dim1)
    order = list(range(x.ndim))
    order[a], order[b] = b, a
    return x.permute(order)


swapaxes = swapdims = transpose


def t(input: Tensor) -> Tensor:  # noqa: A002
    x = need_tensor("t", input)
    if x.ndim > 2:
        raise ValueError(f"t: expects a tensor with <= 2 dims, got shape {shape_str(x.shape)}")
    return x if x.ndim < 2 else x.permute(1, 0)


def movedim(input: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:  # noqa: A002
    x = need_tensor("movedim", input)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise ValueError(f"movedim: source {src} and destination {dst} differ in length")
    s = [x._axis(d) for d in src]
    dd = [x._axis(d) for d in dst]
    if len(set(s)) != len(s) or len(set(dd)) != len(dd):
        raise ValueError(f"movedim: repeated dims in source {src} or destination {dst}")
    order: list[int | None] = [None] * x.ndim
    for a, b in zip(s, dd, strict=True):
        order[b] = a
    rest = iter(k for k in range(x.ndim) if k not in s)
    return x.permute([o if o is not None else next(rest) for o in order])


moveaxis = movedim


def expand_as(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    return need_tensor("expand_as", input).expand(need_tensor("expand_as", other, "other").shape)


def broadcast_to(input: Tensor, size: Sequence[sint]) -> Tensor:  # noqa: A002
    return need_tensor("broadcast_to", input).expand(tuple(size))


def broadcast_tensors(*tensors: Tensor) -> tuple[Tensor, ...]:
    shape: tuple[sint, ...] = ()
    for x in tensors:
        shape = broadcast_shapes(
            shape, need_tensor("broadcast_tensors", x).shape, "broadcast_tensors"
        )
    return tuple(x.expand(shape) for x in tensors)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:  # noqa: A002
    x = need_tensor("flatten", input)
    if x.ndim == 0:
        return x.reshape(1)
    a, b = x._axis(start_dim), x._axis(end_dim)
    if a > b:
        raise ValueError(
            f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {x.shape}"
        )
    n: sint = 1
    for s in x.shape[a : b + 1]:
        n = sym.mul(n, s)
    return x.reshape(list(x.shape[:a]) + [n] + list(x.shape[b + 1 :]))


def unflatten(input: Tensor, dim: int, sizes: Sequence[sint]) -> Tensor:  # noqa: A002
    x = need_tensor("unflatten", input)
    d = x._axis(dim)
    sizes = list(sizes)
    if sizes.count(-1) == 1:
        known: sint = 1
        for s in sizes:
            if not (isinstance(s, int) and s == -1):
                known = sym.mul(known, s)
        sizes[sizes.index(-1)] = sym.floordiv(x.shape[d], known)
    return x.reshape(list(x.shape[:d]) + sizes + list(x.shape[d + 1 :]))


def narrow(input: Tensor, dim: int, start: sint, length: sint) -> Tensor:  # noqa: A002
    x = need_tensor("narrow", input)
    d = x._axis(dim)
    n = x.shape[d]
    if isinstance(start, int) and start < 0:
        start = sym.add(n, start)
    static = isinstance(start, int) and isinstance(length, int) and isinstance(n, int)
    if static and not (0 <= start and start + length <= n):  # type: ignore[operator]
        raise IndexError(
            f"narrow: start {start} + length {length} exceeds dim {d} of shape {shape_str(x.shape)}"
        )
    return x.slice(d, start, length)


def select(input: Tensor, dim: int, index: sint) -> Tensor:  # noqa: A002
    x = need_tensor("select", input)
    d = x._axis(dim)
    n = x.shape[d]
    if isinstance(index, int):
        if isinstance(n, int) and not -n <= index < n:
            raise IndexError(
                f"select: index {index} out of range for dim {d} of shape {shape_str(x.shape)}"
            )
        if index < 0:
            index = sym.add(n, index)
    return x.slice(d, index, 1).reshape([s for k, s in enumerate(x.shape) if k != d])


# ----------------------------------------------------------------------------- concatenation
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    ts = list(tensors)
    if not ts:
        raise ValueError("cat: expected a non-empty list of tensors")
    for x in ts:
        need_tensor("cat", x, "every element")
    x0 = ts[0]
    d = x0._axis(dim)
    shapes = ", ".join(shape_str(x.shape) for x in ts)
    for x in ts[1:]:
        if x.graph is not x0.graph:
            raise ValueError("cat: tensors come from different graphs")
        if x.ndim != x0.ndim or not all(
            same(a, b) for k, (a, b) in enumerate(zip(x.shape, x0.shape, strict=True)) if k != d
        ):
            raise ValueError(f"cat: shapes {shapes} differ outside dim {dim}")
    dtype = x0.dtype
    for x in ts[1:]:
        dtype = dt.promote(dtype, x.dtype)
    if len(ts) == 1:
        return x0.cast(dtype)
    work = dt.u8 if dtype is dt.bool_ else dtype  # ADD is not defined on bool
    total: sint = 0
    for x in ts:
        total = sym.add(total, x.shape[d])
    out: Tensor | None = None
    off: sint = 0
    for x in ts:
        n = x.shape[d]
        p = x.cast(work).pad_dim(d, off, sym.add(total, sym.mul(sym.add(off, n), -1)))
        out = p if out is None else out._op(Op.ADD, p)
        off = sym.add(off, n)
    assert out is not None
    return out.cast(dtype)


concat = concatenate = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    ts = [need_tensor("stack", x, "every element") for x in tensors]
    if not ts:
        raise ValueError("stack: expected a non-empty list of tensors")
    for x in ts[1:]:
        if x.ndim != ts[0].ndim or not all(
            same(a, b) for a, b in zip(x.shape, ts[0].shape, strict=True)
        ):
            raise ValueError(f"stack: shapes {', '.join(shape_str(x.shape) for x in ts)} differ")
    d = ts[0]._axis(dim, ts[0].ndim + 1)
    return cat([x.unsqueeze(d) for x in ts], d)


def split(
    tensor: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0
) -> tuple[Tensor, ...]:
    x = need_tensor("split", tensor)
    d = x._axis(dim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if not isinstance(n, int):
            raise ValueError(
                f"split: dim {d} of shape {shape_str(x.shape)} is symbolic; give sections"
            )
        if step <= 0:
            raise ValueError(f"split: split_size must be positive, got {step}")
        sections = [min(step, n - s) for s in range(0, n, step)] or [0]
    else:
        sections = list(split_size_or_sections)
        total: sint = 0
        for s in sections:
            total = sym.add(total, s)
        if not same(total, n):
            raise ValueError(
                f"split: sections {sections} do not sum to dim {d} of shape {shape_str(x.shape)}"
            )
    out = []
    off: sint = 0
    for s in sections:
        out.append(x.slice(d, off, s))
        off = sym.add(off, s)
    return tuple(out)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:  # noqa: A002
    x = need_tensor("chunk", input)
    n = x.shape[x._axis(dim)]
    if not isinstance(chunks, int) or chunks <= 0:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    if not isinstance(n, int):
        raise ValueError(f"chunk: dim {dim} of shape {shape_str(x.shape)} is symbolic")
    return split(x, max(-(-n // chunks), 1), dim)


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:  # noqa: A002
    x = need_tensor("unbind", input)
    d = x._axis(dim)
    n = x.shape[d]
    if not isinstance(n, int):
        raise ValueError(f"unbind: dim {d} of shape {shape_str(x.shape)} is symbolic")
    return tuple(select(x, d, i) for i in range(n))


# ----------------------------------------------------------------------------- repeats
def repeat(input: Tensor, *sizes: Any) -> Tensor:  # noqa: A002
    """Tile: out[i] = x[i % n] per dim; an expand of interleaved size-1 axes, then a reshape."""
    x = need_tensor("repeat", input)
    reps = _sizes(sizes)
    if len(reps) < x.ndim:
        raise ValueError(f"repeat: {len(reps)} repeat sizes given for shape {shape_str(x.shape)}")
    shape = [1] * (len(reps) - x.ndim) + list(x.shape)
    inter = [v for s in shape for v in (1, s)]
    big = [v for r, s in zip(reps, shape, strict=True) for v in (r, s)]
    return (
        x.reshape(inter)
        .expand(big)
        .reshape([sym.mul(r, s) for r, s in zip(reps, shape, strict=True)])
    )


def tile(input: Tensor, dims: Sequence[int]) -> Tensor:  # noqa: A002
    x = need_tensor("tile", input)
    reps = list(dims)
    return repeat(x, [1] * (x.ndim - len(reps)) + reps)


def repeat_interleave(input: Tensor, repeats: int, dim: int | None = None) -> Tensor:  # noqa: A002
    x = need_tensor("repeat_interleave", input)
    if not isinstance(repeats, int):
        raise TypeError(
            "repeat_interleave: only an int repeat count is supported (counts in a tensor "
            "gives a data-dependent shape)"
        )
    if dim is None:
        x, d = x.reshape(-1) if x.ndim != 1 else x, 0
    else:
        d = x._axis(dim)
    shape = list(x.shape)
    y = x.unsqueeze(d + 1).expand(shape[: d + 1] + [repeats] + shape[d + 1 :])
    return y.reshape(shape[:d] + [sym.mul(shape[d], repeats)] + shape[d + 1 :])


def flip(input: Tensor, dims: int | Sequence[int]) -> Tensor:  # noqa: A002
    x = need_tensor("flip", input)
    for d in [dims] if isinstance(dims, int) else dims:
        a = x._axis(d)
        n = x.shape[a]
        x = x.slice(a, sym.add(n, -1), n, -1)
    return x


def roll(
    input: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None
) -> Tensor:  # noqa: A002
    x = need_tensor("roll", input)
    if dims is None:
        if not isinstance(shifts, int):
            raise ValueError("roll: give dims when shifts is a sequence")
        return roll(x.reshape(-1), shifts, 0).reshape(x.shape)
    sh = [shifts] if isinstance(shifts, int) else list(shifts)
    ds = [dims] if isinstance(dims, int) else list(dims)
    if len(sh) != len(ds):
        raise ValueError(f"roll: {len(sh)} shifts for {len(ds)} dims")
    for s, d in zip(sh, ds, strict=True):
        a = x._axis(d)
        nv = idx_vars(x.shape)
        old = list(nv)
        old[a] = sym.mod(sym.add(nv[a], -s), x.shape[a])  # out[i] = x[(i - s) mod n]
        x = remap(x, x.shape, old)
    return x


# ------------------------------------------------------------------------- triangles / diagonals
def _tri(name: str, x: Tensor, diagonal: int, lower: bool) -> Tensor:
    x = need_tensor(name, x)
    if x.ndim < 2:
        raise ValueError(f"{name}: needs at least 2 dims, got shape {shape_str(x.shape)}")
    nv = idx_vars(x.shape)
    i, j = nv[-2], nv[-1]
    keep = sym.lt(j, sym.add(i, diagonal + 1)) if lower else sym.lt(sym.add(i, diagonal - 1), j)
    return with_valid(x, keep)  # masked elements read 0: a view, exact for inf/NaN


def tril(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002
    return _tri("tril", input, diagonal, True)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002
    return _tri("triu", input, diagonal, False)


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:  # noqa: A002
    x = need_tensor("diagonal", input)
    a, b = x._axis(dim1), x._axis(dim2)
    if a == b:
        raise ValueError(f"diagonal: dim1 and dim2 are both {a} for shape {shape_str(x.shape)}")
    y = x.permute([k for k in range(x.ndim) if k not in (a, b)] + [a, b])
    n1, n2 = y.shape[-2], y.shape[-1]
    if offset >= 0:
        length = sym.maximum(sym.minimum(n1, sym.add(n2, -offset)), 0)
    else:
        length = sym.maximum(sym.minimum(sym.add(n1, offset), n2), 0)
    shape = list(y.shape[:-2]) + [length]
    nv = idx_vars(shape)
    k = nv[-1]
    old = nv[:-1] + [sym.add(k, max(-offset, 0)), sym.add(k, max(offset, 0))]
    return remap(y, shape, old)


_diagonal = diagonal


def diag(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002
    """1-D -> a square matrix with ``input`` on a diagonal; 2-D -> that diagonal."""
    x = need_tensor("diag", input)
    if x.ndim == 2:
        return _diagonal(x, diagonal)
    if x.ndim != 1:
        raise ValueError(f"diag: expects 1-D or 2-D input, got shape {shape_str(x.shape)}")
    n = sym.add(x.shape[0], abs(diagonal))
    nv = idx_vars((n, n))
    i, j = nv
    src = i if diagonal >= 0 else j
    on = sym.eq(sym.add(i, diagonal), j)
    return remap(x, (n, n), [sym.add(src, 0)], on)


# ----------------------------------------------------------------------------- padding
def pad(
    input: Tensor, pad: Sequence[sint], mode: str = "constant", value: float | None = None
) -> Tensor:  # noqa: A002
    """``torch.nn.functional.pad``: pairs (before, after) from the last dim backwards.
    constant: negative pads crop; reflect / replicate / circular are index views."""
    x = need_tensor("pad", input)
    p = list(pad)
    if len(p) % 2 or len(p) // 2 > x.ndim:
        raise ValueError(f"pad: {len(p)} pad values do not fit shape {shape_str(x.shape)}")
    pairs = [(x.ndim - 1 - k, p[2 * k], p[2 * k + 1]) for k in range(len(p) // 2)]
    if mode == "constant":
        return _pad_constant(x, pairs, 0.0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise ValueError(
            f"pad: mode must be constant, reflect, replicate or circular, got {mode!r}"
        )
    for d, before, after in pairs:
        n = x.shape[d]
        if mode == "reflect" and isinstance(n, int) and (before >= n or after >= n):  # type: ignore[operator]
            raise ValueError(f"pad: reflect padding ({before}, {after}) must be < dim {d} size {n}")
        shape = list(x.shape)
        shape[d] = sym.add(sym.add(n, before), after)
        nv = idx_vars(shape)
        j = sym.add(nv[d], sym.mul(before, -1))
        if mode == "replicate":
            src = sym.minimum(sym.maximum(j, 0), sym.add(n, -1))
        elif mode == "circular":
            src = sym.mod(j, n)
        else:
            aj = sym.maximum(j, sym.mul(j, -1))
            t = sym.add(sym.add(n, -1), sym.mul(aj, -1))
            src = sym.add(sym.add(n, -1), sym.mul(sym.maximum(t, sym.mul(t, -1)), -1))
        old = list(nv)
        old[d] = src
        x = remap(x, shape, old)
    return x


def _pad_constant(x: Tensor, pairs: list[tuple[int, sint, sint]], value: Any) -> Tensor:
    kept: list[tuple[int, sint, sint]] = []  # (dim, before, source size) after cropping
    for d, before, after in pairs:
        n = x.shape[d]
        if isinstance(before, int) and before < 0:
            x, n, before = x.slice(d, -before, sym.add(n, before)), sym.add(n, before), 0
        if isinstance(after, int) and after < 0:
            x, n, after = x.slice(d, 0, sym.add(n, after)), sym.add(n, after), 0
        x = x.pad_dim(d, before, after)
        kept.append((d, before, n))
    if value == 0 or value is False:
        return x
    nv = idx_vars(x.shape)
    inside: sint = 1
    for d, before, n in kept:
        inside = sym.mul(
            inside, sym.mul(sym.lt(sym.add(before, -1), nv[d]), sym.lt(nv[d], sym.add(before, n)))
        )
    outside = lnot(iota(x.graph, x.shape, inside, dt.i32).cast(dt.bool_))
    if x.dtype is dt.bool_:
        return lor(x, outside) if value else x
    if x.dtype.is_float:
        return x.add(fill_mask(outside, float(value), x.dtype))
    return x.add(outside.cast(x.dtype).mul(const(x.graph, int(value), x.dtype)))
