"""Tokenizers for the models: ``tokenizer.json`` files and the tokenizer embedded in a GGUF.

Both become a ``tokenizers.Tokenizer`` (the Rust library) wrapped with what generation needs:
BOS/EOS ids, the chat template (Jinja, rendered in a sandbox like transformers does, ChatML
when a model has none) and incremental decoding for streaming.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# Pre-tokenizer regexes of byte-level BPE vocabularies, by GGUF ``tokenizer.ggml.pre``
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types that are whole special tokens


class Tokenizer:
    def __init__(
        self,
        tk: Any,
        bos_id: int | None = None,
        eos_ids: Sequence[int] = (),
        add_bos: bool = False,
        chat_template: str | None = None,
    ) -> None:
        self.tk = tk
        self.bos_id = bos_id
        self.eos_ids = list(eos_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """``tokenizer.json`` (+ ``tokenizer_config.json`` beside it for BOS/EOS/template)."""
        from tokenizers import Tokenizer as TK

        path = os.fspath(path)
        tk = TK.from_file(path)
        cfg: dict[str, Any] = {}
        cfg_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        if os.path.exists(cfg_path):
            with open(cfg_path) as fh:
                cfg = json.load(fh)

        def tok_id(key: str) -> int | None:
            v = cfg.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            return tk.token_to_id(v) if isinstance(v, str) else None

        eos = tok_id("eos_token")
        tmpl = cfg.get("chat_template")
        return cls(
            tk,
            tok_id("bos_token"),
            [eos] if eos is not None else [],
            bool(cfg.get("add_bos_token", False)),
            tmpl if isinstance(tmpl, str) else None,
        )

    @classmethod
    def from_gguf(cls, f: Any) -> Tokenizer:
        """The tokenizer stored in a GGUF file's ``tokenizer.ggml.*`` metadata: byte-level BPE
        (``gpt2``), SentencePiece BPE (``llama``: merges by token score, byte fallback) or
        SentencePiece Unigram (``t5``)."""
        kind = f.get("tokenizer.ggml.model")
        if kind in ("llama", "t5"):
            return cls._from_gguf_spm(f, kind)
        if kind != "gpt2":
            raise NotImplementedError(
                f"{f.path}: GGUF tokenizer model {kind!r} is not supported "
                "(gpt2: byte-level BPE, llama: SentencePiece BPE, t5: SentencePiece Unigram)"
            )
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as TK

        tokens: list[str] = f.get("tokenizer.ggml.tokens")
        merges = f.get("tokenizer.ggml.merges") or []
        types = f.get("tokenizer.ggml.token_type")
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tk = TK(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
        pre = f.get("tokenizer.ggml.pre", "default")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in ("llama-bpe", "llama3", "smaug-bpe", "dbrx"):
            split = pre_tokenizers.Split(Regex(_LLAMA3), behavior="isolated", invert=False)
            tk.pre_tokenizer = pre_tokenizers.Sequence(
                [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
        elif pre == "qwen2":
            split = pre_tokenizers.Split(Regex(_QWEN2), behavior="isolated", invert=False)
            tk.pre_tokenizer = pre_tokenizers.Sequence(
                [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
        elif pre in ("smollm", "starcoder", "refact"):  # single digits, then GPT-2 splitting
            tk.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        else:
            tk.pre_tokenizer = byte_level
        tk.decoder = decoders.ByteLevel()
        if types is not None:
            kinds = np.asarray(types)
            ids = np.flatnonzero((kinds == _CONTROL) | (kinds == _USER_DEFINED))
            tk.add_special_tokens(
                [AddedToken(tokens[i], special=True, normalized=False) for i in ids.tolist()]
            )
        eos = f.get("tokenizer.ggml.eos_token_id")
        eot = f.get("tokenizer.ggml.eot_token_id")
        eos_ids = [int(e) for e in (eos, eot) if e is not None]
        bos = f.get("tokenizer.ggml.bos_token_id")
        return cls(
            tk,
            int(bos) if bos is not None else None,
            list(dict.fromkeys(eos_ids)),
            bool(f.get("tokenizer.ggml.add_bos_token", False)),
            f.get("tokenizer.chat_template"),
        )

    @classmethod
    def _from_gguf_spm(cls, f: Any, kind: str) -> Tokenizer:
        """SentencePiece vocabularies (``▁`` for a space). ``llama``: BPE whose merge order is
        the merged token's score, best first (what SentencePiece's BPE does), unknown bytes
        as ``<0xNN>`` tokens; ``t5``: Unigram over the scores."""
        import numpy as np
        from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as TK

        tokens: list[str] = list(f.get("tokenizer.ggml.tokens") or [])
        if not tokens:
            raise ValueError(f"{f.path}: GGUF tokenizer has no tokenizer.ggml.tokens")
        scores = f.get("tokenizer.ggml.scores")
        scores = [0.0] * len(tokens) if scores is None else [float(x) for x in scores]
        types = f.get("tokenizer.ggml.token_type")
        types = [1] * len(tokens) if types is None else [int(t) for t in types]
        unk = f.get("tokenizer.ggml.unknown_token_id")
        if kind == "t5":
            model: Any = models.Unigram(
                list(zip(tokens, scores, strict=True)),
                unk_id=int(unk) if unk is not None else None,
                byte_fallback=False,
            )
        else:
            vocab = {t: i for i, t in enumerate(tokens)}
            merges = _spm_merges(tokens, scores, types)
            model = models.BPE(vocab, merges, unk_token=tokens[int(unk)] if unk is not None
                               else None, fuse_unk=True, byte_fallback=True)  # fmt: skip
        tk = TK(model)
        space = f.get("tokenizer.ggml.add_space_prefix", True)
        if kind == "t5":  # words split at whitespace (runs, tabs, newlines), each with a ▁
            charsmap = f.get("tokenizer.ggml.precompiled_charsmap")
            if charsmap is not None and len(charsmap):
                tk.normalizer = normalizers.Precompiled(bytes(np.asarray(charsmap, np.uint8)))
            tk.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.WhitespaceSplit(),
                 pre_tokenizers.Metaspace("\u2581", prepend_scheme="always", split=True)]
            )  # fmt: skip
            tk.decoder = decoders.Metaspace("\u2581", prepend_scheme="always", split=True)
        else:
            tk.pre_tokenizer = pre_tokenizers.Metaspace(
                replacement="\u2581", prepend_scheme="first" if space else "never", split=False
            )
            steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            if space:
                steps.append(decoders.Strip(content=" ", left=1, right=0))
            tk.decoder = decoders.Sequence(steps)
        special = [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, t in enumerate(types)
            if t in (_CONTROL, _USER_DEFINED) or (unk is not None and i == int(unk))
        ]
        tk.add_special_tokens(special)
        eos = f.get("tokenizer.ggml.eos_token_id")
        eot = f.get("tokenizer.ggml.eot_token_id")
        bos = f.get("tokenizer.ggml.bos_token_id")
        return cls(
            tk,
            int(bos) if bos is not None else None,
            list(dict.fromkeys(int(e) for e in (eos, eot) if e is not None)),
            bool(f.get("tokenizer.ggml.add_bos_token", kind == "llama")),
            f.get("tokenizer.chat_template"),
        )

    # ------------------------------------------------------------------ use
    @property
    def vocab_size(self) -> int:
        return int(self.tk.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = list(self.tk.encode(text, add_special_tokens=False).ids)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return str(self.tk.decode(list(ids), skip_special_tokens=skip_special))

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render the model's chat template (ChatML when it has none)."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        tmpl = env.from_string(self.chat_template or _CHATML)
        tok = self.tk.id_to_token
        return tmpl.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=tok(self.bos_id) if self.bos_id is not None else "",
            eos_token=tok(self.eos_ids[0]) if self.eos_ids else "",
        )

    def streamer(self) -> StreamDecoder:
        return StreamDecoder(self)


class StreamDecoder:
    """Turns generated ids into text pieces as they arrive; holds back an incomplete UTF-8
    sequence (shown by the decoder as U+FFFD) until the next token completes it."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[self.emitted :]
        self.emitted = len(text)
        return piece


_NORMAL, _BYTE = 1, 6  # GGUF token types: a normal piece, a <0xNN> byte-fallback token


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a normal token into
    two tokens of the vocabulary, ranked by the merged token's score (highest first), ties by
    the ids of the parts."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for t, sc, ty in zip(tokens, scores, types, strict=True):
        if ty != _NORMAL:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            ia, ib = vocab.get(a), vocab.get(b)
            if ia is not None and ib is not None:
                ranked.append((-sc, ia, ib, a, b))
    ranked.sort()
    return [(a, b) for _, _, _, a, b in ranked]
