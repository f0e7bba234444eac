"""Nearest-neighbour resizing through torch.compile (``torch_backend/resize.py``): kept whole
as ``luminal::interpolate_nearest``, its source indices those of PyTorch's CPU kernel, so
results equal eager exactly, with static and dynamic shapes, by sizes and by scales (integer,
fractional, below 1, recomputed), in 1-3 spatial dims."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as TF  # noqa: E402

import luminal.torch_backend as lt  # noqa: E402
from luminal.torch_backend import luminal_backend  # noqa: E402

CASES = {
    "x2": (lambda x: TF.interpolate(x, scale_factor=2.0, mode="nearest"), (2, 3, 5, 7)),
    "x3": (lambda x: TF.interpolate(x, scale_factor=3), (2, 3, 5, 7)),
    "size": (lambda x: TF.interpolate(x, size=(11, 4), mode="nearest"), (2, 3, 5, 7)),
    "size_1d": (lambda x: TF.interpolate(x, size=9), (2, 3, 5)),
    "fraction": (lambda x: TF.interpolate(x, scale_factor=1.7), (1, 2, 6, 9)),
    "recomputed": (
        lambda x: TF.interpolate(x, scale_factor=1.7, recompute_scale_factor=True),
        (1, 2, 6, 9),
    ),  # fmt: skip
    "x2_1d": (lambda x: TF.interpolate(x, scale_factor=2), (2, 3, 9)),
    "3d": (lambda x: TF.interpolate(x, scale_factor=(2, 3, 2)), (1, 2, 3, 4, 5)),
    "down": (lambda x: TF.interpolate(x, scale_factor=0.5), (1, 2, 8, 6)),
    "module": (lambda x: torch.nn.Upsample(scale_factor=2)(x) * 2, (2, 4, 5, 5)),
}


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    yield


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_nearest_resizing_equals_eager(name, dynamic):
    fn, shape = CASES[name]
    f = torch.compile(fn, backend=luminal_backend, dynamic=dynamic)
    with torch.no_grad():
        for extra in (0, 3, 4):  # new widths: a new compile (static) or the same plan
            x = torch.randn(*shape[:-1], shape[-1] + extra)
            got, want = f(x), fn(x)
            assert got.shape == want.shape
            assert torch.equal(got, want), (name, extra)
    assert not lt.stats.eager_ops and not lt.stats.failed_plans


def test_the_call_is_kept_whole(monkeypatch):
    """The ATen graph holds the luminal op, not PyTorch's decomposition (source indices
    computed in float from the sizes, then a gather by them)."""
    seen: list[str] = []
    orig = lt._compile_aten

    def spy(gm, example_inputs, **kw):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return orig(gm, example_inputs, **kw)

    monkeypatch.setattr(lt, "_compile_aten", spy)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1)
    fn = lambda x: conv(TF.interpolate(x, scale_factor=2))  # noqa: E731
    f = torch.compile(fn, backend=luminal_backend, dynamic=True)
    with torch.no_grad():
        x = torch.randn(2, 4, 5, 6)
        torch.testing.assert_close(f(x), fn(x), atol=1e-5, rtol=1e-5)
    assert "luminal.interpolate_nearest.default" in seen
    assert not {"aten.index.Tensor", "aten._unsafe_index.Tensor", "aten.arange.start_step"} & set(
        seen
    )
    assert not lt.stats.eager_ops and not lt.stats.failed_plans


def test_training_graphs_keep_the_decomposition():
    """With gradients the call stays PyTorch's (the luminal op has no derivative)."""
    x = torch.randn(1, 2, 3, 4, requires_grad=True)
    f = torch.compile(lambda t: TF.interpolate(t, scale_factor=2).sum(), backend=luminal_backend)
    f(x).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 4.0))
