"""A transformers folder as a GGUF file laid out as llama.cpp's ``convert_hf_to_gguf.py`` lays it
out: what ``quantize`` reads when its input is a folder.

The folder holds ``config.json``, ``*.safetensors`` and ``tokenizer.json``
(``tokenizer_config.json`` beside it, when present, gives BOS/EOS and the chat template).
``ARCHS`` lists the ``model_type``s converted: each is one that llama.cpp's GGUF naming and
luminal's GGUF loader (``models/llama.py``) both know. What the file holds:

- tensors under their GGUF names (``models.llama.hf_to_gguf_name``) in the folder's float type
  (F32, F16, BF16; other types as F32); for GGUF ``llama`` the q/k rows (and biases) are
  permuted per head from transformers' rotate-half order to the adjacent pairs that GGUF llama
  files rotate (llama.cpp's ``LlamaModel.permute``), Qwen2 keeps halves; a tied head is no
  tensor (the embedding is read); Llama 3's RoPE scaling is ``rope_freqs.weight`` (the per
  frequency divisors llama.cpp's converter writes);
- the hyperparameters as ``<arch>.*`` keys;
- the tokenizer as ``tokenizer.ggml.*``: a byte-level BPE as ``gpt2`` (tokens, types,
  merges, and the pre-tokenizer's GGUF name, recognized from tokenizer.json's pre-tokenizer),
  a SentencePiece-style BPE (byte fallback, spaces as ``▁``: Llama 2, Mistral) as ``llama``
  (tokens, types, scores that order the merges, the space prefix); the special token ids,
  ``add_bos_token`` and the chat template from ``gguf.SpecialVocab``; the vocabulary padded to
  the embedding's rows with unused ``[PAD<i>]`` tokens, as llama.cpp's converter does.

A folder luminal cannot convert faithfully (another architecture, RoPE scaling other than
Llama 3's, biases a llama GGUF has no place for, a tokenizer of another kind) is a ValueError
naming what it holds and what is supported.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..models.llama import LlamaConfig

# transformers model_type -> GGUF general.architecture (Mistral is a llama in GGUF, as in
# llama.cpp's converter)
ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}

_NORMALIZERS = (None, "NFC")  # NFC: Qwen2's; llama.cpp and luminal's GGUF tokenizer skip it


def model_type(folder: str) -> str:
    """The folder's ``model_type`` if it is one of ``ARCHS``, else a ValueError naming it."""
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{folder}: no config.json (not a transformers model folder)")
    with open(cfg_path) as fh:
        mt = json.load(fh).get("model_type")
    if mt not in ARCHS:
        raise ValueError(
            f"{folder}: model_type {mt!r} cannot be quantized from a folder (supported: "
            f"{', '.join(ARCHS)}; convert other models to GGUF with llama.cpp's "
            "convert_hf_to_gguf.py first)"
        )
    return str(mt)


def write_gguf(folder: str, dst: str) -> None:
    """Write the transformers model in ``folder`` to ``dst`` as a GGUF file (see above)."""
    import gguf

    from ..models.llama import LlamaConfig, hf_to_gguf_name
    from ..models.zoo import read_hf_dir

    mt = model_type(folder)
    tok_path = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(tok_path):
        raise FileNotFoundError(
            f"{folder}: no tokenizer.json (the GGUF file carries the tokenizer; luminal reads "
            "tokenizer.json, not tokenizer.model)"
        )
    config, arrays = read_hf_dir(folder)
    arch = ARCHS[mt]
    c = LlamaConfig.from_hf(config)
    _check_config(folder, mt, config, c)
    tied = bool(config.get("tie_word_embeddings", False))
    tensors: dict[str, np.ndarray] = {}
    unknown = []
    for k, a in arrays.items():
        name = hf_to_gguf_name(k)
        if name is None:
            if not k.endswith("rotary_emb.inv_freq"):  # recomputed from rope_theta
                unknown.append(k)
            continue
        if tied and name == "output.weight":
            continue
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            a = _permute(a, c.n_heads if ".attn_q." in name else c.n_kv_heads)
        tensors[name] = a
    if unknown:
        raise ValueError(
            f"{folder}: tensors a {mt} GGUF file has no place for: {', '.join(sorted(unknown)[:4])}"
            + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
        )
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{folder}: no model.embed_tokens.weight")
    n_vocab = int(tensors["token_embd.weight"].shape[0])
    freqs = _llama3_rope_freqs(c)
    context = c.context_length
    window = config.get("sliding_window")
    if mt == "mistral" and window and int(window) < context:
        # luminal and llama.cpp attend to every cached position: exact up to the window
        context = int(window)

    w = gguf.GGUFWriter(dst, arch)
    w.add_name(os.path.basename(os.path.normpath(folder)))
    w.add_context_length(context)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_block_count(c.n_layers)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_eps)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(c.head_dim)
    if c.head_dim != c.hidden_size // c.n_heads:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    _add_tokenizer(w, folder, tok_path, n_vocab)
    if freqs is not None:
        w.add_tensor("rope_freqs.weight", freqs)
    for name, a in tensors.items():
        _add_tensor(w, name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _check_config(folder: str, mt: str, config: dict[str, Any], c: LlamaConfig) -> None:
    """Refuse what a GGUF llama / qwen2 file cannot say (luminal would run another model)."""
    rope = c.rope_scaling
    kind = None if rope is None else rope.get("rope_type", rope.get("type"))
    if kind not in (None, "default", "llama3"):
        raise ValueError(
            f"{folder}: RoPE scaling {kind!r} is not converted (supported: none, llama3)"
        )
    if mt != "qwen2" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise ValueError(f"{folder}: a {mt} model with attention or MLP biases is not converted")
    if mt == "qwen2" and config.get("use_sliding_window"):
        raise ValueError(f"{folder}: Qwen2 with sliding-window attention is not converted")
    if c.head_dim % 2:
        raise ValueError(f"{folder}: head_dim {c.head_dim} is odd (RoPE rotates pairs)")


def _permute(a: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of each head from rotate-half order (i, i + d/2) to adjacent pairs (2i, 2i + 1)."""
    return np.ascontiguousarray(
        a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:]).swapaxes(1, 2)
    ).reshape(a.shape)


def _llama3_rope_freqs(c: LlamaConfig) -> np.ndarray | None:
    """Llama 3.1's per-frequency RoPE divisors (llama.cpp's converter's ``rope_freqs``)."""
    rope = c.rope_scaling
    if rope is None or rope.get("rope_type", rope.get("type")) != "llama3":
        return None
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old = float(rope.get("original_max_position_embeddings", 8192))
    inv = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float32) / c.head_dim))
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def _add_tensor(w: Any, name: str, a: np.ndarray) -> None:
    import gguf
    import ml_dtypes

    if a.dtype == ml_dtypes.bfloat16:
        w.add_tensor(name, a.view(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)
    elif a.dtype in (np.float16, np.float32):
        w.add_tensor(name, a)
    else:
        w.add_tensor(name, np.asarray(a, np.float32))


def _add_tokenizer(w: Any, folder: str, tok_path: str, n_vocab: int) -> None:
    """``tokenizer.ggml.*`` from tokenizer.json (a BPE: byte-level, or SentencePiece's with
    byte fallback) and gguf's SpecialVocab (special ids, add_bos, chat template)."""
    import gguf

    with open(tok_path, encoding="utf-8") as fh:
        tj = json.load(fh)
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(
            f"{tok_path}: a {model.get('type')} tokenizer; quantizing a folder converts BPE "
            "tokenizers (byte-level as Llama 3, Qwen2, SmolLM; SentencePiece's as Llama 2, "
            "Mistral)"
        )
    vocab: dict[str, int] = model.get("vocab") or {}
    names: dict[int, str] = {i: t for t, i in vocab.items()}
    kinds = {i: gguf.TokenType.NORMAL for i in names}
    for a in tj.get("added_tokens") or []:
        i = int(a["id"])
        names[i] = a["content"]
        kinds[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    top = max(names, default=-1) + 1
    if top > n_vocab:
        raise ValueError(f"{tok_path}: token ids go to {top - 1}, the embedding has {n_vocab} rows")
    spm = bool(model.get("byte_fallback"))
    special = gguf.SpecialVocab(folder, load_merges=not spm, n_vocab=n_vocab)
    if spm:
        scores, prefix = _spm_scores(tok_path, tj, names, kinds, special)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_add_space_prefix(prefix)
    else:
        _check_byte_level(tok_path, tj)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(_pre_name(tok_path, tj.get("pre_tokenizer")))
    w.add_token_list([names.get(i, f"[PAD{i}]") for i in range(n_vocab)])
    w.add_token_types([kinds.get(i, gguf.TokenType.UNUSED) for i in range(n_vocab)])
    if spm:
        w.add_token_scores([scores.get(i, -1e9) for i in range(n_vocab)])
    # said outright: llama.cpp's default depends on the vocabulary's kind
    special.add_special_token.setdefault("bos", False)
    special.add_to_gguf(w, quiet=True)


def _check_byte_level(tok_path: str, tj: dict[str, Any]) -> None:
    dec = (tj.get("decoder") or {}).get("type")
    if dec != "ByteLevel":
        raise ValueError(f"{tok_path}: a BPE without byte fallback whose decoder is {dec}, not "
                         "ByteLevel: neither byte-level nor SentencePiece's")  # fmt: skip
    norm = (tj.get("normalizer") or {}).get("type")
    if norm not in _NORMALIZERS:
        raise ValueError(f"{tok_path}: the tokenizer's {norm} normalizer has no GGUF form")


def _spm_scores(tok_path: str, tj: dict[str, Any], names: dict[int, str], kinds: dict[int, Any],
                special: Any) -> tuple[dict[int, float], bool]:  # fmt: skip
    """A SentencePiece-style BPE (byte fallback, ``▁`` for spaces) as GGUF's ``llama``
    vocabulary, whose merge order is the merged token's score: each token scores minus the
    rank of the first merge that makes it (the order the merges were listed in, as
    transformers' converter lists a SentencePiece model's by score). Marks the byte and unknown
    tokens in ``kinds`` and the unknown id in ``special``; returns the scores and whether a
    space is put before the text."""
    import gguf

    norm = tj.get("normalizer") or {}
    steps: list[dict[str, Any]] = (
        (norm.get("normalizers") or [])
        if norm.get("type") == "Sequence"
        else [norm]
        if norm
        else []
    )
    pre = tj.get("pre_tokenizer") or {}
    space = "\u2581"
    replaces = [n for n in steps if n.get("type") == "Replace"]
    if pre.get("type") == "Metaspace" and not steps and pre.get("replacement") == space:
        prefix = pre.get("prepend_scheme", "always") in ("first", "always")  # the first word's
    elif not pre and replaces and all(n.get("type") in ("Prepend", "Replace") for n in steps):
        if any((r.get("pattern") or {}).get("String") != " " or r.get("content") != space
               for r in replaces):  # fmt: skip
            raise ValueError(f"{tok_path}: the normalizer replaces more than spaces with \u2581")
        prefix = any(n.get("type") == "Prepend" and n.get("prepend") == space for n in steps)
    else:
        raise ValueError(
            f"{tok_path}: a byte-fallback BPE whose normalizer {json.dumps(norm)[:120]} and "
            f"pre-tokenizer {json.dumps(pre)[:120]} are not SentencePiece's (spaces as \u2581)"
        )
    model = tj["model"]
    rank: dict[str, int] = {}
    for r, m in enumerate(model.get("merges") or []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        rank.setdefault(a + b, r)
    scores = {}
    for i, t in names.items():
        if kinds[i] == gguf.TokenType.NORMAL and re.fullmatch("<0x[0-9A-Fa-f]{2}>", t):
            kinds[i] = gguf.TokenType.BYTE
        scores[i] = -float(rank[t]) if t in rank else -float(len(rank))
    unk = model.get("unk_token")
    if unk is not None:
        uid = next((i for i, t in names.items() if t == unk), None)
        if uid is not None:
            kinds[uid] = gguf.TokenType.UNKNOWN
            special.special_token_ids.setdefault("unk", uid)
    return scores, prefix


def _pre_name(tok_path: str, pre: dict[str, Any] | None) -> str:
    """GGUF ``tokenizer.ggml.pre`` of tokenizer.json's pre-tokenizer, for the splits luminal's
    GGUF tokenizer and llama.cpp both have."""
    from ..tokenizer import _LLAMA3, _QWEN2

    # tokenizer.json's Split regexes -> the GGUF names luminal's tokenizer and llama.cpp split
    # the same way
    splits = {_LLAMA3: "llama-bpe", _QWEN2: "qwen2"}

    def byte_level(p: dict[str, Any], regex: bool) -> bool:
        return (p.get("type") == "ByteLevel" and not p.get("add_prefix_space", False)
                and bool(p.get("use_regex", True)) == regex)  # fmt: skip

    pre = pre or {}
    steps: list[dict[str, Any]] = (
        (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
    )
    if len(steps) == 1 and byte_level(steps[0], True):
        return "gpt-2"
    if len(steps) == 2:
        first, second = steps
        if first.get("type") == "Digits" and first.get("individual_digits"):
            if byte_level(second, True):
                return "smollm"
        pattern = (first.get("pattern") or {}).get("Regex")
        if (first.get("type") == "Split" and pattern in splits and byte_level(second, False)
                and first.get("behavior") == "Isolated" and not first.get("invert")):  # fmt: skip
            return splits[pattern]
    raise ValueError(
        f"{tok_path}: the pre-tokenizer {json.dumps(pre)[:200]} is not one converted (GPT-2's "
        "byte-level split, SmolLM's single digits, Llama 3's or Qwen2's regex)"
    )
