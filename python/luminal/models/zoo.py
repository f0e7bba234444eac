"""``luminal.models.load(path)``: a GGUF file or a transformers folder, ready to run.

The architecture comes from the file's metadata (GGUF ``general.architecture``, the folder's
``config.json`` ``model_type``). Language models come back as an ``LMSession``
(``forward(tokens) -> logits``, ``generate(...)``, ``tokenizer``), encoders as an ``Encoder``
(``embed(texts)``), image models as an ``ImageModel`` (``forward(pixels)``), a YOLOv8 folder
as a ``Detector`` (``forward(pixels)``, ``detect(pixels)``), Whisper as a
``WhisperSession`` (``transcribe(audio)``). An architecture
luminal has no definition for is a ``NotImplementedError`` naming it and the supported ones.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import numpy as np

from .base import DictWeights
from .bert import Embedder
from .decoder import Decoder
from .decoder_configs import GGUF_ARCHS, HF_ARCHS, hf_config
from .session import LMSession

# GGUF general.architecture -> what reads it
_GGUF_LLAMA = ("llama", "qwen2", "smollm")


class Encoder(Embedder):
    """A sentence encoder: ``embed(texts)`` -> L2-normalized embeddings (batch, hidden)."""

    def embed(self, texts: str | list[str]) -> np.ndarray:
        return self(texts)


def _tokenizer_of_dir(path: str) -> Any:
    from ..tokenizer import Tokenizer

    tj = os.path.join(path, "tokenizer.json")
    return Tokenizer.from_file(tj) if os.path.exists(tj) else None


def read_hf_dir(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """config.json and every tensor of the folder's safetensors files (mapped, not copied)."""
    from ..loaders.safetensors import SafetensorsFile

    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{path}: no config.json (not a transformers model folder)")
    with open(cfg_path) as fh:
        config = json.load(fh)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors files (only safetensors weights load)")
    arrays: dict[str, np.ndarray] = {}
    for fn in files:
        st = SafetensorsFile(fn)
        arrays.update({k: st[k] for k in st.keys()})
    return config, arrays


SUPPORTED_HF = ("llama", "bert", "gpt2", *HF_ARCHS, "gemma3", "resnet", "vit", "yolov8", "yolo11",
                "whisper")  # fmt: skip


def load(
    path: str | os.PathLike[str],
    backend: str = "auto",
    max_context: int | None = None,
    quiet: bool = True,
    dequant: str = "graph",
) -> Any:
    """The model at ``path`` (a ``.gguf`` file or a transformers folder), ready to run.
    ``backend``: 'auto', 'compiled' or 'interp' (see ``Runner``); ``max_context`` caps a
    language model's KV cache; ``dequant`` is how GGUF block formats enter the graph."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return _load_hf(path, backend, max_context, quiet)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    return _load_gguf(path, backend, max_context, quiet, dequant)


def _load_gguf(path: str, backend: str, max_context: int | None, quiet: bool,
               dequant: str) -> LMSession:  # fmt: skip
    from ..loaders.gguf import GGUFFile, GGUFWeights
    from ..tokenizer import Tokenizer
    from .decoder_configs import gguf_config
    from .llama import Llama, config_from_gguf

    f = GGUFFile(path)
    arch = f.architecture
    weights = GGUFWeights(f, dequant)
    model: Any
    # Mixtral is a "llama" GGUF with experts: the decoder has them, Llama does not
    moe = bool(f.arch_key("expert_count"))
    if arch in _GGUF_LLAMA and not moe:
        model = Llama(config_from_gguf(f), weights, max_context)
    elif arch == "gpt2":
        from .gpt2 import gpt2_from_gguf

        model = gpt2_from_gguf(f, weights, max_context)
    elif arch == "gpt-oss":
        from .gpt_oss import GgufNames, GptOss

        model = GptOss(gguf_config(f), GgufNames(weights), max_context)
    elif arch in GGUF_ARCHS:
        model = Decoder(gguf_config(f), weights, max_context)
    else:
        supported = sorted(set(_GGUF_LLAMA + GGUF_ARCHS + ("gpt2",)))
        raise NotImplementedError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(supported)})"
        )
    tok = Tokenizer.from_gguf(f) if f.get("tokenizer.ggml.model") is not None else None
    return LMSession(model, tok, backend, quiet)


def _load_hf(path: str, backend: str, max_context: int | None, quiet: bool) -> Any:
    config, arrays = read_hf_dir(path)
    mt = config.get("model_type")
    if mt == "bert":
        from .bert import Bert, BertConfig

        tok = _tokenizer_of_dir(path)
        if tok is None:
            raise FileNotFoundError(f"{path}: an encoder needs its tokenizer.json")
        ws = DictWeights({k.removeprefix("bert."): v for k, v in arrays.items()})
        return Encoder(Bert(BertConfig.from_hf(config), ws), tok, backend, quiet)
    if mt == "whisper":
        from .whisper import WhisperSession, whisper_from_hf

        pre_path = os.path.join(path, "preprocessor_config.json")
        pre = None
        if os.path.exists(pre_path):
            with open(pre_path) as fh:
                pre = json.load(fh)
        whisper = whisper_from_hf(config, arrays, pre)
        return WhisperSession(whisper, _tokenizer_of_dir(path), backend, quiet)
    if mt in ("yolov8", "yolo11"):
        from .yolo import Detector, yolo_from_dir

        return Detector(yolo_from_dir(config, arrays), backend, quiet)
    if mt in ("resnet", "vit"):
        from .vision import ImageModel, vision_from_hf

        return ImageModel(vision_from_hf(config, arrays), backend, quiet)
    model: Any
    if mt == "llama" and _rope_kind(config) in ("yarn", "longrope", "su", "dynamic"):
        model = decoder_from_hf(config, arrays, max_context)
    elif mt == "llama":
        from .llama import from_hf as llama_from_hf

        model = llama_from_hf(config, arrays, max_context)
    elif mt == "gpt2":
        from .gpt2 import from_hf as gpt2_from_hf

        model = gpt2_from_hf(config, arrays, max_context)
    elif mt == "gpt_oss":
        from .gpt_oss import gpt_oss_from_hf

        model = gpt_oss_from_hf(config, arrays, max_context)
    elif mt == "gemma3" and "vision_config" in config:
        from .gemma3_vision import Gemma3Session, tower_from_hf

        model = decoder_from_hf(config, arrays, max_context)
        return Gemma3Session(model, tower_from_hf(config, arrays),
                             int(config.get("image_token_index", config.get("image_token_id", -1))),
                             _tokenizer_of_dir(path), backend, quiet)  # fmt: skip
    elif mt in HF_ARCHS or mt == "gemma3":
        model = decoder_from_hf(config, arrays, max_context)
    else:
        raise NotImplementedError(
            f"{path}: transformers model_type {mt!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_HF)})"
        )
    return LMSession(model, _tokenizer_of_dir(path), backend, quiet)


def _rope_kind(config: dict[str, Any]) -> str | None:
    s = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return s.get("rope_type") or s.get("type")


def decoder_from_hf(
    config: dict[str, Any], arrays: dict[str, np.ndarray], max_context: int | None = None
) -> Decoder:
    """A ``Decoder`` from a transformers config dict and its arrays."""
    from .decoder_configs import hf_weights

    cfg = hf_config(config)
    tied = bool(config.get("tie_word_embeddings", config.get("model_type", "").startswith("gemma")))
    return Decoder(cfg, DictWeights(hf_weights(cfg, arrays, tied)), max_context)
