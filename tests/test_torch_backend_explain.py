"""luminal.torch_backend.explain: graph breaks, partitions, eager ops and the reasons."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from luminal.torch_backend import explain  # noqa: E402


@pytest.fixture(autouse=True)
def _no_search(monkeypatch):
    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")
    yield
    torch._dynamo.reset()


class WithHermite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x).relu()
        if h.sum() > 0:  # data-dependent Python branch: a dynamo graph break
            h = h * 2
        return self.b(torch.special.hermite_polynomial_h(h, h))


def test_explain_names_breaks_partitions_and_eager_ops():
    e = explain(WithHermite().eval(), torch.randn(3, 8))
    assert e.graphs == 2 and len(e.graph_breaks) == 1
    assert e.eager_ops == {"aten.special_hermite_polynomial_h.default": 1}
    why = "aten.special_hermite_polynomial_h.default is not supported"
    assert any(why in r for r in e.fallbacks)
    assert len(e.partitions) >= 2 and all(n > 0 for n in e.partitions)
    assert not e.fully_in_luminal
    text = str(e)
    assert "graph break" in text and "aten.special_hermite_polynomial_h.default: 1" in text


def test_explain_fully_in_luminal():
    e = explain(nn.Sequential(nn.Linear(4, 5), nn.GELU()).eval(), torch.randn(3, 4))
    assert e.fully_in_luminal and e.eager_ops == {} and e.plans == 1
    assert "everything ran in luminal" in str(e)
