"""The batched decode graph (luminal.serve.batched) against per-sequence LlamaSession steps:
sequences of different lengths in scattered slots, prefilled one by one into their slots,
then decoded together; logits allclose and greedy tokens equal, interpreter and compiled."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from luminal.models.base import DictWeights
from luminal.models.llama import Llama, LlamaConfig, LlamaSession
from luminal.serve.batched import BatchedDecoder


def tiny_llama(
    ctx: int = 40, vocab: int = 97, hidden: int = 48, seed: int = 0, dtype: Any = np.float32
) -> Llama:
    """A random 2-layer GQA Llama (4 query heads, 2 kv heads, interleaved RoPE); f16 weights
    are cast in the graph (what a folded plan precomputes)."""
    heads, kv, inter = 4, 2, 80
    c = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        n_layers=2,
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=hidden // heads,
        context_length=ctx,
        rope_interleaved=True,
    )
    r = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (r.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + 0.1 * r.standard_normal(hidden)).astype(np.float32)

    kvw = kv * c.head_dim
    ws = {
        "token_embd.weight": r.standard_normal((vocab, hidden)).astype(np.float32),
        "output_norm.weight": norm(),
    }
    for i in range(2):
        p = f"blk.{i}."
        shapes = {
            "attn_q": (hidden, hidden),
            "attn_k": (kvw, hidden),
            "attn_v": (kvw, hidden),
            "attn_output": (hidden, hidden),
            "ffn_gate": (inter, hidden),
            "ffn_up": (inter, hidden),
            "ffn_down": (hidden, inter),
        }
        for n, s in shapes.items():
            ws[p + n + ".weight"] = mat(*s)
        ws[p + "attn_norm.weight"] = norm()
        ws[p + "ffn_norm.weight"] = norm()
    return Llama(c, DictWeights({k: v.astype(dtype) for k, v in ws.items()}))


@pytest.mark.parametrize(
    ("backend", "fold"), [("interp", False), ("compiled", False), ("compiled", True)]
)
def test_batched_decode_matches_per_sequence_sessions(backend: str, fold: bool) -> None:
    model = tiny_llama(dtype=np.float16 if fold else np.float32)
    bd = BatchedDecoder(model, slots=5, fold=fold)
    runner = bd.runner(backend)
    assert runner.backend == backend
    cache = bd.new_cache()
    assert cache["k_cache_0"].shape == (5 * model.ctx, model.kv_width)
    prompts = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13], [3, 3]]
    slots = [3, 0, 4, 1]  # slot 2 stays free; stale rows elsewhere must not leak in
    for a in cache.values():
        a[...] = 1e3
    prefill = LlamaSession(model, backend, prefill_min=None)
    refs = [LlamaSession(model, backend, prefill_min=None) for _ in prompts]
    logits = []
    for p, s, ref in zip(prompts, slots, refs, strict=True):
        got = bd.prefill(prefill, cache, s, p)
        np.testing.assert_allclose(got, ref.forward(p), rtol=1e-4, atol=1e-4)
        logits.append(got)
    toks = [int(np.argmax(x)) for x in logits]
    pos = [len(p) for p in prompts]
    for _ in range(5):
        out = bd.step(runner, cache, toks, pos, slots)
        assert out.shape == (len(prompts), model.config.vocab_size)
        want = np.stack([r.forward([t]) for r, t in zip(refs, toks, strict=True)])
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        toks = [int(np.argmax(x)) for x in out]
        assert toks == [int(np.argmax(x)) for x in want]
        pos = [p + 1 for p in pos]
    # a smaller batch of the same plan: drop two sequences, the others go on unchanged
    keep = [0, 2]
    out = bd.step(
        runner, cache, [toks[i] for i in keep], [pos[i] for i in keep], [slots[i] for i in keep]
    )
    want = np.stack([refs[i].forward([toks[i]]) for i in keep])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_batched_decode_bad_arguments() -> None:
    model = tiny_llama(ctx=8)
    with pytest.raises(ValueError, match="slots must be a positive int"):
        BatchedDecoder(model, 0)
    bd = BatchedDecoder(model, 2)
    runner = bd.runner("interp")
    with pytest.raises(ValueError, match="context limit of 8"):
        bd.step(runner, bd.new_cache(), [1], [8], [0])
    with pytest.raises(ValueError, match="rows must be a positive int"):
        BatchedDecoder(model, 2, rows=0)
    with pytest.raises(ValueError, match="1..2 rows"):
        bd.step(runner, bd.new_cache(), [1, 2, 3], [0, 1, 2], [0, 0, 0])
    with pytest.raises(ValueError, match="picks must be"):
        bd.step(runner, bd.new_cache(), [1], [0], [0], picks=[1])
    with pytest.raises(ValueError, match="slots must be in"):
        bd.step(runner, bd.new_cache(), [1], [0], [2])


@pytest.mark.parametrize(("backend", "fold"), [("interp", False), ("compiled", True)])
def test_prompts_as_rows_of_one_step(backend: str, fold: bool) -> None:
    """Chunked prefill: prompt tokens of several sequences (several rows per slot) go through
    the step beside decode rows; the picked rows' logits equal per-sequence sessions'."""
    model = tiny_llama(dtype=np.float16 if fold else np.float32)
    bd = BatchedDecoder(model, slots=3, fold=fold, rows=9)
    runner = bd.runner(backend)
    cache = bd.new_cache()
    for a in cache.values():
        a[...] = 1e3
    prompts = [[4, 8, 15, 16, 23, 42, 5], [7, 7, 1], [2, 9, 30, 31, 11, 6, 3, 12, 40, 1, 2]]
    slots = [2, 0, 1]
    refs = [LlamaSession(model, backend, prefill_min=None) for _ in prompts]
    fed = [0, 0, 0]
    last: list[int | None] = [None, None, None]
    while any(x is None for x in last) or min(fed) < 10:
        toks, pos, ids, picks, whose = [], [], [], [], []
        for i in range(len(prompts)):  # a decode row for each sequence past its prompt
            if last[i] is not None:
                picks.append(len(toks))
                whose.append(i)
                toks.append(last[i])
                pos.append(fed[i])
                ids.append(slots[i])
        chunk: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):  # then prompt tokens, 4 rows at most per step
            room = bd.rows - len(toks)
            if last[i] is None and room > 0:
                take = p[fed[i] : fed[i] + min(room, 4)]
                chunk[i] = take
                toks += take
                pos += list(range(fed[i], fed[i] + len(take)))
                ids += [slots[i]] * len(take)
                if fed[i] + len(take) == len(p):
                    picks.append(len(toks) - 1)
                    whose.append(i)
        out = bd.step(runner, cache, toks, pos, ids, picks)
        assert out.shape == (len(picks), model.config.vocab_size)
        for i, take in chunk.items():
            want = refs[i].forward(take)
            fed[i] += len(take)
            if fed[i] == len(prompts[i]):
                row = out[whose.index(i)]
                np.testing.assert_allclose(row, want.reshape(-1), rtol=1e-4, atol=1e-4)
                last[i] = int(np.argmax(row))
        for k, i in enumerate(whose):
            if i not in chunk:
                want = refs[i].forward([last[i]])
                np.testing.assert_allclose(out[k], want.reshape(-1), rtol=1e-4, atol=1e-4)
                fed[i] += 1
                last[i] = int(np.argmax(out[k]))
