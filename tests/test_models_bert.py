"""all-MiniLM-L6-v2 sentence embeddings against sentence-transformers (or, without it, a
transformers BertModel with mean pooling): one graph with symbolic batch and seq serves
sentences of different lengths and padded batches."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

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
