"""Bad inputs raise at graph-build time, naming the op and the shapes or dtypes."""

import pytest

import luminal as lm
import luminal.functional as F


@pytest.fixture
def g():
    return lm.Graph("errors")


def test_mismatched_shapes(g):
    a, b = g.input("a", (3, 5)), g.input("b", (4, 5))
    for fn, name in [
        (lambda: a + b, "add"),
        (lambda: a * b, "mul"),
        (lambda: F.maximum(a, b), "maximum"),
        (lambda: a < b, "lt"),
        (lambda: F.where(a > 0, a, b), "where"),
    ]:
        with pytest.raises(ValueError, match=rf"{name}.*\(3, 5\).*\(4, 5\)"):
            fn()
    with pytest.raises(ValueError, match=r"cat: shapes \(3, 5\), \(4, 6\)"):
        F.cat([a, g.input("c", (4, 6))])
    with pytest.raises(ValueError, match="stack"):
        F.stack([a, b])
    with pytest.raises(ValueError, match=r"reshape.*\(3, 5\).*\(4, 4\)"):
        a.reshape(4, 4)
    with pytest.raises(ValueError, match="expand"):
        a.expand(3, 6)
    with pytest.raises(ValueError, match="split: sections"):
        a.split([1, 1], 0)
    with pytest.raises(ValueError, match="gather: index"):
        F.gather(a, 0, g.input("i", (3,), lm.i64))


def test_out_of_range_dims_and_indices(g):
    a = g.input("a", (3, 5))
    for fn in [
        lambda: a.sum(2),
        lambda: a.softmax(-3),
        lambda: a.transpose(0, 2),
        lambda: a.cumsum(5),
        lambda: a.argmax(2),
        lambda: a.flip(3),
        lambda: a.unsqueeze(4),
        lambda: F.cat([a, a], 2),
    ]:
        with pytest.raises(
            IndexError, match=r"dim -?\d+ out of range for a tensor of shape \(3, 5\)"
        ):
            fn()
    with pytest.raises(IndexError, match=r"index 3 is out of bounds for dim 0 with size 3"):
        _ = a[3]
    with pytest.raises(IndexError, match="too many indices"):
        a[0, 1, 2]
    with pytest.raises(IndexError, match="narrow"):
        a.narrow(1, 3, 4)
    with pytest.raises(ValueError, match="slice step"):
        a[::-1]


def test_wrong_dtypes(g):
    a, i = g.input("a", (3, 5)), g.input("i", (3, 5), lm.i32)
    with pytest.raises(TypeError, match=r"where: condition must be a bool tensor, got f32\(3, 5\)"):
        F.where(a, a, a)
    with pytest.raises(TypeError, match=r"gather: index must be an integer tensor, got f32"):
        F.gather(a, 0, a)
    with pytest.raises(TypeError, match=r"mean: needs a floating-point input, got i32\(3, 5\)"):
        i.mean()
    with pytest.raises(TypeError, match="masked_fill: mask must be a bool tensor"):
        a.masked_fill(a, 0.0)
    with pytest.raises(TypeError, match="bitwise_and: only bool"):
        i & i
    with pytest.raises(TypeError, match="neg"):
        _ = -(a > 0)
    with pytest.raises(TypeError, match="data-dependent"):
        a[a > 0]
    with pytest.raises(TypeError, match="exp: input must be a luminal Tensor"):
        F.exp(1.0)
    with pytest.raises(ValueError, match="pow: integers to negative integer powers"):
        i**-1
    with pytest.raises(ValueError, match="one_hot: give num_classes"):
        F.one_hot(i)
    with pytest.raises(ValueError, match="clamp: at least one"):
        a.clamp()
    with pytest.raises(ValueError, match="gelu: approximate"):
        F.gelu(a, approximate="fast")
    with pytest.raises(ValueError, match="pad: mode"):
        F.pad(a, (1, 1), mode="wrap")
    with pytest.raises(TypeError, match="arange: the first argument must be the luminal Graph"):
        F.arange(10, 20)


def test_symbolic_needs_static_where_data_shape_depends(g):
    seq = lm.dim("seq", 1, 64)
    x = g.input("x", (seq, 4))
    with pytest.raises(ValueError, match="symbolic"):
        x.unbind(0)
    with pytest.raises(ValueError, match="symbolic"):
        x.chunk(2, 0)
    with pytest.raises(TypeError, match="len"):
        len(x)
