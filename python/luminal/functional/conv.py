"""Convolutions and pooling through views (im2col with no copy).

Each spatial dim is padded (a view) and then viewed as (out, kernel) windows whose index is
``o * stride + i * dilation`` (another view). A convolution is then one broadcast-multiply with
the weight and one SUM_REDUCE over (in-channels x kernel), merged into a single contracted
axis so it reads as a GEMM; pooling is a SUM/MAX_REDUCE over the window axes. Transposed
convolutions dilate the input with zeros (a pad + reshape view) and convolve with the flipped
kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.symbolic import sint
from ..graph.view import idx_vars
from ..tensor import Tensor
from ._base import iota, prod, same, shape_str
from ._nnbase import fmax, remap_axis, tuple_arg, windows

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_max_pool2d",
    "adaptive_max_pool_indices",
    "avg_pool1d",
    "avg_pool2d",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "max_pool1d",
    "max_pool2d",
]

IntOr = int | Sequence[int]


def _batched(name: str, x: Tensor, nd: int) -> tuple[Tensor, bool]:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    if x.ndim == nd + 1:
        return x.unsqueeze(0), False
    if x.ndim != nd + 2:
        raise ValueError(
            f"{name}: expected a {nd + 1}-D or {nd + 2}-D input, got shape {shape_str(x.shape)}"
        )
    return x, True


def _conv_operands(
    name: str, x: Tensor, w: Tensor, nd: int, layout: str
) -> tuple[Tensor, bool, tuple[int, ...]]:
    """The input with a batch dim, whether it came with one, and the weight's (concrete)
    shape."""
    x, batched = _batched(name, x, nd)
    if not isinstance(w, Tensor) or w.ndim != nd + 2:
        raise ValueError(
            f"{name}: weight must be {nd + 2}-D ({layout}, *kernel), got "
            f"{shape_str(getattr(w, 'shape', ()))}"
        )
    if not all(isinstance(v, int) for v in w.shape):
        raise ValueError(f"{name}: weight shape {shape_str(w.shape)} must be concrete")
    return x, batched, tuple(v for v in w.shape if isinstance(v, int))


def _out_size(n: sint, lo: int, hi: int, k: int, s: int, d: int, name: str, shape: tuple) -> sint:
    span = sym.add(n, lo + hi - d * (k - 1) - 1)
    if isinstance(span, int) and span < 0:
        raise ValueError(
            f"{name}: input {shape_str(shape)} is smaller than the dilated kernel {d * (k - 1) + 1}"
        )
    return sym.add(sym.floordiv(span, s), 1)


def _conv_pads(
    name: str, padding: str | IntOr, ks: Sequence[int], stride: Sequence[int], dil: Sequence[int]
) -> list[tuple[int, int]]:
    nd = len(ks)
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ValueError(f"{name}: padding='same' needs stride 1, got stride {tuple(stride)}")
        # PyTorch puts the odd element of the total padding on the right
        return [
            (d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(ks, dil, strict=True)
        ]
    if isinstance(padding, str):
        raise ValueError(
            f"{name}: padding must be 'same', 'valid', an int or {nd} ints, got {padding!r}"
        )
    return [(p, p) for p in tuple_arg(padding, nd, name, "padding")]


def _conv(
    name: str,
    x: Tensor,
    w: Tensor,
    b: Tensor | None,
    stride: IntOr,
    padding: str | IntOr,
    dilation: IntOr,
    groups: int,
    nd: int,
) -> Tensor:
    x, batched, (o, cg, *ks) = _conv_operands(name, x, w, nd, "out, in/groups")
    d = dt.promote(x.dtype, w.dtype)
    x, w = x.cast(d), w.cast(d)
    n, c = x.shape[0], x.shape[1]
    if groups < 1 or not isinstance(c, int) or c % groups or o % groups or cg * groups != c:
        raise ValueError(
            f"{name}: input {shape_str(x.shape)} with {c} channels, weight "
            f"{shape_str(w.shape)} and groups={groups} do not match (want in_channels = "
            f"weight.shape[1] * groups and out_channels divisible by groups)"
        )
    st = tuple_arg(stride, nd, name, "stride")
    dil = tuple_arg(dilation, nd, name, "dilation")
    pads = _conv_pads(name, padding, ks, st, dil)
    outs = []
    for k in range(nd):
        ax = 2 + 2 * k  # each earlier spatial dim became two (out, kernel)
        lo, hi = pads[k]
        outs.append(_out_size(x.shape[ax], lo, hi, ks[k], st[k], dil[k], name, x.shape))
        x = windows(x.pad_dim(ax, lo, hi), ax, outs[k], ks[k], st[k], dil[k])
    og = o // groups
    kk = cg * prod(ks)
    # (N, C, O1, k1, O2, k2, ..) -> (N, G, 1, O1, O2, .., Cg*k1*k2..): one contracted axis, last
    x = x.reshape([n, groups, cg, *[s for k in range(nd) for s in (outs[k], ks[k])]])
    x = x.permute([0, 1, *[3 + 2 * k for k in range(nd)], 2, *[4 + 2 * k for k in range(nd)]])
    x = x.reshape([n, groups, *outs, kk]).unsqueeze(2)
    wr = w.reshape([groups, og, *([1] * nd), kk])
    full = (n, groups, og, *outs, kk)
    y = x.expand(full).mul(wr.expand(full)).sum_reduce(-1).reshape([n, o, *outs])
    if b is not None:
        if not same(b.numel(), o) or b.ndim != 1:
            raise ValueError(
                f"{name}: bias shape {shape_str(b.shape)} does not match {o} output channels"
            )
        y = y.add(b.cast(d).reshape([o, *([1] * nd)]))
    return y if batched else y.squeeze(0)


# the public conv / pool functions are made per rank: same body, a name and nd bound
def _named(fn: Callable[..., Tensor], name: str, doc: str) -> Callable[..., Tensor]:
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _conv_fn(nd: int) -> Callable[..., Tensor]:
    name = f"conv{nd}d"

    def conv(
        input: Tensor,  # noqa: A002
        weight: Tensor,
        bias: Tensor | None = None,
        stride: IntOr = 1,
        padding: str | IntOr = 0,
        dilation: IntOr = 1,
        groups: int = 1,
    ) -> Tensor:
        return _conv(name, input, weight, bias, stride, padding, dilation, groups, nd)

    return _named(conv, name, f"PyTorch's ``F.{name}`` over {nd} spatial dim(s).")


conv1d, conv2d, conv3d = _conv_fn(1), _conv_fn(2), _conv_fn(3)


def _conv_transpose(
    name: str,
    x: Tensor,
    w: Tensor,
    b: Tensor | None,
    stride: IntOr,
    padding: IntOr,
    output_padding: IntOr,
    groups: int,
    dilation: IntOr,
    nd: int,
) -> Tensor:
    x, batched, (cin, og, *ks) = _conv_operands(name, x, w, nd, "in, out/groups")
    if groups < 1 or not same(x.shape[1], cin) or cin % groups:
        raise ValueError(
            f"{name}: input {shape_str(x.shape)}, weight {shape_str(w.shape)} and "
            f"groups={groups} do not match (want input channels = weight.shape[0], "
            "divisible by groups)"
        )
    st = tuple_arg(stride, nd, name, "stride")
    pd = tuple_arg(padding, nd, name, "padding")
    op = tuple_arg(output_padding, nd, name, "output_padding")
    dil = tuple_arg(dilation, nd, name, "dilation")
    for k in range(nd):
        if op[k] >= max(st[k], dil[k]):
            raise ValueError(f"{name}: output_padding {op} must be smaller than stride or dilation")
    for k in range(nd):
        ax, s, n = 2 + k, st[k], x.shape[2 + k]
        full = dil[k] * (ks[k] - 1)
        if s > 1:  # insert s-1 zeros between elements: (n, 1) -> pad -> (n, s) -> n*s -> slice
            x = x.unsqueeze(ax + 1).pad_dim(ax + 1, 0, s - 1)
            x = x.reshape([*x.shape[:ax], sym.mul(n, s), *x.shape[ax + 2 :]])
            x = x.slice(ax, 0, sym.add(sym.mul(n, s), 1 - s))
        lo, hi = full - pd[k], full - pd[k] + op[k]
        x = x.pad_dim(ax, max(lo, 0), max(hi, 0))
        if lo < 0 or hi < 0:
            x = x.slice(ax, -min(lo, 0), sym.add(x.shape[ax], min(lo, 0) + min(hi, 0)))
    # flip the kernel, swap in/out channels per group: (G*Cg_in, Og, k..) -> (G*Og, Cg_in, k..)
    for k in range(nd):
        w = w.slice(2 + k, ks[k] - 1, ks[k], -1)
    cg = cin // groups
    w = w.reshape([groups, cg, og, *ks]).permute([0, 2, 1, *range(3, 3 + nd)])
    w = w.reshape([groups * og, cg, *ks])
    y = _conv(name, x, w, b, 1, 0, dil, groups, nd)
    return y if batched else y.squeeze(0)


def _conv_transpose_fn(nd: int) -> Callable[..., Tensor]:
    name = f"conv_transpose{nd}d"

    def conv_transpose(
        input: Tensor,  # noqa: A002
        weight: Tensor,
        bias: Tensor | None = None,
        stride: IntOr = 1,
        padding: IntOr = 0,
        output_padding: IntOr = 0,
        groups: int = 1,
        dilation: IntOr = 1,
    ) -> Tensor:
        args = (stride, padding, output_padding, groups, dilation)
        return _conv_transpose(name, input, weight, bias, *args, nd)

    return _named(conv_transpose, name, f"PyTorch's ``F.{name}`` over {nd} spatial dim(s).")


conv_transpose1d, conv_transpose2d = _conv_transpose_fn(1), _conv_transpose_fn(2)
conv_transpose3d = _conv_transpose_fn(3)


# ----------------------------------------------------------------------------- pooling


def _pool_input(name: str, x: Tensor, nd: int) -> tuple[Tensor, dt.DType, int]:
    """The input as a float (pooling averages ints in f32), its dtype and its leading rank."""
    if x.ndim < nd + 1:
        raise ValueError(
            f"{name}: expected a {nd + 1}-D or {nd + 2}-D input, got shape {shape_str(x.shape)}"
        )
    d = x.dtype if x.dtype.is_float else dt.f32
    return x.cast(d), d, x.ndim - nd


def _outer(factors: Sequence[Tensor]) -> Tensor:
    """The product of per-dim factors of equal rank, factor k broadcast over the axes of the
    factors after it: a separable window mask or window count over all pooled dims."""
    out: Tensor | None = None
    for k, f in enumerate(factors):
        f = f.reshape([*f.shape, *([1] * (f.ndim * (len(factors) - 1 - k)))])
        out = f if out is None else out.mul(f)
    assert out is not None, "no pooled dims"
    return out


def _pool(
    name: str,
    x: Tensor,
    kernel_size: IntOr,
    stride: IntOr | None,
    padding: IntOr,
    dilation: IntOr,
    ceil_mode: bool,
    nd: int,
    is_max: bool,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    x, d, lead = _pool_input(name, x, nd)
    ks = tuple_arg(kernel_size, nd, name, "kernel_size")
    st = (
        ks
        if stride is None or (not isinstance(stride, int) and not stride)
        else tuple_arg(stride, nd, name, "stride")
    )
    pd = tuple_arg(padding, nd, name, "padding")
    dil = tuple_arg(dilation, nd, name, "dilation")
    for k in range(nd):
        if pd[k] * 2 > ks[k]:
            raise ValueError(f"{name}: padding {pd} should be at most half of kernel_size {ks}")
    one = x.graph.constant(1.0, d)
    masks = []  # per dim, (out, k) views of a constant: 1 where a window slot counts
    for k in range(nd):
        ax = lead + 2 * k  # each earlier spatial dim became two (out, kernel)
        n, lo, s, dk = x.shape[ax], pd[k], st[k], dil[k] * (ks[k] - 1)
        extra: sint = 0
        if not ceil_mode:
            out = _out_size(n, lo, lo, ks[k], s, dil[k], name, x.shape)
        else:  # round up, but the last window must start inside the input or left padding
            out = sym.add(sym.floordiv(sym.add(n, 2 * lo - dk - 1 + s - 1), s), 1)
            out = sym.add(
                out, sym.mul(sym.lt(sym.add(n, lo - 1), sym.mul(sym.add(out, -1), s)), -1)
            )
            if isinstance(out, int) and out < 1:  # a kernel past the input still makes one
                raise ValueError(  # window here when it starts inside (EfficientNet's pool)
                    f"{name}: input {shape_str(x.shape)} gives no window of kernel {ks}"
                )
            # windows that overhang the padded input read zeros there
            need = sym.add(sym.mul(sym.add(out, -1), s), dk + 1 - 2 * lo)
            extra = sym.maximum(0, sym.add(need, sym.mul(n, -1)))
        x = windows(x.pad_dim(ax, lo, sym.add(lo, extra)), ax, out, ks[k], s, dil[k])
        if is_max or not count_include_pad:
            r = one.expand([n]).pad_dim(0, lo, sym.add(lo, extra))
        else:  # PyTorch counts the zero padding, but not the ceil_mode overhang
            r = one.expand([sym.add(n, 2 * lo)]).pad_dim(0, 0, extra)
        masks.append(windows(r, 0, out, ks[k], s, dil[k]))
    kaxes = [lead + 2 * k + 1 for k in range(nd)]
    if is_max:  # padding and overhang read as the most negative finite value
        return x.add(_outer(masks).add(-1.0).mul(fmax(d))).max_reduce(kaxes)
    total = x.sum_reduce(kaxes)
    if divisor_override is not None:
        return total.mul(1.0 / divisor_override)
    return total.mul(_outer([m.sum_reduce(1) for m in masks]).reciprocal())


def _max_pool_fn(nd: int) -> Callable[..., Tensor]:
    name = f"max_pool{nd}d"

    def max_pool(
        input: Tensor,  # noqa: A002
        kernel_size: IntOr,
        stride: IntOr | None = None,
        padding: IntOr = 0,
        dilation: IntOr = 1,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Tensor:
        if return_indices:
            raise NotImplementedError(f"{name}: return_indices is not supported")
        return _pool(name, input, kernel_size, stride, padding, dilation, ceil_mode, nd, True)

    return _named(max_pool, name, f"PyTorch's ``F.{name}`` over {nd} spatial dim(s).")


max_pool1d, max_pool2d = _max_pool_fn(1), _max_pool_fn(2)


def avg_pool1d(
    input: Tensor,  # noqa: A002
    kernel_size: IntOr,
    stride: IntOr | None = None,
    padding: IntOr = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    return _pool(
        "avg_pool1d", input, kernel_size, stride, padding, 1, ceil_mode, 1, False, count_include_pad
    )


def avg_pool2d(
    input: Tensor,  # noqa: A002
    kernel_size: IntOr,
    stride: IntOr | None = None,
    padding: IntOr = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    return _pool(
        "avg_pool2d",
        input,
        kernel_size,
        stride,
        padding,
        1,
        ceil_mode,
        2,
        False,
        count_include_pad,
        divisor_override,
    )


def _adaptive(
    name: str, x: Tensor, output_size: int | None | Sequence[int | None], nd: int, is_max: bool
) -> Tensor:
    x, d, lead = _pool_input(name, x, nd)
    sizes = (
        [output_size] * nd
        if output_size is None or isinstance(output_size, int)
        else list(output_size)
    )
    if len(sizes) != nd:
        raise ValueError(f"{name}: output_size must be an int or {nd} ints, got {output_size!r}")
    for k in range(nd):
        ax = lead + k
        n = x.shape[ax]
        o = n if sizes[k] is None else sizes[k]
        if not isinstance(o, int):
            continue  # None on a symbolic dim: identity
        if o <= 0:
            raise ValueError(f"{name}: output_size must be positive, got {output_size!r}")

        # PyTorch's bins: [floor(i*n/o), ceil((i+1)*n/o))
        def start(i: sint, n: sint = n, o: int = o) -> sint:
            return sym.floordiv(sym.mul(i, n), o)

        def end(i: sint, n: sint = n, o: int = o) -> sint:
            return sym.ceildiv(sym.mul(sym.add(i, 1), n), o)

        if isinstance(n, int):
            kmax = max(end(i) - start(i) for i in range(o))
        else:
            kmax = sym.add(sym.ceildiv(n, o), 1)
        x = remap_axis(
            x,
            ax,
            (o, kmax),
            lambda v, s=start, e=end: (  # type: ignore[misc]
                sym.add(s(v[0]), v[1]),
                sym.lt(sym.add(s(v[0]), v[1]), e(v[0])),
            ),
        )
        iv = sym.index_var(0, o)
        count = iota(x.graph, (o,), sym.add(end(iv), sym.mul(start(iv), -1))).cast(d)
        count = count.reshape([o, *([1] * (nd - 1 - k))])
        if is_max:  # masked-out window slots read 0: push them below every real value
            ok = iota(
                x.graph,
                (o, kmax),
                sym.lt(sym.index_var(1, kmax), sym.add(end(iv), sym.mul(start(iv), -1))),
            )
            bias = ok.cast(d).add(-1.0).mul(fmax(d)).reshape([o, kmax, *([1] * (nd - 1 - k))])
            x = x.add(bias).max_reduce(ax + 1)
        else:
            x = x.sum_reduce(ax + 1).mul(count.reciprocal())
    return x


def adaptive_avg_pool1d(input: Tensor, output_size: int) -> Tensor:  # noqa: A002
    return _adaptive("adaptive_avg_pool1d", input, output_size, 1, False)


def adaptive_avg_pool2d(
    input: Tensor,  # noqa: A002
    output_size: int | None | Sequence[int | None],
) -> Tensor:
    return _adaptive("adaptive_avg_pool2d", input, output_size, 2, False)


def adaptive_max_pool_indices(name: str, x: Tensor, output_size: Sequence[int], nd: int
                              ) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(values, indices) of an adaptive max pool over the last ``nd`` dims of static size:
    each window's elements are gathered (short windows repeat their last element), and the
    index is the first maximum's flat position in the window's row-major order (NaN counts as
    the maximum), as PyTorch's."""
    sizes = list(output_size)
    spatial = [v for v in x.shape[x.ndim - nd :] if isinstance(v, int)]
    if len(sizes) != nd or len(spatial) != nd or not all(v > 0 for v in (*sizes, *spatial)):
        raise ValueError(f"{name}: needs {nd} static output and input sizes, got {output_size!r} "
                         f"for input {shape_str(x.shape)}")  # fmt: skip
    shape: list[int] = []
    for o, n in zip(sizes, spatial, strict=True):
        shape += [o, max(-(-(i + 1) * n // o) - i * n // o for i in range(o))]
    iv = idx_vars(tuple(shape))
    flat: sint = 0
    stride = 1
    for k in range(nd - 1, -1, -1):
        o, n = sizes[k], spatial[k]
        i, j = iv[2 * k], iv[2 * k + 1]
        start = sym.floordiv(sym.mul(i, n), o)
        end = sym.ceildiv(sym.mul(sym.add(i, 1), n), o)
        row = sym.minimum(sym.add(start, j), sym.add(end, -1))
        flat = sym.add(flat, sym.mul(row, stride))
        stride *= n
    idx = iota(x.graph, tuple(shape), flat, dt.i64)
    lead = list(x.shape[: x.ndim - nd])
    xs = x.reshape([*lead, stride])
    win = xs.index_select(-1, idx.reshape((prod(shape),))).reshape([*lead, *shape])
    kaxes = [len(lead) + 2 * k + 1 for k in range(nd)]
    vals = win.max_reduce(kaxes, keepdim=True)
    hit = win.eq(vals.expand(win.shape))
    if x.dtype.is_float:
        hit = hit.logical_or(win.isnan())
    pos = idx.expand(win.shape)
    big = iota(x.graph, win.shape, stride, dt.i64)
    ind = pos.where(hit, big).amin(kaxes)
    return vals.reshape(ind.shape), ind


def adaptive_max_pool2d(
    input: Tensor,  # noqa: A002
    output_size: int | None | Sequence[int | None],
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    if return_indices:
        sizes = [output_size] * 2 if isinstance(output_size, int) else output_size
        if sizes is None or None in sizes:
            raise ValueError("adaptive_max_pool2d: return_indices needs explicit output sizes")
        return adaptive_max_pool_indices("adaptive_max_pool2d", input, sizes, 2)  # type: ignore[arg-type]
    return _adaptive("adaptive_max_pool2d", input, output_size, 2, True)
