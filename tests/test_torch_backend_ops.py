"""Converters added for PyTorch's op database, through torch.compile against eager: sorting,
special functions, index reductions, training-mode batch norm, scatters into slices and
diagonals, windows, pooling indices and interpolation. Ops share compiled functions (one
plan each) and each function must run with no ATen op left to eager."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import luminal.torch_backend as lt  # noqa: E402
from luminal.torch_backend import luminal_backend  # noqa: E402
from optest import check_converts  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


_check = check_converts


def test_sorting_and_special_functions():
    def fn(x):
        v, i = torch.sort(x, dim=1, descending=True, stable=True)
        t = torch.topk(x, 3, dim=-1)
        k = torch.kthvalue(x, 4, dim=0)
        m = torch.nanmedian(x, dim=1)
        return (v, i, t.values, t.indices, k.values, k.indices, m.values, torch.msort(x),
                torch.logcumsumexp(x, 1), torch.polygamma(2, x), x.angle())  # fmt: skip

    x = torch.randn(7, 13) * 3
    x[2, 5] = float("nan")
    _check(fn, x, atol=1e-4)


def test_index_reductions_and_scatters():
    def fn(x, idx, src, y, idx1, src1):
        a = x.scatter_reduce(0, idx, src, "amax", include_self=False)
        b = x.scatter_reduce(0, idx, src, "mean")
        c = y.index_reduce(1, idx1, src1, "prod")
        d = torch.slice_scatter(x, src[::2] * 0 + 7, dim=0, start=1, step=2)
        e = torch.diagonal_scatter(x, torch.ones(4), offset=-2)
        return a, b, c, d, e

    x, src, y = torch.randn(6, 4), torch.randn(5, 4), torch.randn(3, 7)
    idx, idx1 = torch.randint(0, 6, (5, 4)), torch.randint(0, 7, (5,))
    _check(fn, x, idx, src, y, idx1, torch.randn(3, 5))


def test_training_batch_norm_updates_running_stats():
    bn = torch.nn.BatchNorm2d(3).train()
    bn_ref = torch.nn.BatchNorm2d(3).train()
    x = torch.randn(4, 3, 5, 7)
    with torch.no_grad():
        want = bn_ref(x)
        got = torch.compile(bn, backend=luminal_backend)(x)
    assert lt.stats.eager_ops == {}, lt.stats.fallbacks
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.running_mean, bn_ref.running_mean)
    torch.testing.assert_close(bn.running_var, bn_ref.running_var)


def test_windows_pooling_interpolation():
    def fn(x):
        u = x.unfold(3, 3, 2)
        v, i = F.adaptive_max_pool2d(x, (3, 4), return_indices=True)
        s = torch.as_strided(x, (2, 3, 4), (5, 1, 7), 2)
        b = F.interpolate(x, size=(9, 5), mode="bilinear", align_corners=False)
        p = F.avg_pool3d(x.unsqueeze(1), 2)
        mv, mi = F.max_pool2d(x, 3, 2, 1, dilation=(1, 2), ceil_mode=True, return_indices=True)
        return u, v, i, s, b, p, mv, mi

    _check(fn, torch.randn(2, 3, 7, 9))


def test_bits_and_searching():
    def fn(x, y, b, seq, v, m, src, idx):
        mant, ex = torch.frexp(x)
        return (mant, ex, torch.nextafter(x, y), torch.nextafter(x, -y), torch.bucketize(x, b),
                torch.bucketize(x, b, right=True, out_int32=True), torch.searchsorted(seq, v),
                torch.searchsorted(seq, v, side="right"), v.masked_scatter(m, src),
                v.put(idx, src[:5], accumulate=True))  # fmt: skip

    edges = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 1e-40, -1e-42, 1e30, float("inf"), -float("inf"),
             float("nan"), 2.0**-126, 1.5e-45]  # fmt: skip
    x = torch.cat([torch.tensor(edges), torch.randn(23) * 5])
    y = torch.randn(x.shape[0])
    y[:4] = torch.tensor([1.0, -0.0, 5.0, -1.0])
    b = torch.tensor([-1.0, 0.0, 0.5, 2.0, 2.0, 7.0])
    seq = torch.sort(torch.randn(3, 9), dim=1).values
    v = torch.randn(3, 5)
    _check(fn, x, y, b, seq, v, torch.rand(3, 5) > 0.5, torch.randn(15),
           torch.tensor([0, -1, 5, 7, 13]), atol=0, rtol=0)  # fmt: skip
