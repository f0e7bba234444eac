"""One graph with a symbolic sequence length, built once, runs for seq = 1, 7 and 300: an
attention-like block made only of this package's ops, checked against PyTorch."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.functional as F
from optest import check_op, rand


def _block_lm(x, w):
    q = (x.unsqueeze(1) * w.T.unsqueeze(0)).sum(-1)  # (seq, d) @ (d, d) by broadcasting
    s = (q.unsqueeze(1) * x.unsqueeze(0)).sum(-1) / 4.0  # (seq, seq) scores
    n = x.shape[0]
    causal = F.arange(x.graph, n).unsqueeze(1) >= F.arange(x.graph, n).unsqueeze(0)
    p = F.softmax(s.masked_fill(~causal, float("-inf")), -1)
    y = (p.unsqueeze(-1) * x.unsqueeze(0)).sum(1)
    h = F.layer_norm(y, (y.shape[-1],))
    out = F.gelu(h) + x.cumsum(0) / (F.arange(x.graph, n).float() + 1).unsqueeze(1)
    return out, out.mean(0), F.argmax(s, -1), F.logsumexp(s.tril(), 0), out[:, 1:].amax(0)


def _block_torch(x, w):
    q = x @ w
    s = q @ x.T / 4.0
    n = x.shape[0]
    causal = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
    y = p @ x
    h = TF.layer_norm(y, (y.shape[-1],))
    out = TF.gelu(h) + x.cumsum(0) / (torch.arange(n).float() + 1)[:, None]
    return out, out.mean(0), s.argmax(-1), s.tril().logsumexp(0), out[:, 1:].amax(0)


def test_symbolic_seq_graph_runs_for_1_7_300():
    seq = lm.dim("seq", 1, 512)
    w = rand(16, 16, low=-0.3, high=0.3)
    g = check_op(
        "symbolic_block",
        _block_lm,
        _block_torch,
        [rand(7, 16), w],
        shapes=[(seq, 16), None],
        more=[[rand(1, 16), w], [rand(300, 16), w]],
        atol=1e-4,
        rtol=1e-4,
    )
    assert set(g.dims()) == {"seq"}
    # the graph holds no size-specific nodes: one build served all three bindings
    assert all(np.all([isinstance(s, (int, lm.Expr)) for s in n.shape]) for n in g.nodes)
