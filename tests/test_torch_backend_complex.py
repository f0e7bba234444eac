"""Complex values (held as real pairs) and the FFTs through torch.compile against eager: odd,
even (a Nyquist bin) and length-1 transforms, every normalization, several dims, the Hermitian
transforms' conjugates, complex casts, ``complex`` / ``polar``, a short-time transform. Each
function must run with no ATen op left to eager."""

import pytest

torch = pytest.importorskip("torch")

import luminal.torch_backend as lt  # noqa: E402
from luminal.torch_backend import luminal_backend  # noqa: E402
from optest import check_converts  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


def _check(fn, *args, atol=1e-4, rtol=1e-4):
    check_converts(fn, *args, atol=atol, rtol=rtol)


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_one_dim_transforms(norm):
    def fn(x, h):
        fft = torch.fft
        return (fft.fft(x, norm=norm), fft.ifft(x, n=9, dim=0, norm=norm),
                fft.rfft(x, n=10, norm=norm), fft.irfft(h, n=13, norm=norm),
                fft.irfft(h, norm=norm), fft.hfft(h, n=8, norm=norm),
                fft.ihfft(x, dim=0, norm=norm))  # fmt: skip

    _check(fn, torch.randn(5, 7) * 3, torch.randn(3, 7))


def test_multi_dim_transforms():
    def fn(x):
        fft = torch.fft
        return (fft.fft2(x), fft.ifftn(x, s=(4, 6), dim=(0, 2)), fft.rfft2(x, norm="ortho"),
                fft.irfftn(x, s=(3, 9)), fft.hfft2(x, s=(5, 4)), fft.ihfftn(x, dim=(1, 2)),
                fft.fftn(x[:1, :1, :1]))  # fmt: skip

    _check(fn, torch.randn(3, 5, 7))


def test_complex_values_built_and_cast():
    def fn(x, r, a):
        c = torch.complex(x, r[:1])  # broadcast
        return (x.to(torch.complex64), x.to(torch.complex128), c, torch.polar(r.abs(), a),
                torch.fft.fft(c, dim=1).conj().transpose(0, 1).reshape(-1))  # fmt: skip

    _check(fn, torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5) * 4)
    with torch.no_grad():  # complex32's parts are f16
        x = torch.randn(4, 3)
        got = torch.compile(lambda t: t.chalf(), backend=luminal_backend)(x)
    assert got.dtype == torch.complex32 and not lt.stats.eager_ops
    torch.testing.assert_close(torch.view_as_real(got), torch.view_as_real(x.chalf()))


def test_stft_and_empty():
    def fn(sig, w, e):
        s = torch.stft(sig, 16, hop_length=5, window=w, return_complex=True)
        return s, torch.complex(e, e), torch.fft.rfft(sig[:, :11], norm="forward")

    _check(fn, torch.randn(2, 61), torch.hann_window(16), torch.zeros(0, 3))


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_symbolic_transform_lengths_convert(norm):
    """FNet mixes tokens with an FFT over the sequence: under dynamic shapes the DFT matrices
    of a symbolic length are computed in the graph; one compile serves every length."""

    def fn(x):
        fft = torch.fft
        return (torch.view_as_real(fft.rfft(x, norm=norm)), fft.fftn(x, dim=(-2, -1)).real,
                torch.view_as_real(fft.fft(x, dim=1, norm=norm)))  # fmt: skip

    f = torch.compile(fn, backend=luminal_backend, dynamic=True)
    with torch.no_grad():
        for shape in ((2, 5, 8), (2, 7, 9), (3, 12, 1)):
            x = torch.randn(*shape)
            for a, b in zip(f(x), fn(x), strict=True):
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert not lt.stats.eager_ops and lt.stats.compiles <= 2


def test_transform_longer_than_the_matrix_bound_stays_eager():
    from luminal.torch_backend.convert_complex import MAX_DFT

    x = torch.randn(1, MAX_DFT + 1)
    with torch.no_grad():
        got = torch.compile(torch.fft.rfft, backend=luminal_backend)(x)
    torch.testing.assert_close(got, torch.fft.rfft(x))
    assert "aten._fft_r2c.default" in lt.stats.eager_ops
