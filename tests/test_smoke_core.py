import torch

import luminal as lm
from optest import check_op, rand


def test_add_broadcast_symbolic():
    seq = lm.dim("seq", 1, 4096)
    check_op(
        "add",
        lambda a, b: a.add(b),
        lambda a, b: a + b,
        [rand(7, 5), rand(5)],
        shapes=[(seq, 5), None],
        more=[[rand(1, 5), rand(5)], [rand(300, 5), rand(5)]],
    )


def test_exp2_view():
    check_op("exp2", lambda a: a.permute(1, 0).exp2(), lambda a: torch.exp2(a.T), [rand(3, 50)])
