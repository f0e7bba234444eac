"""Sizes dynamo's guards hold to multiples (a window partition padded up to its window, a patch
merge over an even grid): the plan writes such a size as a multiple of a dim of its own, so the
padded and windowed shapes divide out and the whole model stays one luminal partition."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import luminal.torch_backend as lt  # noqa: E402
from luminal.torch_backend import luminal_backend  # noqa: E402
from luminal.torch_backend.partition import Env  # noqa: E402
from luminal.torch_backend.symbols import guard_multiples  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Windows(nn.Module):
    """Swin's window attention skeleton: pad (b, h, w, c) up to whole windows, attend within
    each window, undo the partition, crop, then merge 2x2 patches (which needs h, w even)."""

    def __init__(self, ws: int = 3, c: int = 5) -> None:
        super().__init__()
        self.ws = ws
        self.qkv = nn.Linear(c, 3 * c)
        self.merge = nn.Linear(4 * c, 7)

    def forward(self, x):
        b, h, w, c = x.shape
        ws = self.ws
        x = F.pad(x, (0, 0, 0, (ws - w % ws) % ws, 0, (ws - h % ws) % ws))
        hp, wp = x.shape[1], x.shape[2]
        win = x.view(b, hp // ws, ws, wp // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        win = win.reshape(-1, ws * ws, c)
        q, k, v = self.qkv(win).chunk(3, -1)
        y = F.scaled_dot_product_attention(q, k, v)
        y = y.view(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        y = y.reshape(b, hp, wp, c)[:, :h, :w, :]
        if h % 2 or w % 2:
            y = F.pad(y, (0, 0, 0, w % 2, 0, h % 2))
        parts = [y[:, 0::2, 0::2], y[:, 1::2, 0::2], y[:, 0::2, 1::2], y[:, 1::2, 1::2]]
        return self.merge(torch.cat(parts, -1))


@pytest.mark.parametrize("sizes", [((2, 12, 18), (3, 6, 24)), ((2, 4, 10), (3, 8, 14))])
def test_window_partition_one_plan(sizes):
    model = Windows().eval()
    f = torch.compile(model, backend=luminal_backend, dynamic=True)
    with torch.no_grad():
        for b, h, w in sizes:
            x = torch.randn(b, h, w, 5)
            torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
    assert lt.stats.eager_ops == {} and lt.stats.fallbacks == []
    assert lt.stats.partitions == 1 and lt.stats.compiles == 1


def test_guard_multiples_reads_one_symbol_guards():
    import sympy
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.utils._sympy.functions import FloorDiv, Mod

    env = ShapeEnv()
    s, t = sympy.symbols("s0 s1", integer=True, positive=True)
    hints = getattr(env, "backed_var_to_val", None)
    hints = env.var_to_val if hints is None else hints
    hints[s], hints[t] = sympy.Integer(48), sympy.Integer(10)

    class G:
        def __init__(self, expr):
            self.expr = expr

    env.guards = [G(sympy.Eq(Mod(s, 4), 0)), G(sympy.Le(Mod(4 - Mod(FloorDiv(s, 4), 4), 4), 0)),
                  G(sympy.Ne(Mod(t, 2), 1)), G(sympy.Eq(Mod(s + t, 2), 0))]  # fmt: skip
    # s % 4 == 0 and (s // 4) % 4 == 0: s a multiple of 16; t even; s + t spans two symbols
    assert guard_multiples(env) == {"s0": 16, "s1": 2}


def test_env_refuses_a_size_the_guards_excluded():
    env = Env({"s0": (0, 1)}, {"s0": 4})
    env.bind([torch.zeros(2, 8)])
    assert env.dims == {"s0": 8, "s0_div4": 2}
    with pytest.raises(ValueError, match="not a multiple of 4"):
        env.bind([torch.zeros(2, 6)])
