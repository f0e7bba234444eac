"""Recognize a convolution's patch copy, so a GEMM can read its patches straight from the image.

A convolution lowers to a copy of the input's windows (im2col: one row or column of patches per
output pixel, written by the gemm alternative's operand copy or by a staged kernel) and a GEMM
of the weights by the patches. ``implicit_conv`` reads the copy's index expression (affine in
its axes, a padding mask bounding the input row and column) and gives the gemm call's
descriptor reading B through the convolution's geometry instead (the conv_* fields of
csrc/gemm_desc.hpp): no patch matrix is written. A staged copy may compute more than a read
(a group norm and an activation fused into it): ``split_patch_copy`` moves that computation
into a kernel over the image, once per input value instead of once per tap, and leaves a
plain copy for ``implicit_conv``. Which program runs is decided by measurement (select.py).
"""

from __future__ import annotations

from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.symbolic import sint
from ...graph.view import contiguous_strides
from .. import kernel_ir as K
from .gemm import _affine


def _eq(a: sint, b: sint) -> bool:
    return sym.add(a, sym.mul(b, -1)) == 0


def _axis_groups(
    shape: tuple[sint, ...], parts: list[tuple[str, sint, sint]]
) -> dict[str, list[int]] | None:
    """The axes of a contiguous buffer of ``shape`` that each (role, stride, extent) of
    ``parts`` spans: consecutive axes (size-1 axes skipped), the innermost at that stride, their
    sizes multiplying to the extent (at most 3 axes); None when the parts do not cover every
    axis exactly once."""
    strides = contiguous_strides(shape)
    live = [j for j, s in enumerate(shape) if s != 1]
    taken: set[int] = set()
    out: dict[str, list[int]] = {}
    for role, stride, extent in parts:
        out[role] = []
        if extent == 1:
            continue
        j = next((j for j in live if j not in taken and _eq(strides[j], stride)), None)
        size: sint = 1
        while True:
            if j is None or j in taken or len(out[role]) == 3:
                return None
            out[role].insert(0, j)
            size = sym.mul(size, shape[j])
            if _eq(size, extent):
                break
            j = next((i for i in reversed(live) if i < j), None)
        taken |= set(out[role])
    return out if taken == set(live) else None


def _patch_axes(copy: K.Kernel, fields: dict[str, sint | float]) -> dict[str, list[int]] | None:
    """The copy's axes by role when the gemm call ``fields`` reads its output as B from the
    start: "b" the batch (0 or 1 axis), "k" (channel, kernel row, kernel column) or (channel),
    "n" (output row, output column); None otherwise."""
    if copy.scatter_row is not None or copy.dtype is not dt.f32 or fields.get("b_offset", 0) != 0:
        return None
    k, n, batch = fields["k"], fields["n"], fields.get("batch", 1)
    tb = fields.get("trans_b", 0)
    ldb = fields.get("ldb", k if tb else n)
    stride_b = fields.get("stride_b", 0)
    if any(isinstance(x, float) for x in (k, n, batch, ldb, stride_b)):
        return None
    sk, sn = (1, ldb) if tb else (ldb, 1)
    parts = [("k", sk, k), ("n", sn, n), ("b", stride_b, batch)]
    groups = _axis_groups(copy.shape, parts)  # type: ignore[arg-type]
    # (one batch axis: a grouped convolution's (batch, group) matrices are not one stride apart)
    if groups is None or len(groups["n"]) != 2 or len(groups["k"]) not in (1, 3) \
            or len(groups["b"]) > 1:  # fmt: skip
        return None
    return groups


def _window_bounds(
    valid: sint, names: list[str], ones: dict[str, sint], y: tuple[int, int, int],
    x: tuple[int, int, int],
) -> dict[str, list[sint | None]] | None:  # fmt: skip
    """The mask's bounds on the input row e = sh * oy + dy and column: for each, the lower
    (e >= it) and the upper (e < it), None where the mask has none; ``y`` and ``x`` are
    (output axis, kernel axis, stride). None when the mask holds anything else."""
    bounds: dict[str, list[sint | None]] = {"y": [None, None], "x": [None, None]}
    for f in [] if valid == 1 else sym._factors(valid):  # type: ignore[arg-type]
        if not (isinstance(f, sym.Expr) and f.kind == sym.LT):
            return None
        d = _affine(sym.substitute(sym.add(f.args[1], sym.mul(f.args[0], -1)), ones), names)
        if d is None:
            return None
        d_off, dc = d  # d_off + sum(dc * axis) > 0
        used = {j for j, nm in enumerate(names) if dc[nm] != 0}
        for axis, (outer, inner, st) in (("y", y), ("x", x)):
            if used != {outer, inner}:
                continue
            side = 0 if (dc[names[outer]], dc[names[inner]]) == (st, 1) else 1
            if side == 1 and (dc[names[outer]], dc[names[inner]]) != (-st, -1):
                return None
            if bounds[axis][side] is not None:
                return None
            # lower: e + d_off > 0, so e >= 1 - d_off (the padding); upper: e < d_off
            bounds[axis][side] = sym.add(1, sym.mul(d_off, -1)) if side == 0 else d_off
            break
        else:
            return None
    return bounds


def _extent(hi: sint | None, pad: sint, st: int, out: sint, taps: sint) -> sint:
    """The input's rows (columns) from the mask's upper bound, else all the window reads."""
    return sym.add(sym.add(sym.mul(st, sym.add(out, -1)), taps) if hi is None else hi,
                   sym.mul(pad, -1))  # fmt: skip


def implicit_conv(copy: K.Kernel, fields: dict[str, sint | float]) -> tuple[int, dict] | None:
    """(image buffer, descriptor) of a gemm call whose B operand is the output of ``copy``, read
    as ``fields`` say, rewritten to read B straight from the image through a convolution's
    geometry (the conv_* fields of csrc/gemm_desc.hpp); None when ``copy`` is no patch copy.
    A patch copy is an f32 load of one buffer, masked or not, at an index affine in the copy's
    axes, which group (``_patch_axes``) into the product's batch, k and n; the column is read
    at unit stride and the mask bounds the input row and column (the padding). Other reads
    (dilation, another k order) are refused: they keep the copy."""
    v: K.Value = copy.value
    valid: sint = 1
    if isinstance(v, K.Masked):
        valid = v.valid
        v = v.value
    groups = _patch_axes(copy, fields)
    if not isinstance(v, K.Load) or v.dtype is not dt.f32 or groups is None:
        return None
    valid = sym.logical_and(valid, v.valid)
    shape = copy.shape
    names = [f"_i{j}" for j in range(len(shape))]
    ones: dict[str, sint] = {names[j]: 0 for j, s in enumerate(shape) if s == 1}
    aff = _affine(sym.substitute(v.index, ones), names)
    if aff is None:
        return None
    off, coef = aff
    (oy, ox), kax = groups["n"], groups["k"]
    sw = coef[names[ox]]
    if len(kax) == 3:  # (channel, dy, dx): the input row's stride is dy's
        dy, dx = kax[1], kax[2]
        rs, kh, kw = coef[names[dy]], shape[dy], shape[dx]
        sh: sint = sym.floordiv(coef[names[oy]], rs) if rs != 0 else 0
        if coef[names[dx]] != 1 or not _eq(sym.mul(sh, rs), coef[names[oy]]):
            return None
    elif valid == 1:  # 1x1: rows of the output's pixels, read where they lie
        dy = dx = -1
        rs, sh, kh, kw = coef[names[oy]], 1, 1, 1
    else:
        return None
    if not (isinstance(sh, int) and isinstance(sw, int) and sh >= 1 and sw >= 1):
        return None
    bounds = _window_bounds(valid, names, ones, (oy, dy, sh), (ox, dx, sw))
    if bounds is None:
        return None
    lows = [bounds[a][0] for a in "yx"]
    ph, pw = (0 if p is None else p for p in lows)
    ih = _extent(bounds["y"][1], ph, sh, shape[oy], kh)
    iw = _extent(bounds["x"][1], pw, sw, shape[ox], kw)
    base = sym.add(sym.add(off, sym.mul(ph, rs)), pw)
    cs = coef[names[kax[0]]]
    stride_b = coef[names[groups["b"][0]]] if groups["b"] else 0
    if not all(sym.prove_nonneg(x) for x in (base, cs, rs, ph, pw, sym.add(ih, -1),
                                              sym.add(iw, -1))):  # fmt: skip
        return None
    out = {key: val for key, val in fields.items() if key != "ldb"}
    out.update({"trans_b": 0, "b_offset": base, "stride_b": stride_b, "conv_c": shape[kax[0]],
                "conv_kh": kh, "conv_kw": kw, "conv_ow": shape[ox], "conv_sh": sh,
                "conv_sw": sw, "conv_ph": ph, "conv_pw": pw, "conv_ih": ih, "conv_iw": iw,
                "conv_cs": cs, "conv_rs": rs})  # fmt: skip
    return v.buf, out


def split_patch_copy(
    copy: K.Kernel, fields: dict[str, sint | float], new_buffer_id: int
) -> tuple[K.Kernel, K.Kernel] | None:
    """A patch copy that computes its values (a group norm and an activation fused into it)
    as a kernel over the image writing buffer ``new_buffer_id`` and a plain patch copy of that
    (``implicit_conv`` reads it); None unless the value depends on the window's position only
    through the input row oy + dy - ph and column (stride 1): the copy's value with the image
    kernel's value put back in must be the copy's value itself."""
    v, groups = copy.value, _patch_axes(copy, fields)
    valid: sint = 1
    if isinstance(v, K.Masked):
        valid = v.valid
        v = v.value
    if v.dtype is not dt.f32 or groups is None or len(groups["k"]) != 3 or isinstance(v, K.Load):
        return None
    shape = copy.shape
    names = [f"_i{j}" for j in range(len(shape))]
    ones: dict[str, sint] = {names[j]: 0 for j, s in enumerate(shape) if s == 1}
    (c, dy, dx), (oy, ox), bax = groups["k"], groups["n"], groups["b"]
    bounds = _window_bounds(valid, names, ones, (oy, dy, 1), (ox, dx, 1))
    if bounds is None:
        return None
    lows = [bounds[a][0] for a in "yx"]
    ph, pw = (0 if p is None else p for p in lows)
    kh, kw = shape[dy], shape[dx]
    if not all(isinstance(t, int) for t in (ph, pw, kh, kw)) or ph >= kh or pw >= kw:  # type: ignore[operator]
        return None  # the tap that reads input row y at output row y: dy = ph
    ih = _extent(bounds["y"][1], ph, 1, shape[oy], shape[dy])
    iw = _extent(bounds["x"][1], pw, 1, shape[ox], shape[dx])
    img: list[sint] = [*([shape[bax[0]]] if bax else []), shape[c], ih, iw]
    at = [sym.index_var(j, s) for j, s in enumerate(img)]
    iv = [sym.index_var(j, s) for j, s in enumerate(shape)]
    nb = len(bax)
    to_img: dict[str, sint] = {**ones, names[c]: at[nb], names[oy]: at[nb + 1], names[dy]: ph,
                               names[ox]: at[nb + 2], names[dx]: pw}  # fmt: skip
    if bax:
        to_img[names[bax[0]]] = at[0]
    value = K.substitute(v, to_img)
    y = sym.add(sym.add(iv[oy], iv[dy]), -ph)
    x = sym.add(sym.add(iv[ox], iv[dx]), -pw)
    back: dict[str, sint] = {f"_i{nb}": iv[c], f"_i{nb + 1}": y, f"_i{nb + 2}": x}
    if bax:
        back["_i0"] = iv[bax[0]]
    if K.substitute(value, back) != K.substitute(v, ones):
        return None
    flat: sint = 0
    for e, st in zip([back[f"_i{j}"] for j in range(len(img))], contiguous_strides(img),
                     strict=True):  # fmt: skip
        flat = sym.add(flat, sym.mul(e, st))
    image = K.Kernel(f"{copy.name}_image", tuple(img), new_buffer_id, value, dt.f32)
    read = K.Masked(valid, K.Load(new_buffer_id, flat, 1, dt.f32), dt.f32)
    return image, K.Kernel(copy.name, shape, copy.out, read, dt.f32)
