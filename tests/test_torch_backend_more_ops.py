"""More of PyTorch's op database through torch.compile against eager: linalg error checks,
bilinear forms, pairwise distances, histograms, 3-D transposed convolution and sampling,
segment and bag reductions, pooling gradients. Each function must run with no ATen op left
to eager."""

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


def test_linalg_error_check_runs_on_the_plans_info():
    a = torch.randn(5, 5)
    a = a @ a.T + torch.eye(5)
    _check(torch.linalg.cholesky, a, atol=1e-4)
    assert lt.stats.checks == 1  # the check stayed in eager; the factorization did not
    f = torch.compile(torch.linalg.cholesky, backend=luminal_backend)
    with torch.no_grad(), pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        f(-a)


def test_bilinear_pdist_and_pooling_gradient():
    def fn(x1, w, x2, b, pts, g, img):
        _, idx = torch.ops.aten.max_pool2d_with_indices(img, [3, 2], [2, 2], [1, 0])
        back = torch.ops.aten.max_pool2d_with_indices_backward(
            g, img, [3, 2], [2, 2], [1, 0], [1, 1], False, idx
        )
        return F.bilinear(x1, x2, w, b), F.pdist(pts), F.pdist(pts, p=1.5), back

    img = torch.randn(2, 3, 9, 7)
    g = torch.randn(2, 3, 5, 3)
    _check(fn, torch.randn(5, 3), torch.randn(4, 3, 7), torch.randn(5, 7), torch.randn(4),
           torch.randn(7, 5), g, img, atol=1e-4)  # fmt: skip


def test_conv_transpose3d():
    def fn(x, w, b):
        return F.conv_transpose3d(x, w, b, stride=(2, 1, 2), padding=1, output_padding=(1, 0, 0))

    _check(fn, torch.randn(2, 4, 3, 5, 4), torch.randn(4, 3, 3, 2, 3), torch.randn(3), atol=1e-4)


def test_histograms_and_padded_nonzero():
    def fn(x, w):
        h = torch.histc(x, bins=7, min=-1.5, max=2)
        auto = torch.histc(x, bins=5)  # the data's own range
        hist, edges = torch.histogram(x, bins=6, weight=w, density=True)
        plain, _ = torch.histogram(x, bins=4, range=(-1.0, 1.0))
        nz = torch.nonzero_static(torch.where(x > 0.5, x, 0), size=9, fill_value=-7)
        dd = torch.histogramdd(x.reshape(-1, 5)[:, :3], bins=[3, 4, 2], density=True)
        ddr = torch.histogramdd(x.reshape(-1, 5)[:, :2], bins=[5, 3], weight=w.reshape(-1, 5)[:, 0],
                                range=[-1.0, 1.0, -2.0, 0.5])  # fmt: skip
        return h, auto, hist, edges, plain, nz, dd.hist, *dd.bin_edges, ddr.hist

    x = torch.randn(5, 11)
    x[1, 2] = 2.0  # exactly the top edge: counted in the last bin
    _check(fn, x, torch.rand(5, 11), atol=1e-5)


def test_index_put_through_several_index_tensors():
    def fn(x, i, j, v):
        a = torch.index_put(x, (i, j), v, accumulate=True)
        b = x.mT.clone()
        b[:, i.clamp(0, 3), j] = v[:1, :5]  # after a full dim
        return a, b

    x = torch.randn(4, 5, 6)
    i = torch.tensor([0, 3, -1, 0, 2])
    j = torch.tensor([1, 4, 2, 1, -5])
    _check(fn, x, i, j, torch.randn(5, 6))


@pytest.mark.slow
def test_solves_from_cholesky_and_lu_factors():
    def fn(a, b, bt):
        low = torch.linalg.cholesky(a)
        lu, piv = torch.linalg.lu_factor(a)
        return (torch.cholesky_solve(b, low), torch.cholesky_solve(b, low.mT, upper=True),
                torch.cholesky_inverse(low),
                torch.linalg.lu_solve(lu, piv, b, adjoint=True),
                torch.linalg.lu_solve(lu, piv, bt, left=False))  # fmt: skip

    a = torch.randn(2, 5, 5, dtype=torch.float64)
    a = a @ a.mT + torch.eye(5, dtype=torch.float64)
    _check(fn, a, torch.randn(2, 5, 3, dtype=torch.float64),
           torch.randn(2, 3, 5, dtype=torch.float64), atol=1e-8)  # fmt: skip


def test_mode_and_segment_reductions():
    def fn(x, data, lengths, offsets):
        m = torch.mode(x, 1)
        k = torch.mode(x, 0, keepdim=True)
        red = [torch.segment_reduce(data, r, lengths=lengths) for r in ("sum", "max", "mean")]
        red += [torch.segment_reduce(data, r, offsets=offsets, initial=2.0)
                for r in ("min", "prod", "mean")]  # fmt: skip
        return m.values, m.indices, k.values, k.indices, *red

    x = torch.randint(0, 4, (5, 7)).float()
    data = torch.randn(9, 3)
    lengths = torch.tensor([2, 0, 4, 3])
    offsets = torch.tensor([0, 3, 3, 8, 9])
    _check(fn, x, data, lengths, offsets)


def test_embedding_bag_modes():
    def fn(w, idx, off, psw):
        return (F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw),
                F.embedding_bag(idx, w, off, mode="mean", padding_idx=2),
                F.embedding_bag(idx, w, off, mode="max"),
                F.embedding_bag(idx, w, torch.cat([off, off.new_tensor([9])]), mode="mean",
                                include_last_offset=True))  # fmt: skip

    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2])
    _check(fn, torch.randn(10, 3), idx, torch.tensor([0, 2, 2, 5]), torch.rand(9))


def test_as_strided_scatter():
    def fn(x, src, sq):
        a = torch.as_strided_scatter(x, src, (3, 2), (4, 1), 1)
        b = torch.as_strided_scatter(x, sq, (2, 2), (1, 1))  # overlapping: the last one wins
        return a, b

    _check(fn, torch.randn(4, 5), torch.randn(3, 2), torch.randn(2, 2))


@pytest.mark.slow
def test_grid_sample_3d():
    def fn(x, grid):
        return (F.grid_sample(x, grid, "bilinear", "zeros", align_corners=False),
                F.grid_sample(x, grid, "nearest", "border", align_corners=True),
                F.grid_sample(x, grid, "bilinear", "border", align_corners=True))  # fmt: skip

    x = torch.randn(2, 3, 4, 5, 3)
    grid = torch.rand(2, 3, 2, 5, 3) * 2.4 - 1.2  # some positions outside
    _check(fn, x, grid, atol=1e-5)


def test_linear_cross_entropy_chunked():
    lce_options = pytest.importorskip("torch.nn.modules.linear_cross_entropy_options")
    opts = lce_options.LinearCrossEntropyOptions(batch_chunk_size=2)

    def fn(x, w, t, cw):
        kw = dict(options=opts)
        return (F.linear_cross_entropy(x, w, t, **kw),
                F.linear_cross_entropy(x, w, t, weight=cw, ignore_index=1, reduction="sum", **kw),
                F.linear_cross_entropy(x, w, t, weight=cw, **kw),
                F.linear_cross_entropy(x, w, t, reduction="none", ignore_index=3,
                                       **kw))  # fmt: skip

    args = (torch.randn(8, 5), torch.randn(6, 5), torch.tensor([0, 1, 3, 4, 1, 2, 3, 5]),
            torch.rand(6) + 0.5)  # fmt: skip
    with torch.no_grad():  # dynamo breaks the graph at a Python warning the op's wrapper gives
        got = torch.compile(fn, backend=luminal_backend)(*args)
    assert lt.stats.eager_ops == {} and lt.stats.partitions >= 1, lt.stats.fallbacks
    torch.testing.assert_close(got, fn(*args), atol=1e-5, rtol=1e-5)


def test_antialiased_bilinear_resize():
    def fn(x):
        down = F.interpolate(x, size=(4, 7), mode="bilinear", antialias=True)
        up = F.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear", antialias=True)
        return down, up

    _check(fn, torch.randn(2, 3, 11, 9), atol=1e-5)
