"""all-MiniLM-L6-v2 sentence embeddings against sentence-transformers (or, without it, a
transformers BertModel with mean pooling): one graph with symbolic batch and seq serves
sentences of different lengths and padded batches."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import luminal as lm  # noqa: E402
from luminal.models import Bert, Embedder, minilm_dir  # noqa: E402
from luminal.tokenizer import Tokenizer  # noqa: E402

SENTENCES = [
    "a",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Luminal records a model as a static graph of fifteen primitive operations over "
    "symbolically shaped tensors, then compiles it ahead of time into a plan.",
]


@pytest.fixture(scope="module")
def minilm():
    try:
        d = minilm_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return d, Bert.from_dir(d), Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def _reference(d: str, texts: list[str]) -> np.ndarray:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        SentenceTransformer = None
    if SentenceTransformer is not None:
        return SentenceTransformer(d, device="cpu").encode(texts, normalize_embeddings=True)
    from transformers import AutoTokenizer, BertModel

    tok, model = AutoTokenizer.from_pretrained(d), BertModel.from_pretrained(d).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(e, dim=-1).numpy()


def test_minilm_matches_reference_one_graph(minilm) -> None:
    d, model, tok = minilm
    emb = Embedder(model, tok, "interp")
    ref = _reference(d, SENTENCES)
    got = np.concatenate([emb(s) for s in SENTENCES])  # one graph, seq = 3 .. 30
    lengths = {emb.encode_ids([s])[0].shape[1] for s in SENTENCES}
    assert len(lengths) == len(SENTENCES)
    cos = (got * ref).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(ref, axis=-1)
    assert cos.min() >= 0.9999, cos
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)


def test_minilm_padded_batch_equals_single(minilm) -> None:
    _, model, tok = minilm
    emb = Embedder(model, tok, "interp")
    texts = SENTENCES[:3]
    batch = emb(texts)  # padded to the longest; the mask keeps padding out
    single = np.concatenate([emb(t) for t in texts])
    np.testing.assert_allclose(batch, single, atol=2e-6)


def test_packed_graph_matches_padded_at_odd_lengths(minilm) -> None:
    """The packed graph (texts end to end, attention and pooling reading their rows by
    index) gives the padded graph's embeddings, compiled, for texts of different lengths."""
    from luminal.models.bert import pack_texts

    _, model, tok = minilm
    texts = [SENTENCES[0], "hi there", SENTENCES[2] + " " + SENTENCES[1], SENTENCES[3], "a b c"]
    emb = Embedder(model, tok, "compiled")
    ids, mask = emb.encode_ids(texts)
    assert len(set(mask.sum(1).tolist())) == len(texts)
    padded = lm.compile(model.build()).run({"input_ids": ids, "attention_mask": mask})
    packed = emb(texts)
    np.testing.assert_allclose(packed, padded["embeddings"], atol=2e-6)
    inputs = pack_texts([list(r[m.astype(bool)]) for r, m in zip(ids, mask, strict=True)])
    assert inputs["input_ids"].shape == (int(mask.sum()),)
    with pytest.raises(ValueError, match="at least one token"):
        pack_texts([[101, 102], []])


def test_minilm_bf16_products_agree_with_the_reference(minilm, monkeypatch) -> None:
    """LUMINAL_MATMUL_PRECISION=bf16: the plan holds the projections' weights as bf16 and
    runs them as bf16 GEMMs; embeddings stay within 5e-5 of sentence-transformers' in
    cosine (bf16 keeps 8 bits of each operand, f32 sums)."""
    monkeypatch.setenv("LUMINAL_MATMUL_PRECISION", "bf16")
    d, model, tok = minilm
    emb = Embedder(model, tok, "compiled")
    got = emb(SENTENCES)
    ref = _reference(d, SENTENCES)
    cos = (got * ref).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(ref, axis=-1)
    assert cos.min() >= 0.99995, cos
    plan = emb.runner._plan.plan
    half = [b for b in plan.buffers if b.role.name == "weight" and b.dtype.name == "bf16"]
    assert len(half) >= 6 * 4  # per layer: merged q/k/v, output, up and down projections
