"""Value rewrites of lowering and code generation that keep the value but change the program:
an exact ``where`` as a two-way gather, the product read from its buffer everywhere in a gemm
epilogue, and expressions of no loop variable computed once per call. Each is checked for its
structure and, through compile, against numpy at odd sizes."""

import dataclasses

import numpy as np

import luminal as lm
import luminal.functional as F
from kernel_cache import use_kernel_cache
from luminal.codegen.cpu.kernel import render_kernel
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.search.gemm import match_gemm
from luminal.graph import symbolic as sym
from optest import rand

N = lm.dim("n", 1, 512)


def _where_graph() -> lm.Graph:
    g = lm.Graph("where")
    x = g.input("x", (N, 37))
    row = x.sum_reduce(1).unsqueeze(1).expand((N, 37))
    g.output("y", F.where(x < 0.25, x.exp2(), row))
    return g


def test_where_is_a_two_way_gather_with_static_indices():
    low = lower(_where_graph())
    gathers = [v for k in low.kernels if isinstance(k, K.Kernel) for v in K.walk(k.value)
               if isinstance(v, K.Gather)]  # fmt: skip
    assert gathers and all(g.rows == 2 for g in gathers)
    # the sides' loads index by the loop variables alone, not by the runtime row
    for g in gathers:
        loads = [v for v in K.walk(g.body) if isinstance(v, K.Load)]
        assert loads and all(g.var.name not in K._expr_vars(v.index) for v in loads)


def test_where_two_way_gather_values():
    x = rand(23, 37)
    x[1, 4], x[2, 5], x[3, 6] = np.inf, -np.inf, np.nan
    got = lm.compile(_where_graph()).run({"x": x})["y"]
    want = np.where(x < 0.25, np.exp2(x), x.sum(1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gemm_epilogue_reads_every_equal_copy_of_the_product():
    g = lm.Graph("sq")
    x, w = g.input("x", (N, 19)), g.input("w", (19, 29))
    h = x.matmul(w)
    g.output("y", h)
    low = lower(g)
    (kern,) = low.kernels
    r = kern.value
    assert isinstance(r, K.Reduce)
    copy = dataclasses.replace(r)  # equal, not the same object: two paths to one product
    assert copy == r and copy is not r
    kern2 = K.Kernel(kern.name, kern.shape, kern.out, K.Alu(lm.Op.MUL, (r, copy), r.dtype),
                     kern.dtype)  # fmt: skip
    alt = match_gemm(kern2, len(low.buffers))
    assert alt is not None and alt.epilogue is not None
    assert not any(isinstance(v, K.Reduce) for v in K.walk(alt.epilogue.value))


def test_scalar_input_expression_computed_once_per_call():
    g = lm.Graph("scal")
    x, s = g.input("x", (N, 37)), g.input("s", (), "f64")
    scale = s.reciprocal().mul(2.0).sqrt().cast("f32").expand((N, 37))
    g.output("y", x.mul(scale).maximum(-1.5).exp2())
    low = lower(g)
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    src = render_kernel(kern, list(low.dims)).source
    body = src[src.index(f"void {kern.name}") :]
    assert body.index("sqrt(") < body.index("for (int64_t t")
    xv, sv = rand(9, 37), np.array(np.pi)
    got = lm.compile(g).run({"x": xv, "s": sv})["y"]
    want = np.exp2(np.maximum(xv * np.float32(np.sqrt(2 / np.pi)), -1.5))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _symbolic_divisions(e) -> list:
    from luminal.graph import symbolic as sym

    if not isinstance(e, sym.Expr) or e.kind == sym.VAR:
        return []
    loop_vars = any(n.startswith("_") for n in sym.var_names(e.args[0]))
    div = e.kind in (sym.DIV, sym.MOD) and loop_vars and not isinstance(e.args[1], int)
    found = [e] if div else []
    subs = [t for t, _ in e.args[0]] if e.kind == sym.ADD else e.args
    return found + [x for s in subs for x in _symbolic_divisions(s)]


def test_conv_after_pool_copies_read_affinely(tmp_path, monkeypatch):
    """A convolution with padding reading a max pool of a runtime-sized image: the pooled
    im2col copy indexes by its loop variables (no division by the image size per element)."""
    import torch

    from luminal.compile import build_plan
    from luminal.compiler.search import select

    g = lm.Graph("poolconv")
    h = lm.dim("h", 4, 256)
    x, w = g.input("x", (N, 8, h, h)), g.input("w", (16, 4, 3, 3))
    g.output("y", F.conv2d(F.max_pool2d(x.relu(), 2), w, stride=2, padding=1, groups=2))
    use_kernel_cache(monkeypatch, tmp_path)
    low = select.choose_library_calls(
        lower(g), lambda sub, d: 1.0 if any(isinstance(s, K.LibCall) for s in sub.kernels) else 2.0
    )
    copies = [k for k in low.kernels if isinstance(k, K.Kernel) and "_copy" in k.name]
    assert copies
    for k in copies:
        for v in K.walk(k.value):
            if isinstance(v, K.Load):
                assert not _symbolic_divisions(v.index), (k.name, v.index)
    xv, wv = rand(3, 8, 13, 13), rand(16, 4, 3, 3)
    got = lm.load(build_plan(low, g.name).to_bytes()).run({"x": xv, "w": wv})["y"]
    tx = torch.nn.functional.max_pool2d(torch.tensor(xv).relu(), 2)
    want = torch.nn.functional.conv2d(tx, torch.tensor(wv), stride=2, padding=1, groups=2)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_split_axes_merge_back_to_the_flat_index():
    """A flat -> (b, s, 4, 16) -> flat reshape reads its source at the flat index itself;
    k*(x % c) + k*c*((x // c) % m) == k*(x % (c*m)) holds exhaustively."""
    b, s = sym.dim("b", 1, 8), sym.dim("s", 1, 64)
    g = lm.Graph("round_trip")
    x = g.input("x", (b * s * 64,))
    g.output("y", x.reshape((b, s, 4, 16)).reshape((b * s * 64,)).exp())
    (k,) = lower(g).kernels
    (load,) = [v for v in K.walk(k.value) if isinstance(v, K.Load)]
    assert load.index == sym.var("_i0", 0, load.index.hi, load.index.extent)
    v = sym.var("v", 0, 511, 512)
    for c, m in ((1, 3), (4, 2), (3, 5), (16, 4)):
        for kk in (1, 3):
            e = sym.add(sym.mul(kk, sym.mod(v, c)), sym.mul(kk * c, sym.mod(sym.floordiv(v, c), m)))
            for x in (0, 1, 7, 63, 200, 511):
                assert sym.evaluate(e, {"v": x}) == kk * (x % (c * m)), (c, m, kk, x)
    x0 = rand(2 * 3 * 64)
    got = lm.compile(g).run({"x": x0}, b=2, s=3)["y"]
    np.testing.assert_allclose(got, np.exp(x0), rtol=1e-5)


def test_reshape_of_an_empty_tensor():
    g = lm.Graph("empty")
    g.output("y", g.input("x", (0, 6)).reshape((6, 0)).exp())
    assert lm.compile(g).run({"x": np.zeros((0, 6), np.float32)})["y"].shape == (6, 0)


def test_concatenated_halves_of_a_slice_read_affinely():
    """Rotary embeddings' rotate_half, cat(-x[..., 16:], x[..., :16]), of a query sliced out of
    a fused projection with runtime batch and length: each half reads where its mask holds,
    and there the index is affine (no division by the row count, no modulo of the column)."""
    import torch

    b, s = sym.dim("b", 1, 64), sym.dim("s", 1, 512)
    g = lm.Graph("rotate_half")
    qkv, bias = g.input("qkv", (b * s, 256)), g.input("bias", (128,))  # a linear layer's rows
    q = (qkv.slice(1, 0, 128) + bias).reshape((b, s, 4, 32)).permute((0, 2, 1, 3))
    g.output("y", F.cat([q.slice(3, 16, 16) * -1.0, q.slice(3, 0, 16)], 3))
    for k in lower(g).kernels:
        for v in K.walk(k.value):
            if isinstance(v, K.Load):
                assert not sym.has_divmod(v.index), v.index
    x, bv = rand(15, 256), rand(128)
    got = lm.compile(g).run({"qkv": x, "bias": bv}, b=3, s=5)["y"]
    tq = (torch.tensor(x)[:, :128] + torch.tensor(bv)).reshape(3, 5, 4, 32).transpose(1, 2)
    want = torch.cat((-tq[..., 16:], tq[..., :16]), -1)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


def test_erf_gelu_lands_in_the_product_kernel():
    """abs(x) is a 2-way max over a padded copy of x: x is read through two views that land
    on the same element, so the biased product is inlined into the whole erf GELU (one
    kernel, the GELU in the gemm's epilogue) instead of stored and read back."""
    g = lm.Graph("lin_gelu")
    x, w, b = g.input("x", (N, 45)), g.input("w", (67, 45)), g.input("b", (67,))
    g.output("y", F.gelu(F.linear(x, w, b)))
    low = lower(g)
    (kern,) = [k for k in low.kernels if isinstance(k, K.Kernel)]
    assert any(isinstance(v, K.Reduce) and v.op is lm.Op.SUM_REDUCE for v in K.walk(kern.value))
    alt = match_gemm(kern, len(low.buffers))
    assert alt is not None and alt.epilogue is not None
    xv, wv, bv = rand(13, 45), rand(67, 45), rand(67)
    xv[0, :3] = [1e4, -1e4, 0.0]
    got = lm.compile(g).run({"x": xv, "w": wv, "b": bv})["y"]
    import torch

    want = torch.nn.functional.gelu(torch.from_numpy(xv) @ torch.from_numpy(wv).T
                                    + torch.from_numpy(bv)).numpy()  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_padded_window_of_a_permuted_sum_reads_affinely():
    """ConvNeXt's depthwise convolution reads a residual sum whose one side is permuted from
    channels-last: the padded window's flat offset splits into (n, c, h, w) only under its
    mask (``2 < h + r // 7 < 11``), and there every division but the tap's folds away. The
    simplified index equals the unsimplified one wherever the mask holds (checked at every
    point)."""
    import itertools

    import torch

    from luminal.compiler.masked import unflatten

    for hh, ww, kk, pad, stride in ((5, 6, 7, 3, 1), (7, 5, 3, 1, 2)):
        g = lm.Graph("dwres")
        x, b = g.input("x", (2, hh, ww, 16)), g.input("b", (16,))
        r, w = g.input("r", (2, 16, hh, ww)), g.input("w", (16, 1, kk, kk))
        y = (x + b).permute((0, 3, 1, 2)) + r
        g.output("y", F.conv2d(y, w, padding=pad, stride=stride, groups=16))
        for k in lower(g).kernels:
            for v in K.walk(k.value):
                if isinstance(v, K.Load):
                    assert all(d.args[1] == kk for d in sym.divmods(v.index)), v.index
        xv, bv, rv, wv = rand(2, hh, ww, 16), rand(16), rand(2, 16, hh, ww), rand(16, 1, kk, kk)
        got = lm.compile(g).run({"x": xv, "b": bv, "r": rv, "w": wv})["y"]
        ty = (torch.tensor(xv) + torch.tensor(bv)).permute(0, 3, 1, 2) + torch.tensor(rv)
        want = torch.nn.functional.conv2d(ty, torch.tensor(wv), padding=pad, stride=stride,
                                          groups=16)  # fmt: skip
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)

    # the flat offset of a padded 3x3 window over a (2, 4, 5, 6) tensor, split with its mask
    i, j = sym.index_var(0, 5), sym.index_var(1, 6)
    n, c = sym.index_var(2, 2), sym.index_var(3, 4)
    t = sym.var("_r0", 0, 8, 9)
    row, col = sym.add(i, sym.floordiv(t, 3)), sym.add(j, sym.mod(t, 3))
    flat = sym.add(sym.add(sym.mul(n, 120), sym.mul(c, 30)), sym.add(sym.mul(row, 6), col))
    flat = sym.add(flat, -7)  # one row and one column of padding
    valid = sym.mul(
        sym.mul(sym.lt(0, row), sym.lt(row, 6)), sym.mul(sym.lt(0, col), sym.lt(col, 7))
    )
    shape = (2, 4, 5, 6)
    got = unflatten(flat, shape, valid)
    assert not any(sym.divmods(e) for e in got.values() if e is not None) or all(
        d.args[1] == 3 for e in got.values() for d in sym.divmods(e)
    ), got
    for iv, jv, nv, cv, tv in itertools.product(range(5), range(6), range(2), range(4), range(9)):
        env = {"_i0": iv, "_i1": jv, "_i2": nv, "_i3": cv, "_r0": tv}
        if not sym.evaluate(valid, env):
            continue
        f = sym.evaluate(flat, env)
        want_idx = [f // 120, f // 30 % 4, f // 6 % 5, f % 6]
        assert [sym.evaluate(got[f"_i{k}"], env) for k in range(4)] == want_idx, env


def test_row_statistics_are_not_recomputed_inside_a_convolution_copy():
    """ConvNeXt's channels-first layer norm (permute, layer_norm over the last axis, permute
    back) of a residual sum, feeding a 2x2 stride-2 convolution: the normalized value is
    inlined into the convolution's im2col copy, but the row mean and variance are not
    computed again there for every (channel, tap) of each patch (64 x 4 times each)."""
    import torch

    from luminal.compiler.pipeline import graph_passes

    g = lm.Graph("ln_conv")
    r, h = g.input("r", (2, 64, 8, 8)), g.input("h", (2, 8, 8, 64))
    s, w, b = g.input("s", (64,)), g.input("w", (64,)), g.input("b", (64,))
    cw = g.input("cw", (128, 64, 2, 2))
    x = r + (s * h).permute((0, 3, 1, 2))
    y = F.layer_norm(x.permute((0, 2, 3, 1)), (64,), w, b, 1e-6).permute((0, 3, 1, 2))
    g.output("y", F.conv2d(y, cw, stride=2))
    copies = [k for k in lower(graph_passes(g)).kernels if len(k.shape) == 6]
    assert copies  # (n, oh, ow, c, kh, kw)
    for k in copies:
        assert not any(isinstance(v, K.Reduce) for v in K.walk(k.value)), k.name
    vals = {"r": rand(2, 64, 8, 8), "h": rand(2, 8, 8, 64), "s": rand(64), "w": rand(64),
            "b": rand(64), "cw": rand(128, 64, 2, 2)}  # fmt: skip
    got = lm.compile(g).run(vals)["y"]
    t = {k: torch.tensor(v) for k, v in vals.items()}
    tx = (t["r"] + (t["s"] * t["h"]).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    ty = torch.nn.functional.layer_norm(tx, (64,), t["w"], t["b"], 1e-6).permute(0, 3, 1, 2)
    want = torch.nn.functional.conv2d(ty, t["cw"], stride=2)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_an_activation_summed_along_a_non_last_axis_is_stored_not_recomputed():
    """Rows gathered by an index (a mixture of experts' tokens, each by its expert's matrix)
    times an activation broadcast along the output columns, summed along the middle axis:
    the sum's loop is innermost, so an inlined SiLU would be computed again for each of the
    40 columns. It is stored by a kernel of its own and the product reads it."""
    g = lm.Graph("gathered_rows")
    rows = lm.dim("rows", 1, 64)
    h, w = g.input("h", (rows, 24)), g.input("w", (3, 24, 40))
    e = g.input("e", (rows,), lm.i64)
    act = F.silu(h)  # (rows, 24)
    ws = F.index_select(w, 0, e)  # (rows, 24, 40)
    g.output("y", (act.unsqueeze(-1) * ws).sum_reduce(1))
    low = lower(g)
    sums = [k for k in low.kernels if isinstance(k, K.Kernel)
            and any(isinstance(v, K.Reduce) for v in K.walk(k.value))]  # fmt: skip
    assert sums
    for k in sums:
        assert not any(isinstance(v, K.Alu) and v.op is lm.Op.EXP2 for v in K.walk(k.value))
    hv, wv = rand(13, 24), rand(3, 24, 40)
    ev = np.random.default_rng(1).integers(0, 3, 13)
    got = lm.compile(g).run({"h": hv, "w": wv, "e": ev})["y"]
    act_v = hv / (1 + np.exp(-hv))
    want = np.einsum("rk,rkn->rn", act_v, wv[ev])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
