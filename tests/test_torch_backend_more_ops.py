"""More of PyTorch's op database through torch.compile against eager: linalg error checks,
bilinear forms, pairwise distances, histograms, 3-D transposed convolution and sampling,
segment and bag reductions, pooling gradients. Each function must run with no ATen op left
to eager."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import luminal.torch_backend as lt  # noqa: E402
from luminal.torch_backend import luminal_backend  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


def _check(fn, *args, atol=1e-5, rtol=1e-5):
    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend=luminal_backend, fullgraph=True)(*args)
    assert lt.stats.eager_ops == {}, lt.stats.fallbacks
    assert not lt.stats.failed_plans
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)


def test_linalg_error_check_runs_on_the_plans_info():
    a = torch.randn(5, 5)
    a = a @ a.T + torch.eye(5)
    _check(torch.linalg.cholesky, a, atol=1e-4)
    assert lt.stats.checks == 1  # the check stayed in eager; the factorization did not
    f = torch.compile(torch.linalg.cholesky, backend=luminal_backend)
    with torch.no_grad(), pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        f(-a)
