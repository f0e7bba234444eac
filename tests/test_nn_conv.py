import numpy as np
import pytest
import torch.nn.functional as TF

import luminal as lm
from luminal.functional import conv as C
from optest import check_op, rand

seq = lm.dim("seq", 1, 4096)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2},
        {"padding": 1},
        {"padding": "same", "dilation": 2},
        {"padding": "valid"},
        {"stride": 3, "padding": 2, "dilation": 2},
        {"groups": 3},
        {"groups": 6, "padding": "same"},  # depthwise
    ],
)
@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_conv1d(kw):
    g = kw.get("groups", 1)
    check_op(
        "conv1d",
        lambda x, w, b: C.conv1d(x, w, b, **kw),
        lambda x, w, b: TF.conv1d(x, w, b, **kw),
        [rand(2, 6, 50), rand(12, 6 // g, 4), rand(12)],
        atol=1e-4,
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": (2, 1), "padding": (1, 2)},
        {"padding": "same"},
        {"padding": "same", "dilation": (1, 2)},
        {"stride": 2, "dilation": 2, "padding": 1},
        {"groups": 2, "stride": 2},
    ],
)
def test_conv2d(kw):
    g = kw.get("groups", 1)
    check_op(
        "conv2d",
        lambda x, w, b: C.conv2d(x, w, b, **kw),
        lambda x, w, b: TF.conv2d(x, w, b, **kw),
        [rand(2, 4, 11, 9), rand(6, 4 // g, 3, 2), rand(6)],
        atol=1e-4,
    )


def test_conv_unbatched_noncontiguous_1x1():
    check_op(
        "conv2d",
        lambda x, w: C.conv2d(x.permute(0, 2, 1), w),
        lambda x, w: TF.conv2d(x.permute(0, 2, 1), w),
        [rand(3, 7, 5), rand(4, 3, 1, 1)],
    )
    check_op(
        "conv3d",
        lambda x, w: C.conv3d(x, w, padding=1),
        lambda x, w: TF.conv3d(x, w, padding=1),
        [rand(1, 2, 4, 5, 3), rand(3, 2, 3, 3, 3)],
        atol=1e-4,
    )


def test_conv1d_symbolic_length():
    w, b = rand(4, 3, 3), rand(4)
    check_op(
        "conv1d",
        lambda x, w, b: C.conv1d(x, w, b, stride=2, padding=1),
        lambda x, w, b: TF.conv1d(x, w, b, stride=2, padding=1),
        [rand(2, 3, 7), w, b],
        shapes=[(2, 3, seq), None, None],
        more=[[rand(2, 3, 1), w, b], [rand(2, 3, 300), w, b]],
        atol=1e-4,
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2},
        {"stride": 2, "padding": 1, "output_padding": 1},
        {"groups": 2, "dilation": 2},
        {"stride": 3, "padding": 4},
    ],
)
def test_conv_transpose(kw):
    g = kw.get("groups", 1)
    check_op(
        "conv_transpose1d",
        lambda x, w, b: C.conv_transpose1d(x, w, b, **kw),
        lambda x, w, b: TF.conv_transpose1d(x, w, b, **kw),
        [rand(2, 4, 9), rand(4, 6 // g, 3), rand(6)],
        atol=1e-4,
    )
    check_op(
        "conv_transpose2d",
        lambda x, w: C.conv_transpose2d(x, w, **kw),
        lambda x, w: TF.conv_transpose2d(x, w, **kw),
        [rand(1, 4, 5, 6), rand(4, 2 // g, 3, 2)],
        atol=1e-4,
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": (3, 2), "stride": (2, 3), "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": 2, "dilation": 2},
    ],
)
def test_max_pool2d(kw):
    # all-negative inputs check that padding never wins the max
    check_op(
        "max_pool2d",
        lambda x: C.max_pool2d(x, **kw),
        lambda x: TF.max_pool2d(x, **kw),
        [rand(2, 3, 11, 8, low=-3, high=-1)],
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {
            "kernel_size": 3,
            "stride": 2,
            "padding": 1,
            "ceil_mode": True,
            "count_include_pad": False,
        },
        {"kernel_size": (2, 3), "divisor_override": 5},
        # a kernel larger than the input makes one window in ceil mode (EfficientNet's pool)
        {"kernel_size": 12, "ceil_mode": True},
        {"kernel_size": (12, 9), "stride": (3, 5), "ceil_mode": True},
    ],
)
def test_avg_pool2d(kw):
    check_op(
        "avg_pool2d",
        lambda x: C.avg_pool2d(x, **kw),
        lambda x: TF.avg_pool2d(x, **kw),
        [rand(2, 3, 10, 7)],
    )


def test_pool1d_and_symbolic():
    check_op(
        "max_pool1d",
        lambda x: C.max_pool1d(x, 3, 2, 1),
        lambda x: TF.max_pool1d(x, 3, 2, 1),
        [rand(2, 50)],
        shapes=[(2, seq)],
        more=[[rand(2, 1)], [rand(2, 300)]],
    )
    check_op(
        "avg_pool1d",
        lambda x: C.avg_pool1d(x, 4, 3, 2, ceil_mode=True),
        lambda x: TF.avg_pool1d(x, 4, 3, 2, ceil_mode=True),
        [rand(2, 3, 50)],
        shapes=[(2, 3, seq)],
        more=[[rand(2, 3, 5)], [rand(2, 3, 300)]],
    )


@pytest.mark.parametrize("size", [1, 3, (5, 2), (7, None), (9, 11)])
def test_adaptive_pool(size):
    check_op(
        "adaptive_avg_pool2d",
        lambda x: C.adaptive_avg_pool2d(x, size),
        lambda x: TF.adaptive_avg_pool2d(x, size),
        [rand(2, 3, 7, 10)],
    )
    check_op(
        "adaptive_max_pool2d",
        lambda x: C.adaptive_max_pool2d(x, size),
        lambda x: TF.adaptive_max_pool2d(x, size),
        [rand(3, 7, 10, low=-3, high=-1)],
    )


def test_adaptive_pool_symbolic():
    check_op(
        "adaptive_avg_pool1d",
        lambda x: C.adaptive_avg_pool1d(x, 4),
        lambda x: TF.adaptive_avg_pool1d(x, 4),
        [rand(2, 3, 50)],
        shapes=[(2, 3, seq)],
        more=[[rand(2, 3, 1)], [rand(2, 3, 7)], [rand(2, 3, 300)]],
    )


def test_bad_conv():
    g = lm.Graph()
    x = g.input("x", (2, 6, 10))
    with pytest.raises(
        ValueError, match=r"conv1d: input \(2, 6, 10\) with 6 channels, weight \(4, 4, 3\)"
    ):
        C.conv1d(x, g.input("w", (4, 4, 3)), groups=2)
    with pytest.raises(ValueError, match="conv1d: input .* groups=4"):
        C.conv1d(x, g.input("w2", (4, 3, 3)), groups=4)
    with pytest.raises(ValueError, match="conv2d: expected a 3-D or 4-D input"):
        C.conv2d(x.unsqueeze(0).unsqueeze(0), g.input("w3", (4, 6, 3, 3)))
    with pytest.raises(ValueError, match="padding='same' needs stride 1"):
        C.conv1d(x, g.input("w4", (4, 6, 3)), stride=2, padding="same")
    with pytest.raises(ValueError, match="smaller than the"):
        C.conv1d(x, g.input("w5", (4, 6, 11)))
    with pytest.raises(ValueError, match="bias shape"):
        C.conv1d(x, g.input("w6", (4, 6, 3)), g.input("b6", (5,)))
    assert np.isfinite(0.0)
