import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
from luminal.functional import nn as F
from optest import check_op, rand

seq = lm.dim("seq", 1, 4096)
SEQS = [[rand(1, 50)], [rand(300, 50)]]


def test_layer_norm():
    w, b = rand(50), rand(50)
    check_op(
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (50,), w, b),
        lambda x, w, b: TF.layer_norm(x, (50,), w, b),
        [rand(2, 3, 50), w, b],
    )
    check_op(
        "layer_norm",
        lambda x: F.layer_norm(x, (3, 783)),
        lambda x: TF.layer_norm(x, (3, 783)),
        [rand(2, 3, 783)],
        atol=1e-4,
    )
    check_op(
        "layer_norm",
        lambda x: F.layer_norm(x, 50, eps=1e-6),
        lambda x: TF.layer_norm(x, (50,), eps=1e-6),
        [rand(7, 50)],
        shapes=[(seq, 50)],
        more=SEQS,
    )
    # non-contiguous input, size-1 normalized dim
    check_op(
        "layer_norm",
        lambda x: F.layer_norm(x.permute(1, 0), 3),
        lambda x: TF.layer_norm(x.T, (3,)),
        [rand(3, 5)],
    )
    check_op(
        "layer_norm", lambda x: F.layer_norm(x, 1), lambda x: TF.layer_norm(x, (1,)), [rand(4, 1)]
    )


def test_layer_norm_symbolic_normalized_dim():
    check_op(
        "layer_norm",
        lambda x: F.layer_norm(x, (seq,)),
        lambda x: TF.layer_norm(x, (x.shape[-1],)),
        [rand(3, 7)],
        shapes=[(3, seq)],
        more=[[rand(3, 300)]],
        atol=1e-4,
    )


def test_layer_norm_f16():
    check_op(
        "layer_norm",
        lambda x: F.layer_norm(x, 50),
        lambda x: TF.layer_norm(x.float(), (50,)).half(),
        [rand(3, 50, dtype=np.float16)],
        atol=2e-3,
        rtol=2e-3,
    )


def test_rms_norm():
    w = rand(50)
    check_op(
        "rms_norm",
        lambda x, w: F.rms_norm(x, 50, w, 1e-6),
        lambda x, w: TF.rms_norm(x, (50,), w, 1e-6),
        [rand(7, 50), w],
        shapes=[(seq, 50), None],
        more=[[rand(1, 50), w], [rand(300, 50), w]],
    )
    check_op(
        "rms_norm",
        lambda x: F.rms_norm(x, (3, 5)),
        lambda x: TF.rms_norm(x, (3, 5)),
        [rand(2, 3, 5)],
    )


def test_group_instance_batch_norm():
    x, w, b = rand(2, 6, 5, 3), rand(6), rand(6)
    check_op(
        "group_norm",
        lambda x, w, b: F.group_norm(x, 3, w, b),
        lambda x, w, b: TF.group_norm(x, 3, w, b),
        [x, w, b],
    )
    check_op(
        "group_norm", lambda x: F.group_norm(x, 1), lambda x: TF.group_norm(x, 1), [rand(3, 4, 7)]
    )
    check_op(
        "instance_norm",
        lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
        lambda x, w, b: TF.instance_norm(x, weight=w, bias=b),
        [x, w, b],
    )
    rm, rv = rand(6), rand(6, low=0.5, high=2.0)
    check_op(
        "batch_norm",
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, eps=1e-3),
        lambda x, m, v, w, b: TF.batch_norm(x, m, v, w, b, eps=1e-3),
        [x, rm, rv, w, b],
    )
    check_op(
        "batch_norm",
        lambda x, m, v: F.batch_norm(x, m, v),
        lambda x, m, v: TF.batch_norm(x, m, v),
        [rand(4, 6), rm, rv],
    )
    check_op(
        "batch_norm",
        lambda x: F.batch_norm(x, None, None, training=True),
        lambda x: TF.batch_norm(x, None, None, training=True),
        [x],
    )


def test_normalize_cosine():
    check_op("normalize", F.normalize, TF.normalize, [rand(3, 50, 2)])
    check_op(
        "normalize",
        lambda x: F.normalize(x, p=1, dim=-1),
        lambda x: TF.normalize(x, p=1, dim=-1),
        [rand(4, 783)],
    )
    check_op(
        "normalize",
        lambda x: F.normalize(x, p=3.0, dim=0),
        lambda x: TF.normalize(x, p=3.0, dim=0),
        [rand(5, 4)],
    )
    check_op(
        "normalize",
        lambda x: F.normalize(x, p=float("inf")),
        lambda x: TF.normalize(x, p=float("inf")),
        [rand(5, 4)],
    )
    check_op(
        "normalize", F.normalize, TF.normalize, [np.zeros((2, 3), np.float32)]
    )  # eps guards 0/0
    check_op(
        "cosine_similarity", F.cosine_similarity, TF.cosine_similarity, [rand(3, 50), rand(1, 50)]
    )
    check_op(
        "cosine_similarity",
        lambda a, b: F.cosine_similarity(a, b, dim=-1),
        lambda a, b: TF.cosine_similarity(a, b, dim=-1),
        [rand(7, 16), rand(16)],
        shapes=[(seq, 16), None],
        more=[[rand(300, 16), rand(16)]],
    )


def test_dropout():
    check_op(
        "dropout",
        lambda x: F.dropout(x, 0.3),
        lambda x: TF.dropout(x, 0.3, training=False),
        [rand(3, 4)],
    )
    g = lm.Graph()
    with pytest.raises(ValueError, match="dropout: training-mode"):
        F.dropout(g.input("x", (3,)), 0.5, training=True)


def test_bad_inputs():
    g = lm.Graph()
    x = g.input("x", (3, 5))
    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape \(4\) .* \(3, 5\)"):
        F.layer_norm(x, 4)
    with pytest.raises(ValueError, match=r"layer_norm: weight shape \(4\)"):
        F.layer_norm(x, 5, g.input("w", (4,)))
    with pytest.raises(ValueError, match="group_norm: 5 channels"):
        F.group_norm(g.input("y", (2, 5, 3)), 2)
    with pytest.raises(ValueError, match="batch_norm: running_mean shape"):
        F.batch_norm(x, g.input("m", (4,)), g.input("v", (4,)))
    with pytest.raises(TypeError, match="layer_norm: expected a floating-point"):
        F.layer_norm(g.input("i", (3, 5), lm.i32), 5)


@pytest.mark.parametrize("p", [2.0, 1.0])
def test_normalize_symbolic(p):
    check_op(
        "normalize",
        lambda x: F.normalize(x, p=p, dim=0),
        lambda x: TF.normalize(x, p=p, dim=0),
        [rand(7, 3)],
        shapes=[(seq, 3)],
        more=[[rand(1, 3)], [rand(300, 3)]],
    )
    assert torch is not None
