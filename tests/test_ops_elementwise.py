"""Elementwise ops and activations against PyTorch: odd sizes, a permuted (non-contiguous)
input, a symbolic length bound to 1 / 783 / 4097, broadcasting, integer dtypes, ±inf and NaN."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.functional as F
from luminal.graph import dtypes as dt
from optest import check_op, rand

POS = {"low": 0.1, "high": 4.0}
# name, luminal fn, torch fn, input kwargs, atol, rtol
UNARY = [
    ("abs", F.abs, torch.abs, {}, 0, 0),
    ("neg", F.neg, torch.neg, {}, 0, 0),
    ("sign", F.sign, torch.sign, {}, 0, 0),
    ("square", F.square, torch.square, {}, 1e-6, 1e-6),
    ("reciprocal", F.reciprocal, torch.reciprocal, POS, 1e-6, 1e-6),
    ("exp", F.exp, torch.exp, {"low": -10, "high": 10}, 1e-6, 2e-6),
    ("exp2", F.exp2, torch.exp2, {}, 1e-6, 1e-6),
    ("expm1", F.expm1, torch.expm1, {}, 1e-7, 1e-6),
    ("log", F.log, torch.log, POS, 1e-6, 1e-6),
    ("log2", F.log2, torch.log2, POS, 1e-6, 1e-6),
    ("log10", F.log10, torch.log10, POS, 1e-6, 1e-6),
    ("log1p", F.log1p, torch.log1p, {"low": -0.9, "high": 3}, 1e-7, 1e-6),
    ("sqrt", F.sqrt, torch.sqrt, POS, 1e-6, 1e-6),
    ("rsqrt", F.rsqrt, torch.rsqrt, POS, 1e-6, 1e-6),
    ("sin", F.sin, torch.sin, {"low": -20, "high": 20}, 1e-6, 1e-5),
    ("cos", F.cos, torch.cos, {"low": -20, "high": 20}, 1e-6, 1e-5),
    ("tan", F.tan, torch.tan, {"low": -1.4, "high": 1.4}, 1e-5, 1e-5),
    ("tanh", F.tanh, torch.tanh, {"low": -6, "high": 6}, 1e-7, 1e-6),
    ("sinh", F.sinh, torch.sinh, {}, 1e-7, 1e-6),
    ("cosh", F.cosh, torch.cosh, {}, 1e-7, 1e-6),
    ("sigmoid", F.sigmoid, torch.sigmoid, {"low": -20, "high": 20}, 1e-7, 1e-6),
    ("erf", F.erf, torch.erf, {"low": -5, "high": 5}, 1e-7, 1e-6),
    ("erfc", F.erfc, torch.erfc, {"low": -1, "high": 1}, 1e-7, 1e-6),
    ("trunc", F.trunc, torch.trunc, {"low": -50, "high": 50}, 0, 0),
    ("floor", F.floor, torch.floor, {"low": -50, "high": 50}, 0, 0),
    ("ceil", F.ceil, torch.ceil, {"low": -50, "high": 50}, 0, 0),
    ("round", F.round, torch.round, {"low": -50, "high": 50}, 0, 0),
    ("frac", F.frac, torch.frac, {"low": -50, "high": 50}, 1e-6, 0),
    ("relu", F.relu, torch.relu, {}, 0, 0),
    ("relu6", F.relu6, TF.relu6, {"low": -3, "high": 9}, 0, 0),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), lambda x: TF.leaky_relu(x, 0.2), {}, 1e-7, 1e-6),
    ("elu", F.elu, TF.elu, {}, 1e-7, 1e-6),
    ("celu", lambda x: F.celu(x, 0.7), lambda x: TF.celu(x, 0.7), {}, 1e-7, 1e-6),
    ("selu", F.selu, TF.selu, {}, 1e-7, 1e-6),
    # torch's f32 gelu loses the negative tail (1 + erf cancels); compare with its f64
    ("gelu", F.gelu, lambda x: TF.gelu(x.double()).float(), {"low": -6, "high": 6}, 1e-6, 1e-5),
    (
        "gelu",
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: TF.gelu(x, approximate="tanh"),
        {"low": -6, "high": 6},
        1e-6,
        1e-5,
    ),
    ("silu", F.silu, TF.silu, {}, 1e-7, 1e-6),
    ("softplus", F.softplus, TF.softplus, {"low": -30, "high": 30}, 1e-6, 1e-6),
    (
        "softplus",
        lambda x: F.softplus(x, beta=2.0),
        lambda x: TF.softplus(x, beta=2.0),
        {},
        1e-6,
        1e-6,
    ),
    ("mish", F.mish, TF.mish, {"low": -6, "high": 6}, 1e-6, 1e-5),
    ("logsigmoid", F.logsigmoid, TF.logsigmoid, {"low": -30, "high": 30}, 1e-6, 1e-6),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 1.5), lambda x: TF.hardtanh(x, -0.5, 1.5), {}, 0, 0),
    ("hardsigmoid", F.hardsigmoid, TF.hardsigmoid, {"low": -5, "high": 5}, 1e-7, 1e-6),
    ("hardswish", F.hardswish, TF.hardswish, {"low": -5, "high": 5}, 1e-6, 1e-6),
    ("softsign", F.softsign, TF.softsign, {}, 1e-7, 1e-6),
    ("tanhshrink", F.tanhshrink, TF.tanhshrink, {}, 1e-6, 1e-5),
    (
        "threshold",
        lambda x: F.threshold(x, 0.3, -7.0),
        lambda x: TF.threshold(x, 0.3, -7.0),
        {},
        0,
        0,
    ),
    ("isnan", F.isnan, torch.isnan, {}, 0, 0),
    ("isinf", F.isinf, torch.isinf, {}, 0, 0),
    ("isfinite", F.isfinite, torch.isfinite, {}, 0, 0),
    ("logical_not", F.logical_not, torch.logical_not, {}, 0, 0),
    ("nan_to_num", F.nan_to_num, torch.nan_to_num, {}, 0, 0),
    ("clamp", lambda x: F.clamp(x, -0.5, 0.7), lambda x: torch.clamp(x, -0.5, 0.7), {}, 0, 0),
    ("pow", lambda x: x**3, lambda x: x**3, {}, 1e-5, 1e-6),
    ("pow", lambda x: x**1.7, lambda x: x**1.7, POS, 1e-5, 1e-5),
]


@pytest.mark.parametrize(
    "name,fn,ref,kw,atol,rtol", UNARY, ids=[f"{u[0]}{i}" for i, u in enumerate(UNARY)]
)
def test_unary(name, fn, ref, kw, atol, rtol):
    # a permuted (non-contiguous) 50x3 input, then one graph over a symbolic n = 783, 4097, 1
    check_op(
        name,
        lambda a: fn(a.permute(1, 0)),
        lambda a: ref(a.T),
        [rand(3, 50, **kw)],
        atol=atol,
        rtol=rtol,
    )
    n = lm.dim("n", 1, 8192)
    check_op(
        name,
        fn,
        ref,
        [rand(783, **kw)],
        shapes=[(n,)],
        more=[[rand(4097, **kw)], [rand(1, **kw)]],
        atol=atol,
        rtol=rtol,
    )


SPECIAL = np.array(
    [
        np.nan,
        np.inf,
        -np.inf,
        0.0,
        -0.0,
        1.5,
        -2.5,
        0.5,
        -0.5,
        2.5,
        3e38,
        -3e38,
        1e-30,
        7.0,
        -7.0,
        1e10,
        8388609.0,
    ],
    dtype=np.float32,
)
SPECIAL_OPS = [
    "abs",
    "neg",
    "sign",
    "trunc",
    "floor",
    "ceil",
    "round",
    "relu",
    "isnan",
    "isinf",
    "isfinite",
    "nan_to_num",
    "clamp",
    "sigmoid",
    "exp",
    "tanh",
    "expm1",
    "hardtanh",
    "softplus",
    "logsigmoid",
    "elu",
    "leaky_relu",
    "relu6",
    "log1p",
]


@pytest.mark.parametrize("name", SPECIAL_OPS)
def test_unary_special_values(name):
    _, fn, ref, _, atol, rtol = next(u for u in UNARY if u[0] == name)
    check_op(name, fn, ref, [SPECIAL], atol=max(atol, 1e-6), rtol=max(rtol, 1e-5))


def test_isposinf_isneginf_nan_to_num_args():
    check_op("isposinf", F.isposinf, torch.isposinf, [SPECIAL])
    check_op("isneginf", F.isneginf, torch.isneginf, [SPECIAL])
    check_op(
        "nan_to_num",
        lambda x: F.nan_to_num(x, 1.0, 2.0, -3.0),
        lambda x: torch.nan_to_num(x, 1.0, 2.0, -3.0),
        [SPECIAL],
    )


# name, fn, ref; inputs broadcast (50, 1) with (1, 7) and a (783,) with a scalar
BINARY = [
    ("add", lambda a, b: a + b, torch.add),
    ("sub", lambda a, b: a - b, torch.sub),
    ("mul", lambda a, b: a * b, torch.mul),
    ("div", lambda a, b: a / b, torch.div),
    ("floor_divide", lambda a, b: a // b, torch.floor_divide),
    ("remainder", lambda a, b: a % b, torch.remainder),
    ("fmod", F.fmod, torch.fmod),
    ("pow", lambda a, b: F.pow(F.abs(a), b), lambda a, b: torch.pow(torch.abs(a), b)),
    ("maximum", F.maximum, torch.maximum),
    ("minimum", F.minimum, torch.minimum),
    ("lt", lambda a, b: a < b, torch.lt),
    ("le", lambda a, b: a <= b, torch.le),
    ("gt", lambda a, b: a > b, torch.gt),
    ("ge", lambda a, b: a >= b, torch.ge),
    ("eq", lambda a, b: a == b, torch.eq),
    ("ne", lambda a, b: a != b, torch.ne),
    ("logical_and", F.logical_and, torch.logical_and),
    ("logical_or", F.logical_or, torch.logical_or),
    ("logical_xor", F.logical_xor, torch.logical_xor),
    ("lerp", lambda a, b: F.lerp(a, b, 0.3), lambda a, b: torch.lerp(a, b, 0.3)),
    ("clamp", lambda a, b: F.clamp(a, min=b), lambda a, b: torch.clamp(a, min=b)),
    ("where", lambda a, b: F.where(a > 0, a, b), lambda a, b: torch.where(a > 0, a, b)),
]


def _nz(x):
    return np.where(np.abs(x) < 0.1, 0.5, x).astype(x.dtype)


@pytest.mark.parametrize("name,fn,ref", BINARY, ids=[f"{b[0]}{i}" for i, b in enumerate(BINARY)])
def test_binary_float(name, fn, ref):
    a, b = rand(50, 1), _nz(rand(1, 7))
    a[::7] = np.round(a[::7])  # ties for comparisons
    b[0, ::2] = np.round(b[0, ::2]) + 0.5
    check_op(name, fn, ref, [a, b], atol=1e-5, rtol=1e-5)
    check_op(name, fn, ref, [rand(783), _nz(rand(783))], atol=1e-5, rtol=1e-5)


INT_OPS = [
    "add",
    "sub",
    "mul",
    "floor_divide",
    "remainder",
    "fmod",
    "maximum",
    "minimum",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
    "logical_and",
    "logical_or",
    "logical_xor",
    "where",
]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("name", INT_OPS)
def test_binary_int(name, dtype):
    fn, ref = next((b[1], b[2]) for b in BINARY if b[0] == name)
    a = rand(50, 1, dtype=dtype, low=-40, high=40)
    b = rand(1, 7, dtype=dtype, low=-9, high=9)
    b[b == 0] = 3
    check_op(name, fn, ref, [a, b])


def test_true_division_of_ints_is_float():
    check_op(
        "true_divide",
        lambda a, b: a / b,
        torch.true_divide,
        [rand(50, dtype=np.int32, low=-9, high=9), np.full(50, 4, np.int32)],
    )
    check_op(
        "div",
        lambda a, b: F.div(a, b, rounding_mode="trunc"),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        [rand(50, dtype=np.int64, low=-99, high=99), np.full(50, -7, np.int64)],
    )
    check_op(
        "div",
        lambda a, b: F.div(a, b, rounding_mode="trunc"),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        [rand(50, low=-99, high=99), _nz(rand(50))],
    )


def test_special_binary():
    x = SPECIAL
    y = SPECIAL[::-1].copy()
    for name in ("eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum", "where"):
        fn, ref = next((b[1], b[2]) for b in BINARY if b[0] == name)
        check_op(name, fn, ref, [x, y])


def test_scalar_operators_and_promotion():
    ints = rand(3, 50, dtype=np.int32, low=-9, high=9)
    check_op("__rsub__", lambda a: 2 - a, lambda a: 2 - a, [ints])
    check_op("__rmul__", lambda a: 2.5 * a, lambda a: 2.5 * a, [ints])
    check_op("__rtruediv__", lambda a: 1 / (a.float() + 10), lambda a: 1 / (a.float() + 10), [ints])
    check_op("__rpow__", lambda a: 2.0**a, lambda a: 2.0**a, [rand(3, 50)], rtol=1e-6)
    check_op("__rpow__", lambda a: 2**a, lambda a: 2**a, [rand(50, dtype=np.int64, low=0, high=20)])
    check_op("pow", lambda a: a**2, lambda a: a**2, [ints])
    check_op(
        "pow",
        lambda a, b: a**b,
        lambda a, b: a**b,
        [rand(50, low=-3, high=3), np.round(rand(50, low=-3, high=3))],
        rtol=1e-5,
    )
    check_op("pow", lambda a: a**-2, lambda a: a**-2, [_nz(rand(50))], rtol=1e-6)
    check_op("pow", lambda a: a**0.5, lambda a: a**0.5, [rand(50, low=0, high=5)], rtol=1e-6)
    check_op("pow", lambda a: a**0, lambda a: a**0, [rand(50)])
    check_op("__rfloordiv__", lambda a: 7 // (a.abs() + 1), lambda a: 7 // (a.abs() + 1), [ints])
    check_op(
        "__rmod__",
        lambda a: 7.5 % _nzt(a),
        lambda a: 7.5 % torch.where(a.abs() < 0.1, 0.5, a),
        [rand(50)],
    )
    check_op("lt", lambda a: 0.5 > a, lambda a: 0.5 > a, [ints])
    check_op("eq", lambda a: a == 3, lambda a: a == 3, [ints])
    check_op("abs", lambda a: abs(a), lambda a: abs(a), [ints])
    check_op("neg", lambda a: -a, lambda a: -a, [ints])
    b1, b2 = rand(7, 5, dtype=bool), rand(5, dtype=bool)
    check_op("bitwise_and", lambda a, b: a & b, lambda a, b: a & b, [b1, b2])
    check_op("bitwise_or", lambda a, b: a | b, lambda a, b: a | b, [b1, b2])
    check_op("bitwise_xor", lambda a, b: a ^ b, lambda a, b: a ^ b, [b1, b2])
    check_op("bitwise_not", lambda a: ~a, lambda a: ~a, [b1])
    check_op("bitwise_not", lambda a: ~a, lambda a: ~a, [ints])
    check_op("bitwise_or", lambda a: a | True, lambda a: a | True, [b1])
    check_op("add", lambda a, b: a + b, lambda a, b: a + b, [b1, b2])


def _nzt(a):
    return F.where(F.abs(a) < 0.1, 0.5, a)


def test_where_scalars_broadcast_and_exactness():
    c = rand(4, 1, 5, dtype=bool)
    x = rand(3, 5)
    x[0, 0], x[1, 1], x[2, 2] = np.inf, -np.inf, np.nan
    check_op("where", lambda c, x: F.where(c, x, 0.0), lambda c, x: torch.where(c, x, 0.0), [c, x])
    check_op(
        "where",
        lambda c, x: F.where(c, -np.inf, x),
        lambda c, x: torch.where(c, -np.inf, x),
        [c, x],
    )
    check_op("where", lambda c: F.where(c, 1.0, 2.0), lambda c: torch.where(c, 1.0, 2.0), [c])
    check_op("where", lambda c, x: x.where(c, x * 2), lambda c, x: x.where(c, x * 2), [c, x])
    check_op(
        "where",
        lambda c, a, b: F.where(c, a, b),
        torch.where,
        [c, rand(3, 5, dtype=bool), rand(5, dtype=bool)],
    )


def test_low_precision_dtypes():
    a = rand(50, 3).astype(np.float16)
    check_op("exp", F.exp, torch.exp, [a], atol=1e-3, rtol=1e-3)
    check_op("gelu", F.gelu, TF.gelu, [a], atol=1e-3, rtol=1e-3)
    check_op("add", lambda x: x + 1.5, lambda x: x + 1.5, [a], atol=1e-3, rtol=1e-3)
    # bf16: numpy holds it through ml_dtypes; compare with torch's bf16 result
    g = lm.Graph("bf16")
    x = g.input("x", (50,), lm.bf16)
    g.output("y", F.silu(x))
    a32 = rand(50)
    got = g.run({"x": a32.astype(ml_dtypes.bfloat16)})["y"]
    want = TF.silu(torch.from_numpy(a32).bfloat16()).float().numpy()
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_clamp_with_tensor_bounds_and_symbolic_seq():
    seq = lm.dim("seq", 1, 512)
    check_op(
        "clamp",
        lambda x, lo, hi: x.clamp(lo, hi),
        lambda x, lo, hi: x.clamp(lo, hi),
        [rand(7, 5), rand(5, low=-1, high=0), rand(7, 1, low=0, high=1)],
        shapes=[(seq, 5), None, (seq, 1)],
        more=[[rand(1, 5), rand(5), rand(1, 1)], [rand(300, 5), rand(5), rand(300, 1)]],
    )


def test_float_widens_to_f32_like_torch() -> None:
    """``Tensor.float()`` is torch's: f32 from any dtype (a product of f16 operands widened
    with it sums in f32); float-only ops keep a float input's own width."""
    g = lm.Graph("float")
    for d in (dt.f16, dt.bf16, dt.f64, dt.i32, dt.f32):
        x = g.input(f"x_{d.name}", (3,), d)
        assert x.float().dtype is dt.f32, d
    h = g.input("h", (3,), dt.f16)
    assert h.exp2().dtype is dt.f16 and h.sqrt().dtype is dt.f16
    assert g.input("i", (3,), dt.i32).exp2().dtype is dt.f32
