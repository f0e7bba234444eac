"""Training through plans (``luminal.train``, ``luminal.optim``): optimizer steps against
torch.optim, the example's transformer LM against PyTorch for 20 steps (compiled, in-place
parameters), and safetensors save / reload."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import luminal as lm
from luminal import nn, optim, train

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import train_lm  # noqa: E402


def _mlp_pair() -> tuple[torch.nn.Module, nn.Module]:
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(5, 11), torch.nn.Tanh(), torch.nn.Linear(11, 3))
    m = nn.Sequential(nn.Linear(5, 11), nn.Tanh(), nn.Linear(11, 3))
    m.load_state_dict({k: v.detach().numpy().copy() for k, v in tm.state_dict().items()})
    return tm, m


OPTS = [
    ("sgd", lambda: optim.SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd_momentum", lambda: optim.SGD(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("nesterov", lambda: optim.SGD(lr=0.05, momentum=0.8, nesterov=True),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True)),
    ("adam", lambda: optim.Adam(lr=0.01, betas=(0.8, 0.99), weight_decay=0.01),
     lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.01)),
    ("adamw", lambda: optim.AdamW(lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
]  # fmt: skip


@pytest.mark.parametrize("name,mk,tmk", OPTS, ids=[o[0] for o in OPTS])
def test_optimizer_steps_match_torch(name, mk, tmk) -> None:
    tm, m = _mlp_pair()
    step = train.TrainStep(m, lambda mod, x, y: train.cross_entropy(mod(x), y), mk(),
                           {"x": ((7, 5), lm.f32), "y": ((7,), lm.i32)}, compile=False)  # fmt: skip
    topt = tmk(tm.parameters())
    rng = np.random.default_rng(1)
    for _ in range(6):
        x = rng.standard_normal((7, 5)).astype(np.float32)
        y = rng.integers(0, 3, 7).astype(np.int32)
        loss = step(x=x, y=y)
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y).long())
        tl.backward()
        topt.step()
        assert abs(loss - tl.item()) <= 1e-5 * abs(tl.item())
    for k, v in tm.state_dict().items():
        np.testing.assert_allclose(m.state_dict()[k], v.numpy(), rtol=1e-5, atol=1e-6)


def test_tiny_lm_matches_pytorch_for_20_steps(tmp_path) -> None:
    """The example's model, compiled (one plan: forward + backward + AdamW, parameters
    updated in place), against PyTorch from the same init and data."""
    data, chars = train_lm.load_text()
    vocab, ctx, batch = len(chars), 9, 3
    torch.manual_seed(0)
    ref = train_lm.torch_reference(vocab, ctx, dim=16, heads=2, layers=1)
    model = train_lm.TinyLM(vocab, ctx, dim=16, heads=2, layers=1)
    model.load_state_dict({k: v.detach().numpy().copy() for k, v in ref.state_dict().items()})
    step = train_lm.make_step(model, optim.AdamW(lr=3e-3), batch, search=False)
    assert step.compiled is not None and len(step.graph.state) == 3 * len(step.params)
    topt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    weight = step.params["head.weight"].data
    losses = []
    for _, (x, y) in zip(range(20), train_lm.batches(data, batch, ctx)):
        loss = step(x=x, y=y)
        topt.zero_grad()
        tl = ref(torch.from_numpy(x).long(), torch.from_numpy(y).long())
        tl.backward()
        topt.step()
        assert abs(loss - tl.item()) <= 1e-3 * abs(tl.item()), (len(losses), loss, tl.item())
        losses.append(loss)
    assert step.params["head.weight"].data is weight  # the plan wrote the model's own array
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    # save / reload: a fresh model computes the same logits
    path = tmp_path / "tiny.safetensors"
    train.save_weights(model, path)
    fresh = train_lm.TinyLM(vocab, ctx, dim=16, heads=2, layers=1)
    train.load_weights(fresh, path)
    x = data[None, :ctx]
    outs = []
    for mod in (model, fresh):
        g = lm.Graph("infer")
        g.output("logits", mod(g.input("x", (1, ctx), lm.i32)))
        outs.append(g.run({"x": x})["logits"])
    np.testing.assert_array_equal(outs[0], outs[1])


def test_train_step_errors() -> None:
    _, m = _mlp_pair()
    with pytest.raises(ValueError, match="scalar"):
        train.TrainStep(m, lambda mod, x: mod(x), optim.SGD(lr=0.1),
                        {"x": ((2, 5), lm.f32)}, compile=False)  # fmt: skip
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(nesterov=True)
    g = lm.Graph("ce")
    with pytest.raises(TypeError, match="class indices"):
        train.cross_entropy(g.input("a", (2, 3)), g.input("b", (2,)))


def test_one_compiled_step_serves_every_batch_size() -> None:
    tm, m = _mlp_pair()
    batch = lm.dim("batch", 1, 64)
    step = train.TrainStep(m, lambda mod, x, y: train.cross_entropy(mod(x), y),
                           optim.Adam(lr=0.01),
                           {"x": ((batch, 5), lm.f32), "y": ((batch,), lm.i32)},
                           search=False)  # fmt: skip
    topt = torch.optim.Adam(tm.parameters(), lr=0.01)
    rng = np.random.default_rng(2)
    for n in (3, 8, 1):
        x = rng.standard_normal((n, 5)).astype(np.float32)
        y = rng.integers(0, 3, n).astype(np.int32)
        loss = step(x=x, y=y)
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y).long())
        tl.backward()
        topt.step()
        assert abs(loss - tl.item()) <= 1e-5 * abs(tl.item())
