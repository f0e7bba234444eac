"""Tokenizers the zoo's models come with, against transformers on multilingual text:
SentencePiece BPE (``llama``) and Unigram (``t5``) vocabularies stored in GGUF metadata, and
``tokenizer.json`` folders."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from luminal.loaders.gguf import GGUFFile  # noqa: E402
from luminal.tokenizer import Tokenizer  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Le vif renard brun saute par-dessus le chien paresseux, à l'été.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Grüße!",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "敏捷的棕色狐狸跳过了懒狗。東京は日本の首都です。",
    "الثعلب البني السريع يقفز فوق الكلب الكسول",
    "numbers 12345 and 3.14159; code: def f(x): return x ** 2",
]
TEXTS = [
    "The lazy fox, à l'été, springt über 12 Hunde.",
    "東京の狐 прыгает — 🚀 emoji and ünïcödé not in the corpus: ŋ ʒ ꙮ",
    "  two leading spaces\tand a tab\nnewline",
    "الكلب السريع",
]


def _spm_pieces(kind: str) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary trained on the corpus: <unk>, <s>, </s>, 256 byte
    tokens (llama), then pieces with scores falling by rank."""
    from tokenizers import Tokenizer as TK
    from tokenizers import models, pre_tokenizers, trainers

    if kind == "llama":
        tk = TK(models.BPE())
        trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False)
    else:
        tk = TK(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=300, show_progress=False)
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tk.train_from_iterator(CORPUS * 4, trainer)
    # llama: <unk> <s> </s>; t5: <pad> </s> <unk> (T5's layout)
    tokens = ["<unk>", "<s>", "</s>"] if kind == "llama" else ["<pad>", "</s>", "<unk>"]
    scores, types = [0.0, 0.0, 0.0], [2, 3, 3] if kind == "llama" else [3, 3, 2]
    if kind == "llama":
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        scores += [0.0] * 256
        types += [6] * 256
        pieces = sorted(tk.get_vocab().items(), key=lambda kv: kv[1])
        tokens += [p for p, _ in pieces]
        scores += [-float(i) for i in range(len(pieces))]
    else:
        import json

        model = json.loads(tk.to_str())["model"]["vocab"]
        pieces = [(p, s) for p, s in model if p != "<unk>"]
        tokens += [p for p, _ in pieces]
        scores += [float(s) for _, s in pieces]
    types += [1] * (len(tokens) - len(types))
    return tokens, scores, types


def _write_gguf(path: str, kind: str) -> None:
    tokens, scores, types = _spm_pieces(kind)
    w = gguf.GGUFWriter(path, "llama" if kind == "llama" else "t5")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_tokenizer_model(kind)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    if kind == "llama":
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    else:
        w.add_unk_token_id(2)
        w.add_eos_token_id(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_gguf_sentencepiece_matches_transformers(kind: str, tmp_path) -> None:
    path = tmp_path / "tok.gguf"
    _write_gguf(str(path), kind)
    ours = Tokenizer.from_gguf(GGUFFile(path))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tok.gguf")
    assert (ours.bos_id, ours.eos_ids) == ((1, [2]) if kind == "llama" else (None, [1]))
    for t in TEXTS + CORPUS:
        ids = ours.encode(t, add_bos=False)
        assert ids == ref(t, add_special_tokens=False)["input_ids"], t
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), t
    if kind == "llama":  # byte fallback: texts round-trip, emoji included (SentencePiece
        for t in TEXTS[:2] + TEXTS[3:]:  # merges a leading run of spaces: not that one)
            assert ours.decode(ours.encode(t, add_bos=False)) == t
        assert ours.encode("hi")[0] == 1  # SentencePiece models add BOS


def test_tokenizer_json_matches_transformers(tmp_path) -> None:
    """A tokenizer.json folder (a byte-level BPE trained here) against transformers'
    PreTrainedTokenizerFast reading the same file."""
    from tokenizers import Tokenizer as TK
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tk = TK(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        show_progress=False,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(CORPUS * 4, trainer)
    tk.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.from_file(tmp_path / "tokenizer.json")
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for t in TEXTS + CORPUS:
        ids = ours.encode(t)
        assert ids == ref(t, add_special_tokens=False)["input_ids"], t
        assert ours.decode(ids) == ref.decode(ids) == t
