"""torch.compile training through AOTAutograd with luminal compiling forward and backward
(``luminal.torch_backend.aot``): gradients match eager PyTorch, nothing falls back to eager,
and the profiler sees no matmul / conv / softmax / attention ATen kernel during backward."""

from __future__ import annotations

import warnings

import pytest
import torch

import luminal.torch_backend as tb
from luminal.torch_backend import aot

HEAVY = ("aten::mm", "aten::addmm", "aten::bmm", "aten::convolution", "aten::_softmax",
         "aten::_log_softmax", "aten::convolution_backward", "aten::_softmax_backward_data",
         "aten::_scaled_dot_product_flash_attention_for_cpu_backward")  # fmt: skip


def _train_both(make, loss_fn, steps: int = 3) -> None:
    torch.manual_seed(0)
    eager = make()
    model = make()
    model.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    tb.reset_stats()
    compiled = torch.compile(model, backend=aot.training_backend)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager warns: fail
        for step in range(steps):
            le = loss_fn(eager)
            opt_e.zero_grad()
            le.backward()
            lc = loss_fn(compiled)
            opt_c.zero_grad()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                lc.backward()
            ran = {e.name for e in prof.events()}
            assert not ran & set(HEAVY), f"step {step}: eager ATen in backward: {ran & set(HEAVY)}"
            assert abs(le.item() - lc.item()) <= 1e-4 * abs(le.item())
            for (name, pe), pc in zip(eager.named_parameters(), model.parameters()):
                scale = pe.grad.abs().max().clamp_min(1e-12)
                err = ((pe.grad - pc.grad).abs().max() / scale).item()
                assert err <= 1e-4, f"step {step}: {name} grad rel err {err:.2e}"
            opt_e.step()
            opt_c.step()
    assert tb.stats.eager_ops == {} and tb.stats.plans >= 2  # forward and backward plans


def test_mlp_trains_with_luminal_forward_and_backward() -> None:
    x, t = torch.randn(7, 13), torch.randint(0, 5, (7,))
    _train_both(
        lambda: torch.nn.Sequential(torch.nn.Linear(13, 33), torch.nn.GELU(),
                                    torch.nn.LayerNorm(33), torch.nn.Linear(33, 5)),
        lambda m: torch.nn.functional.cross_entropy(m(x), t),
    )  # fmt: skip


def test_cnn_trains_with_luminal_forward_and_backward() -> None:
    x, t = torch.randn(2, 3, 9, 9), torch.randint(0, 3, (2,))
    _train_both(
        lambda: torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 4, 3, stride=2), torch.nn.Flatten(), torch.nn.Linear(64, 3),
        ),
        lambda m: torch.nn.functional.cross_entropy(m(x), t),
    )  # fmt: skip


@pytest.mark.slow
def test_llama_trains_with_luminal_forward_and_backward() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    ids = torch.randint(0, 61, (2, 11))
    _train_both(
        lambda: transformers.LlamaForCausalLM(cfg),
        lambda m: m(input_ids=ids, labels=ids).loss,
        steps=2,
    )
