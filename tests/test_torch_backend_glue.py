"""The per-call path of a compiled partition: tensors in and out without copies, weights
checked for replacement and in-place change, inputs of every layout and dtype."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import luminal.torch_backend as lt  # noqa: E402
from luminal.torch_backend import luminal_backend  # noqa: E402
from luminal.torch_backend.partition import LuminalPartition  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    lt.reset_stats()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 5)).eval()


def _partitions_seen(f, *args):
    """Call ``f`` and return the LuminalPartitions it ran (each with its prepared call)."""
    seen = []
    call = LuminalPartition.__call__

    def spy(self, *a):
        seen.append(self)
        return call(self, *a)

    LuminalPartition.__call__ = spy
    try:
        f(*args)
    finally:
        LuminalPartition.__call__ = call
    return seen


def test_fast_path_shares_memory_and_outputs_are_fresh():
    m = _net()
    f = torch.compile(m, backend=luminal_backend, dynamic=True)
    with torch.no_grad():
        x = torch.randn(3, 7)
        a = f(x)
        parts = _partitions_seen(f, x)
        assert parts and all(p.call is not None for p in parts)
        b = f(x)
        assert a.data_ptr() != b.data_ptr()  # each call owns new output memory
        a.zero_()
        torch.testing.assert_close(b, m(x), atol=1e-5, rtol=1e-4)
        for n in (2, 4, 9):  # other sizes: the shapes table grows, nothing recompiles
            x = torch.randn(n, 7)
            torch.testing.assert_close(f(x), m(x), atol=1e-5, rtol=1e-4)
    assert lt.stats.plans == 1


def test_weights_replaced_or_changed_recompile():
    m = _net()
    f = torch.compile(m, backend=luminal_backend, dynamic=True)
    x = torch.randn(4, 7)
    with torch.no_grad():
        f(x)
        m[0].weight.data = torch.randn(13, 7)  # new memory, same object, version unchanged
        torch.testing.assert_close(f(x), m(x), atol=1e-5, rtol=1e-4)
        m[2].bias = nn.Parameter(torch.randn(5))  # a new object
        torch.testing.assert_close(f(x), m(x), atol=1e-5, rtol=1e-4)
        m[2].weight.add_(1.0)  # in place: the version counter moves
        torch.testing.assert_close(f(x), m(x), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(f(x), m(x), atol=1e-5, rtol=1e-4)  # unchanged: no rebuild
    assert lt.stats.plans == 4


def test_inputs_of_any_layout_and_grad_flag():
    m = _net()
    f = torch.compile(m, backend=luminal_backend, dynamic=True)
    with torch.no_grad():
        f(torch.randn(5, 7))
        t = torch.randn(7, 6).t()  # a transposed view: copied to row-major on the way in
        torch.testing.assert_close(f(t), m(t), atol=1e-5, rtol=1e-4)
        s = torch.randn(12, 7)[::2]  # a strided slice
        torch.testing.assert_close(f(s), m(s), atol=1e-5, rtol=1e-4)
        g = torch.randn(5, 7, requires_grad=True)  # no_grad: runs in luminal all the same
        torch.testing.assert_close(f(g), m(g), atol=1e-5, rtol=1e-4)
    assert not lt.stats.fallbacks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_and_outputs(dtype):
    class Half(nn.Module):
        def forward(self, x, y):
            return (x * y + 1).relu(), x.float().sum(-1)

    f = torch.compile(Half(), backend=luminal_backend, dynamic=True)
    with torch.no_grad():
        for n in (3, 11):
            x, y = torch.randn(n, 9).to(dtype), torch.randn(n, 9).to(dtype)
            (a, s), (ea, es) = f(x, y), Half()(x, y)
            assert a.dtype == dtype and s.dtype == torch.float32
            torch.testing.assert_close(a, ea, atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(s, es, atol=2e-2, rtol=2e-2)
    assert not lt.stats.fallbacks and lt.stats.plans == 1


class _Cache(nn.Module):
    """A buffer written at positions along dim 1 (as a StaticCache is), read before and after
    the write, and a 0-d counter: the writes must persist in the module's own tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 9, 4))
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x, pos):
        before = self.cache.sum(1, keepdim=True)
        self.cache.index_copy_(1, pos, x)
        self.count += 1
        return self.cache * 2 + before + self.count


def test_input_writes_persist_in_place():
    m, ref = _Cache(), _Cache()
    f = torch.compile(m, backend=luminal_backend, dynamic=True)
    ptr = m.cache.data_ptr()
    with torch.no_grad():
        for pos in ([0, 3], [5], [1, 7, 8], [3]):
            p = torch.tensor(pos)
            x = torch.randn(2, len(pos), 4)
            torch.testing.assert_close(f(x, p), ref(x, p), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(m.cache, ref.cache)
            torch.testing.assert_close(m.count, ref.count)
    assert m.cache.data_ptr() == ptr
    assert lt.stats.in_place >= 1 and not lt.stats.fallbacks and not lt.stats.eager_ops


def test_prepared_call_checks_input_sizes_for_new_dims():
    """The native run reads memory by address: a tensor smaller than the plan's input for
    these dims is refused (checked when a dim value is first seen), not read past its end."""
    m = _net()
    f = torch.compile(m, backend=luminal_backend, dynamic=True)
    seen = []
    call = LuminalPartition.__call__

    def spy(self, *a):
        seen.append((self, a))
        return call(self, *a)

    with torch.no_grad():
        f(torch.randn(4, 7))
        LuminalPartition.__call__ = spy
        try:
            f(torch.randn(6, 7))
        finally:
            LuminalPartition.__call__ = call
        part, args = next((p, a) for p, a in seen if p.call is not None)
        k = part.built.inputs[0][0]
        small = list(args)
        small[k] = torch.randn(2, 7)  # the dims say 6 rows
        part.call.shapes.clear()
        with pytest.raises(ValueError, match="the plan reads 42 elements"):
            part.call.run(small, part.env.dims)
        torch.testing.assert_close(part.call.run(args, part.env.dims)[0], m(args[k]),
                                   atol=1e-5, rtol=1e-4)  # fmt: skip
