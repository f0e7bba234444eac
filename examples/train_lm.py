"""Train a small character-level transformer language model with luminal.

    python examples/train_lm.py --steps 200 --out tiny_lm.safetensors

One compiled plan runs forward, backward and the AdamW update of every step; the model's
parameter arrays are the plan's state, updated in place. At the end the weights are saved as
safetensors, reloaded into a fresh model and used to greedily continue a prompt.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

import luminal as lm
from luminal import functional as F
from luminal import nn, optim, train

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny.txt")


class TinyLM(nn.Module):
    """Token + learned position embeddings, pre-norm blocks (LayerNorm, GELU MLP), a head."""

    def __init__(self, vocab: int, ctx: int, dim: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        self.ctx = ctx
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerBlock(
                dim, heads, hidden_dim=2 * dim, mlp="gelu", norm="layer", bias=True
            )  # fmt: skip
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: lm.Tensor) -> lm.Tensor:
        b, t = tokens.shape
        positions = tokens.graph.arange(t, dtype=lm.i32)
        h = self.embed(tokens) + self.pos(positions).unsqueeze(0)
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h))

    def loss(self, tokens: lm.Tensor, targets: lm.Tensor) -> lm.Tensor:
        logits = self(tokens)
        b, t, v = logits.shape
        return train.cross_entropy(logits.reshape(b * t, v), targets.reshape(b * t))


def torch_reference(vocab: int, ctx: int, dim: int = 32, heads: int = 4, layers: int = 2) -> Any:
    """The same model in PyTorch with the same parameter names (for checking)."""
    import torch
    from torch import nn as tnn

    class Block(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = tnn.LayerNorm(dim)
            self.self_attn = tnn.Module()
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(self.self_attn, p, tnn.Linear(dim, dim))
            self.post_attention_layernorm = tnn.LayerNorm(dim)
            self.mlp = tnn.Module()
            self.mlp.fc1, self.mlp.fc2 = tnn.Linear(dim, 2 * dim), tnn.Linear(2 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            a = self.self_attn
            h = self.input_layernorm(x)

            def split(y: torch.Tensor) -> torch.Tensor:
                return y.view(b, t, heads, dim // heads).transpose(1, 2)

            q, k, v = split(a.q_proj(h)), split(a.k_proj(h)), split(a.v_proj(h))
            o = tnn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, dim))
            m = self.mlp
            return x + m.fc2(tnn.functional.gelu(m.fc1(self.post_attention_layernorm(x))))

    class Ref(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = tnn.Embedding(vocab, dim)
            self.pos = tnn.Embedding(ctx, dim)
            self.blocks = tnn.ModuleList(Block() for _ in range(layers))
            self.norm = tnn.LayerNorm(dim)
            self.head = tnn.Linear(dim, vocab)

        def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            t = tokens.shape[1]
            h = self.embed(tokens) + self.pos(torch.arange(t))[None]
            for blk in self.blocks:
                h = blk(h)
            logits = self.head(self.norm(h))
            return tnn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    return Ref()


def load_text(path: str = DATA) -> tuple[np.ndarray, list[str]]:
    """The text as token ids (one per distinct character) and the vocabulary."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    ids = {c: i for i, c in enumerate(chars)}
    return np.array([ids[c] for c in text], dtype=np.int32), chars


def batches(data: np.ndarray, batch: int, ctx: int, seed: int = 0) -> Any:
    """Endless random windows: (tokens, next tokens), each (batch, ctx) int32."""
    rng = np.random.default_rng(seed)
    while True:
        start = rng.integers(0, len(data) - ctx - 1, batch)
        x = np.stack([data[s : s + ctx] for s in start])
        y = np.stack([data[s + 1 : s + ctx + 1] for s in start])
        yield x, y


def make_step(model: TinyLM, opt: optim.Optimizer, batch: int, **kw: Any) -> train.TrainStep:
    shape = (batch, model.ctx)
    return train.TrainStep(model, lambda m, x, y: m.loss(x, y), opt,
                           {"x": (shape, lm.i32), "y": (shape, lm.i32)}, **kw)  # fmt: skip


def generate(model: TinyLM, prompt: np.ndarray, n: int) -> np.ndarray:
    """Greedy continuation: one inference graph over the last ``ctx`` tokens, run per token."""
    g = lm.Graph("tiny_lm_infer")
    x = g.input("x", (1, model.ctx), lm.i32)
    g.output("next", F.argmax(model(x)[0, -1], -1))
    cg = lm.compile(g, search=False)
    out = list(prompt)
    for _ in range(n):
        window = np.array(out[-model.ctx :], dtype=np.int32)
        window = np.pad(window, (model.ctx - len(window), 0))
        out.append(int(cg.run({"x": window[None]})["next"]))
    return np.array(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", default="tiny_lm.safetensors")
    p.add_argument("--search", action="store_true", help="time kernel variants (slower compile)")
    a = p.parse_args(argv)
    from tqdm import tqdm

    data, chars = load_text()
    model = TinyLM(len(chars), a.ctx)
    t0 = time.perf_counter()
    step = make_step(model, optim.AdamW(lr=a.lr, weight_decay=0.01), a.batch, search=a.search)
    print(f"compiled the training step in {time.perf_counter() - t0:.1f} s "
          f"({model.num_parameters()} parameters)", file=sys.stderr)  # fmt: skip
    bar = tqdm(zip(range(a.steps), batches(data, a.batch, a.ctx)), total=a.steps)
    for _, (x, y) in bar:
        bar.set_postfix(loss=f"{step(x=x, y=y):.4f}")
    train.save_weights(model, a.out)
    fresh = TinyLM(len(chars), a.ctx)
    train.load_weights(fresh, a.out)
    prompt = data[:16]
    text = "".join(chars[i] for i in generate(fresh, prompt, 48))
    print(f"saved {a.out}; reloaded model continues: {text!r}")


if __name__ == "__main__":
    main()
