"""Llama-family graphs against transformers: tiny random models (both RoPE layouts, GQA, Qwen2
biases, tied and untied heads), the KV cache (prefill vs step-by-step, no recompiles over a
decode loop, context overflow), and SmolLM2-135M-Instruct from its Q4_1 GGUF (slow)."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import luminal  # noqa: E402
from luminal.models import LlamaSession  # noqa: E402
from luminal.models.llama import from_hf  # noqa: E402


@pytest.fixture(autouse=True)
def _own_plan_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test compiles what it counts: plans cached by other runs would hide compiles."""
    monkeypatch.setenv("LUMINAL_PLAN_CACHE_DIR", str(tmp_path / "plans"))


def _gguf_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (adjacent-pair RoPE layout)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _tiny(kind: str = "llama", tied: bool = False, interleaved: bool = False, ctx: int = 64):
    torch.manual_seed(0)
    common = dict(
        vocab_size=61,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=ctx,
        rope_theta=1000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
    )
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        hf = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**common)
        hf = transformers.LlamaForCausalLM(cfg)
    hf.eval()
    with torch.no_grad():  # random norms and biases so a wrong mapping shows
        for n, p in hf.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.uniform_(0.5, 1.5) if "norm" in n else p.normal_(0, 0.5)
    arrays = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    config = cfg.to_dict()
    model = from_hf(config, arrays)
    if interleaved:
        ws = model.weights.arrays  # type: ignore[attr-defined]
        for i in range(2):
            ws[f"blk.{i}.attn_q.weight"] = _gguf_permute(ws[f"blk.{i}.attn_q.weight"], 6)
            ws[f"blk.{i}.attn_k.weight"] = _gguf_permute(ws[f"blk.{i}.attn_k.weight"], 2)
        model.config.rope_interleaved = True
    return hf, model


def _hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize(
    "kind,tied,interleaved",
    [("llama", False, False), ("llama", True, True), ("qwen2", False, False)],
)
def test_tiny_matches_transformers(kind: str, tied: bool, interleaved: bool) -> None:
    hf, model = _tiny(kind, tied, interleaved)
    ids = [5, 17, 3, 42, 8, 60, 1]
    ref = _hf_logits(hf, ids)
    g = model.build(logits="all")
    out = g.run({"tokens": np.asarray(ids, np.int32), **model.new_cache()}, pos=0)["logits"]
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


def test_kv_cache_steps_match_full_forward() -> None:
    hf, model = _tiny()
    ids = [5, 17, 3, 42, 8, 60, 1, 9, 33]
    ref = _hf_logits(hf, ids)
    s = LlamaSession(model, "interp")
    got = [s.forward(ids[:4])]  # prefill 4, then one token at a time
    got += [s.forward([t]) for t in ids[4:]]
    np.testing.assert_allclose(np.stack(got), ref[3:], atol=2e-5, rtol=1e-4)
    s.reset()  # a fresh conversation reuses the cache buffers
    np.testing.assert_allclose(s.forward(ids[:2]), ref[1], atol=2e-5, rtol=1e-4)


def test_context_overflow_is_a_clear_error() -> None:
    _, model = _tiny(ctx=8)
    s = LlamaSession(model, "interp")
    s.forward([1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError, match="context"):
        s.forward([1, 2, 3])
    with pytest.raises(ValueError, match="token ids"):
        s.forward([99])


def _compiled_available() -> bool:
    try:
        from luminal import runtime  # noqa: F401
    except Exception:
        return False
    return hasattr(luminal, "compile")


def _count_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the graphs luminal.compile is called on from now on (in order)."""
    calls: list[str] = []
    real = luminal.compile

    def counting(graph, *a, **k):
        calls.append(graph.name)
        return real(graph, *a, **k)

    monkeypatch.setattr(luminal, "compile", counting)
    return calls


@pytest.mark.skipif(
    not _compiled_available(), reason="luminal.compile / the C++ runtime is not built"
)
def test_decode_loop_compiles_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 decode steps through one compiled plan: compile is called exactly once."""
    hf, model = _tiny(ctx=300)
    calls = _count_compiles(monkeypatch)
    s = LlamaSession(model, "compiled")
    prompt = [5, 17, 3, 42]
    lg = s.forward(prompt)
    toks = list(prompt)
    for _ in range(256):
        toks.append(int(np.argmax(lg)))
        lg = s.forward([toks[-1]])
    assert calls == ["llama"] and s.runner.compiles == 1
    ref = _hf_logits(hf, toks)  # the last step's logits, and greedy agreement on the way
    np.testing.assert_allclose(lg, ref[-1], atol=1e-3, rtol=1e-3)
    assert [int(t) for t in ref[len(prompt) - 1 : -1].argmax(-1)] == toks[len(prompt) :]


def test_prefill_graph_matches_decode_graph() -> None:
    """build_prefill (folded weights, seq >= min_seq) computes what
    build() computes, caches included (interpreter)."""
    hf, model = _tiny(interleaved=True)
    ids = np.asarray([5, 17, 3, 42, 8, 60, 1], np.int32)
    pre = model.build_prefill(4)
    assert pre.dims()["seq"].lo == 4
    assert list(pre.outputs) == list(model.build().outputs) and pre.state == model.state
    cache = model.new_cache()
    a = model.build().run({"tokens": ids[:5], **cache}, pos=0)
    b = pre.run({"tokens": ids[:5], **cache}, pos=0)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], atol=2e-5, rtol=1e-4)
    # a second chunk at pos 5 reads the cache the first one wrote
    cache = {n: b[n + "_new"] for n in model.cache_names()}
    got = pre.run({"tokens": np.asarray([9, 33, 2, 7], np.int32), **cache}, pos=5)["logits"][-1]
    ref = _hf_logits(hf, [*ids[:5].tolist(), 9, 33, 2, 7])[-1]
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="min_seq"):
        model.build_prefill(0)


def test_session_plans_come_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second session of the same model builds no graph and compiles nothing: both plans
    are loaded from the plan cache, and they compute what the compiled ones did."""
    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")  # default kernels: quick compiles
    _, model = _tiny(ctx=32)
    ids = [5, 17, 3, 42, 8, 60, 1, 9]
    s1 = LlamaSession(model, "compiled", prefill_min=5)
    ref = [s1.forward(ids), s1.forward([11]), s1.forward([2, 3])]
    builds: list[str] = []
    real_build, real_prefill = model.build, model.build_prefill
    model.build = lambda *a, **k: builds.append("decode") or real_build(*a, **k)  # type: ignore[method-assign]
    model.build_prefill = lambda *a, **k: builds.append("prefill") or real_prefill(*a, **k)  # type: ignore[method-assign]
    s2 = LlamaSession(model, "compiled", prefill_min=5)
    got = [s2.forward(ids), s2.forward([11]), s2.forward([2, 3])]
    assert builds == [] and s2.runner.cached and s2.runner.compiles == 0
    assert s2.prefill_runner is not None and s2.prefill_runner.cached
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    from luminal.models.base import DictWeights
    from luminal.models.llama import Llama

    ws = dict(model.weights.arrays)  # type: ignore[attr-defined]
    ws["output_norm.weight"] = ws["output_norm.weight"] * 1.5
    s3 = LlamaSession(Llama(model.config, DictWeights(ws), 32), "compiled", prefill_min=None)
    assert s3.runner.compiles == 1 and not s3.runner.cached  # other weights: compiled again
    assert not np.allclose(s3.forward(ids), ref[0])


def test_prefill_min_is_checked() -> None:
    _, model = _tiny()
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="prefill_min"):
            LlamaSession(model, "interp", prefill_min=bad)  # type: ignore[arg-type]
    s = LlamaSession(model, "interp", prefill_min=4)
    assert not s.has_prefill and not s.compile_prefill()  # the interpreter runs one graph


@pytest.mark.skipif(
    not _compiled_available(), reason="luminal.compile / the C++ runtime is not built"
)
def test_prefill_split_is_measured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``prefill_min="auto"`` the first long step compiles the prefill plan and measures
    from how many tokens it beats the decode plan; the plan splits there, the answer is
    remembered, and a second session neither measures again nor compiles the prefill plan
    for a step shorter than the split."""
    from luminal.models import crossing
    from luminal.models import llama as L

    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")  # default kernels: quick compiles
    monkeypatch.setattr(L, "PREFILL_MIN", 4)
    hf, model = _tiny(ctx=32)
    calls = _count_compiles(monkeypatch)
    s = LlamaSession(model, "compiled")
    assert s.prefill_min == 4 and s.split_measured and s.prefill_from is None
    ids = [5, 17, 3, 42, 8, 60, 1, 9, 33, 2, 7, 11]
    first = s.forward(ids[:6])
    assert calls == ["llama", "llama_prefill"]
    start = s.prefill_from
    assert start is not None and 4 <= start <= model.ctx
    assert s.split_ms is not None and min(s.split_ms["decode"]) == 4  # the ladder starts there
    assert s.plan.metadata["variants"] == f"seq: [1, {start}), [{start}, 33)"
    ref = _hf_logits(hf, ids)
    np.testing.assert_allclose(first, ref[5], atol=1e-4, rtol=1e-3)  # either variant: same

    memo = crossing.read_memo(L._SPLIT_MEMO)
    assert [v["from"] for v in memo.values()] == [start]
    # a split the decode plan keeps up to 7 tokens: a second session reads it, and a 6-token
    # step compiles no prefill plan
    key = next(iter(memo))
    crossing.write_memo(L._SPLIT_MEMO, key, {"from": 7})

    def no_measuring(*a, **k):
        raise AssertionError("measured again: the remembered split was not used")

    monkeypatch.setattr(crossing, "measure", no_measuring)
    calls.clear()
    s2 = LlamaSession(model, "compiled")
    assert not s2.wants_prefill(6) and s2.wants_prefill(7)
    np.testing.assert_allclose(s2.forward(ids[:6]), ref[5], atol=1e-4, rtol=1e-3)
    assert s2.prefill_runner is None and s2.prefill_from == 7
    s2.forward(ids[6:])  # 6 more tokens at position 6: still under the split
    assert s2.prefill_runner is None
    s2.reset()
    np.testing.assert_allclose(s2.forward(ids[:8]), ref[7], atol=1e-4, rtol=1e-3)
    assert s2.prefill_runner is not None and s2.plan.metadata["variants"].startswith("seq: [1, 7)")


@pytest.mark.skipif(
    not _compiled_available(), reason="luminal.compile / the C++ runtime is not built"
)
def test_long_prompts_use_the_prefill_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt of prefill_min+ tokens compiles the prefill plan once (on first use) and runs
    on it; shorter prompts and decode steps run on the decode plan; both are variants of one
    plan and share the cache."""
    hf, model = _tiny(ctx=32)
    calls = _count_compiles(monkeypatch)
    s = LlamaSession(model, "compiled", prefill_min=5)
    assert calls == ["llama"] and s.has_prefill and s.prefill_runner is None
    ids = [5, 17, 3, 42, 8, 60, 1, 9, 33, 2, 7, 11]
    got = [s.forward(ids[:6])]  # prefill plan
    got += [s.forward([t]) for t in ids[6:9]]  # decode plan, reading what prefill cached
    got.append(s.forward(ids[9:]))  # 3 tokens: decode plan
    assert calls == ["llama", "llama_prefill"]
    ref = _hf_logits(hf, ids)
    np.testing.assert_allclose(np.stack(got), ref[[5, 6, 7, 8, 11]], atol=1e-4, rtol=1e-3)
    s.reset()
    np.testing.assert_allclose(s.forward(ids[:7]), ref[6], atol=1e-4, rtol=1e-3)
    assert calls == ["llama", "llama_prefill"]  # compiled once, reused
    assert s.runner.compiles == 1 and s.prefill_runner is not None
    assert s.prefill_runner.compiles == 1
    # one plan: each step belongs to one variant, chosen by seq
    assert s.plan.metadata["variants"] == "seq: [1, 5), [5, 33)"
    assert all(st.when is not None for st in s.plan.steps)


# ----------------------------------------------------------------------------- SmolLM2 (real)
def _smollm2():
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from luminal.models import smollm2_path

    try:
        return smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smol():
    path = _smollm2()
    from luminal.models import load_gguf

    model, tok = load_gguf(path, dequant="load", max_context=128)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    hf.eval()
    return model, tok, hf


# Max |logit diff| measured on this prompt: 4.5e-5 (logits up to ~27); bound with margin.
SMOL_ATOL = 5e-4


def _greedy(s: LlamaSession, ids: list[int], steps: int) -> tuple[list[np.ndarray], list[int]]:
    """The prompt's last logits and ``steps`` greedy decode steps' logits, and the tokens."""
    got = [s.forward(ids)]
    gen: list[int] = []
    for _ in range(steps):
        gen.append(int(np.argmax(got[-1])))
        got.append(s.forward([gen[-1]]))
    return got, gen


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smol) -> None:
    """Interpreter, weights dequantized by gguf at load: last prompt position + 3 decode steps
    against transformers on the same dequantized weights (teacher-forced)."""
    model, tok, hf = smol
    ids = tok.encode("The capital of France is")
    s = LlamaSession(model, "interp")
    got, gen = _greedy(s, ids, 3)
    ref = _hf_logits(hf, ids + gen)[len(ids) - 1 :]
    assert np.abs(np.stack(got) - ref).max() < SMOL_ATOL
    assert tok.decode(gen).startswith(" Paris")


@pytest.mark.slow
def test_smollm2_greedy_32_tokens_match_transformers(smol) -> None:
    model, tok, hf = smol
    ids = tok.encode("The capital of France is")
    s = LlamaSession(model, "interp")
    lg = s.forward(ids)
    ours: list[int] = []
    for _ in range(32):
        ours.append(int(np.argmax(lg)))
        lg = s.forward([ours[-1]])
    # transformers' greedy choice at every step of the same sequence (teacher-forced, so an
    # EOS does not stop it): all 32 argmaxes agree <=> the greedy continuations are identical
    ref = _hf_logits(hf, ids + ours)[len(ids) - 1 : -1].argmax(-1)
    assert ours == ref.tolist()


@pytest.mark.slow
def test_smollm2_packed_dequant_graph_matches_load() -> None:
    """The packed Q4_1/Q8_0 blocks dequantized inside the graph give the same logits as
    weights dequantized at load time."""
    from luminal.models import load_gguf

    path = _smollm2()
    ids = [504, 3575, 282]
    out = []
    for mode in ("load", "graph"):
        model, _ = load_gguf(path, dequant=mode, max_context=16)
        out.append(LlamaSession(model, "interp").forward(ids))
    np.testing.assert_allclose(out[0], out[1], atol=1e-5, rtol=1e-5)


def test_tiny_gpt2_matches_transformers() -> None:
    from luminal.models.gpt2 import from_hf as gpt2_from_hf

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=61, n_positions=32, n_embd=48, n_layer=2, n_head=4)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "ln" in n and n.endswith("weight"):
                p.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.normal_(0, 0.3)
    arrays = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    model = gpt2_from_hf(cfg.to_dict(), arrays)
    ids = [5, 17, 3, 42, 8, 60, 1]
    ref = _hf_logits(hf, ids)
    s = LlamaSession(model, "interp")
    got = [s.forward(ids[:3])] + [s.forward([t]) for t in ids[3:]]
    np.testing.assert_allclose(np.stack(got), ref[2:], atol=2e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(
    not _compiled_available(), reason="luminal.compile / the C++ runtime is not built"
)
def test_smollm2_prefill_plan_matches_transformers(smol) -> None:
    """The packed Q4_1 GGUF through both compiled plans: a 20+-token prompt on the prefill plan
    (weights folded to f32, GEMMs), then 3 decode steps on the decode plan reading the cache
    the prefill plan wrote, against transformers (teacher-forced)."""
    from luminal.models import load_gguf

    _, tok, hf = smol
    model, _ = load_gguf(_smollm2(), dequant="graph", max_context=128)
    ids = tok.encode(
        "Write one sentence about the history of Paris, the capital of France, and its river. "
        "Then name three bridges over that river, the oldest first, and say in which century "
        "each of them was built."
    )
    s = LlamaSession(model, "compiled")
    assert s.prefill_min is not None and len(ids) >= s.prefill_min
    got, gen = _greedy(s, ids, 3)
    assert s.prefill_runner is not None  # the prompt ran on the prefill plan
    ref = _hf_logits(hf, ids + gen)[len(ids) - 1 :]
    assert np.abs(np.stack(got) - ref).max() < SMOL_ATOL
