"""Where a ``DecoderConfig`` and the decoder's weight names come from: a transformers
``config.json`` (``hf_config``) with its parameter names mapped to the GGUF names the decoder
reads (``hf_weights``), or GGUF metadata as llama.cpp writes it (``gguf_config``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from .decoder import DecoderConfig
from .rope import resolve_scaling

# ----------------------------------------------------------------------------- transformers


def _rope_params(c: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float | None, float]:
    """(theta, scaling, local theta, partial rotary factor) from a transformers config: flat
    (``rope_theta``, ``rope_scaling``) or nested ``rope_parameters`` (transformers 5; Gemma 3
    nests one set per layer type)."""
    rp = c.get("rope_parameters") or {}
    local = None
    if "full_attention" in rp:
        local = rp.get("sliding_attention", {}).get("rope_theta")
        rp = rp["full_attention"]
    rp = dict(rp)
    theta = float(rp.pop("rope_theta", c.get("rope_theta", c.get("rotary_emb_base", 10000.0))))
    partial = float(rp.pop("partial_rotary_factor", c.get("partial_rotary_factor",
                                                            c.get("rotary_pct", 1.0))))  # fmt: skip
    scaling = c.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    if local is None and c.get("rope_local_base_freq") is not None:
        local = float(c["rope_local_base_freq"])
    return theta, scaling, (float(local) if local is not None else None), partial


def _layer_types(c: dict[str, Any], n: int) -> list[str]:
    types = c.get("layer_types")
    if types:
        return ["sliding" if t == "sliding_attention" else "full" for t in types]
    if c.get("sliding_window") and c.get("use_sliding_window", True):
        return ["sliding"] * n
    return ["full"] * n


HF_ARCHS = ("qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "gpt_neox",
            "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")  # fmt: skip


def hf_config(c: dict[str, Any]) -> DecoderConfig:
    """A ``DecoderConfig`` from a transformers ``config.json`` dict."""
    mt = c.get("model_type", "?")
    if mt == "gemma3" and "text_config" in c:  # the multimodal wrapper: its language model
        c = {**c["text_config"], "model_type": "gemma3_text"}
        mt = "gemma3_text"
    if mt not in HF_ARCHS and mt != "llama":  # Llama comes here for the scalings llama.py lacks
        raise NotImplementedError(f"transformers model_type {mt!r} is not a supported decoder")
    heads = c["num_attention_heads"]
    n = c["num_hidden_layers"]
    hidden = c["hidden_size"]
    head_dim = c.get("head_dim") or hidden // heads
    theta, scaling, local, partial = _rope_params(c)
    gemma = mt.startswith("gemma")
    act = c.get("hidden_activation") or c.get("hidden_act", "silu")
    act = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}.get(
        act, act
    )
    max_pos = int(c.get("max_position_embeddings", 2048))
    scaling = resolve_scaling(scaling, max_pos)
    if scaling and scaling["rope_type"] == "dynamic":  # made to run past the trained context
        max_pos = int(max_pos * float(scaling["factor"]))
    types = _layer_types(c, n)
    if mt == "qwen2" or mt == "qwen2_moe":  # Qwen2 slides only past max_window_layers
        if not c.get("use_sliding_window", False):
            types = ["full"] * n
    cfg = DecoderConfig(
        arch=mt,
        vocab_size=c["vocab_size"],
        hidden_size=hidden,
        intermediate_size=c.get("intermediate_size", 4 * hidden),
        n_layers=n,
        n_heads=heads,
        n_kv_heads=heads if mt == "gpt_neox" else (c.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        context_length=max_pos,
        rope_theta=theta,
        rope_scaling=scaling,
        rope_dims=int(head_dim * partial) if partial != 1.0 else None,
        rope_theta_local=local if mt == "gemma3_text" else None,
        norm="layer" if mt == "gpt_neox" else "rms",
        norm_eps=float(c.get("rms_norm_eps", c.get("layer_norm_eps", 1e-6))),
        norm_offset=1.0 if gemma else 0.0,
        qk_norm=mt in ("qwen3", "qwen3_moe", "gemma3_text"),
        act=act,
        gated=mt != "gpt_neox",
        sandwich_norms=mt in ("gemma2", "gemma3_text"),
        parallel_residual=mt == "gpt_neox" and bool(c.get("use_parallel_residual", True)),
        sliding_window=c.get("sliding_window") if "sliding" in types else None,
        layer_types=types,
        attn_scale=(
            float(c["query_pre_attn_scalar"]) ** -0.5 if c.get("query_pre_attn_scalar") else None
        ),  # fmt: skip
        attn_softcap=c.get("attn_logit_softcapping"),
        final_softcap=c.get("final_logit_softcapping"),
        embed_scale=math.sqrt(hidden) if gemma else None,
    )
    if mt in ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss"):
        step = int(c.get("decoder_sparse_step", 1) or 1)
        dense = [i for i in range(n) if i in (c.get("mlp_only_layers") or []) or (i + 1) % step]
        cfg = replace(
            cfg,
            n_experts=int(c.get("num_local_experts") or c.get("num_experts") or 0),
            top_k=int(c["num_experts_per_tok"]),
            norm_topk=bool(c.get("norm_topk_prob", mt == "mixtral")),
            moe_intermediate_size=int(c.get("moe_intermediate_size") or c["intermediate_size"]),
            shared_expert_size=int(c.get("shared_expert_intermediate_size") or 0),
            dense_layers=dense,
        )
    return cfg


_HF_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",  # Phi-3: fused, gate first
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.experts.gate_up_proj": "ffn_gate_up_exps",
    "mlp.experts.down_proj": "ffn_down_exps",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    # GPT-NeoX
    "attention.query_key_value": "attn_qkv",
    "attention.dense": "attn_output",
    "mlp.dense_h_to_4h": "ffn_up",
    "mlp.dense_4h_to_h": "ffn_down",
}
_HF_TOP = {
    "embed_tokens.weight": "token_embd.weight",
    "embed_in.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "final_layer_norm.weight": "output_norm.weight",
    "final_layer_norm.bias": "output_norm.bias",
}
# per-expert weights as save_pretrained writes them, stacked into (experts, rows, cols)
_EXPERT_LEAF = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps",
                "gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                "down_proj": "ffn_down_exps"}  # fmt: skip
_PREFIXES = ("model.language_model.", "language_model.model.", "model.", "gpt_neox.")


def hf_weights(
    cfg: DecoderConfig, arrays: dict[str, np.ndarray], tied: bool
) -> dict[str, np.ndarray]:
    """transformers parameter names -> the GGUF names ``Decoder`` reads. Arrays stay views
    (of the mapped file) where a split is a slice; names no layer uses are dropped."""
    out: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, a in arrays.items():
        if name in ("lm_head.weight", "embed_out.weight"):
            if not tied:
                out["output.weight"] = a
            continue
        rest = next((name[len(p) :] for p in _PREFIXES if name.startswith(p)), None)
        if rest is None:
            continue
        if rest in _HF_TOP:
            out[_HF_TOP[rest]] = a
            continue
        parts = rest.split(".")
        if parts[0] != "layers" or len(parts) < 3:
            continue
        blk, body = f"blk.{parts[1]}.", ".".join(parts[2:])
        mod, leaf = body.rsplit(".", 1)
        if body in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            mod, leaf = body, "weight"
        ex = mod.split(".")
        if len(ex) == 4 and ex[1] == "experts" and ex[3] in _EXPERT_LEAF and leaf == "weight":
            experts.setdefault(f"{blk}{_EXPERT_LEAF[ex[3]]}.weight", {})[int(ex[2])] = a
            continue
        if cfg.sandwich_norms and mod == "post_attention_layernorm":
            out[blk + "post_attention_norm." + leaf] = a
            continue
        if mod not in _HF_LAYER:
            continue
        gg = _HF_LAYER[mod]
        if cfg.arch == "gpt_neox" and gg == "attn_qkv":  # per head [q | k | v]: split
            heads = a.reshape(cfg.n_heads, 3, cfg.head_dim, *a.shape[1:])
            for j, kind in enumerate(("attn_q", "attn_k", "attn_v")):
                out[f"{blk}{kind}.{leaf}"] = heads[:, j].reshape(-1, *a.shape[1:])
            continue
        out[f"{blk}{gg}.{leaf}"] = a
    for name, by_id in experts.items():
        if sorted(by_id) != list(range(cfg.n_experts)):
            raise ValueError(f"{name}: experts {sorted(by_id)} of {cfg.n_experts} in the files")
        out[name] = np.stack([by_id[e] for e in range(cfg.n_experts)])
    return out


GGUF_ARCHS = ("qwen3", "gemma", "gemma2", "gemma3", "phi3", "gptneox", "qwen2moe", "qwen3moe",
              "llama", "gpt-oss")  # fmt: skip


def gguf_config(f: Any) -> DecoderConfig:
    """A ``DecoderConfig`` from GGUF metadata (llama.cpp's keys: ``<arch>.block_count`` ...).
    What GGUF does not store follows llama.cpp: Gemma's norm weights are saved as 1 + w, its
    attention scale is head_dim ** -0.5, Gemma 2 alternates sliding and global layers and
    Gemma 3 has five sliding layers per global one (local RoPE base 10000); Qwen3-MoE
    renormalizes its top-k weights and Qwen2-MoE does not."""
    arch = f.architecture
    if arch not in GGUF_ARCHS:
        raise NotImplementedError(
            f"{f.path}: GGUF architecture {arch!r} is not supported by luminal.models.decoder "
            f"(supported: {', '.join(GGUF_ARCHS)})"
        )

    need = f.need_arch_key

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    n = int(need("block_count"))
    head_dim = int(f.arch_key("attention.key_length", hidden // heads))
    window = f.arch_key("attention.sliding_window")
    gemma = arch.startswith("gemma")
    neox = arch == "gptneox"
    types = ["full"] * n
    if arch in ("gemma2", "gpt-oss"):
        types = ["sliding" if i % 2 == 0 else "full" for i in range(n)]
    elif arch == "gemma3":
        types = ["sliding" if (i + 1) % 6 else "full" for i in range(n)]
    rope_dims = f.arch_key("rope.dimension_count")
    scaling = _gguf_rope_scaling(f)
    experts = int(f.arch_key("expert_count", 0) or 0)
    vocab = f.arch_key("vocab_size") or f.shape("token_embd.weight")[0]
    return DecoderConfig(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(f.arch_key("feed_forward_length", 0) or 0),
        n_layers=n,
        n_heads=heads,
        n_kv_heads=int(f.arch_key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        context_length=int(f.arch_key("context_length", 2048)),
        rope_theta=float(f.arch_key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rope_dims=int(rope_dims) if rope_dims and int(rope_dims) != head_dim else None,
        # llama.cpp permutes Llama q/k rows for adjacent-pair RoPE; the others keep halves
        rope_interleaved=arch == "llama",
        rope_theta_local=10000.0 if arch == "gemma3" else None,
        norm="layer" if neox else "rms",
        norm_eps=float(
            f.arch_key(
                "attention.layer_norm_epsilon" if neox else "attention.layer_norm_rms_epsilon", 1e-6
            )
        ),  # fmt: skip
        qk_norm="blk.0.attn_q_norm.weight" in f.tensors,
        act="gelu_tanh" if gemma else ("gelu" if neox else "silu"),
        gated=not neox,
        parallel_residual=neox and bool(f.arch_key("use_parallel_residual", True)),
        sandwich_norms=arch in ("gemma2", "gemma3"),
        sliding_window=int(window) if window and "sliding" in types else None,
        layer_types=types,
        attn_softcap=f.arch_key("attn_logit_softcapping"),
        final_softcap=f.arch_key("final_logit_softcapping"),
        embed_scale=math.sqrt(hidden) if gemma else None,
        n_experts=experts,
        top_k=int(f.arch_key("expert_used_count", 0) or 0),
        norm_topk=arch != "qwen2moe",
        moe_intermediate_size=int(f.arch_key("expert_feed_forward_length", 0) or 0),
        shared_expert_size=int(f.arch_key("expert_shared_feed_forward_length", 0) or 0),
    )


def _gguf_rope_scaling(f: Any) -> dict[str, Any] | None:
    """``rope.scaling.*`` as a ``resolve_scaling`` dict: LongRoPE (``rope_factors_long`` /
    ``_short`` tensors, as llama.cpp's Phi-3 converter writes them), linear (the default type
    when only a factor is stored) or YaRN (its original context; GPT-OSS does not round YaRN's
    ramp ends, as its reference implementation)."""
    if "rope_factors_long.weight" in f.tensors:  # Phi-3 LongRoPE: its factors as tensors
        orig = f.arch_key("rope.scaling.original_context_length")
        if orig is None:
            raise ValueError(f"{f.path}: LongRoPE needs rope.scaling.original_context_length")
        lr: dict[str, Any] = {
            "rope_type": "longrope",
            "long_factor": [float(v) for v in f.array("rope_factors_long.weight").reshape(-1)],
            "short_factor": [float(v) for v in f.array("rope_factors_short.weight").reshape(-1)],
            "original_max_position_embeddings": int(orig),
            "factor": int(f.arch_key("context_length", orig)) / int(orig),
        }
        if f.arch_key("rope.scaling.attn_factor") is not None:
            lr["attention_factor"] = float(f.arch_key("rope.scaling.attn_factor"))
        return lr
    factor = f.arch_key("rope.scaling.factor")
    kind = f.arch_key("rope.scaling.type") or ("linear" if factor else None)
    if not kind or kind == "none" or not factor or float(factor) == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind != "yarn":
        raise NotImplementedError(f"{f.path}: rope.scaling.type {kind!r} (linear, yarn)")
    orig = f.arch_key("rope.scaling.original_context_length")
    if orig is None:
        raise ValueError(f"{f.path}: YaRN needs rope.scaling.original_context_length")
    s: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor),
                         "original_max_position_embeddings": int(orig),
                         "truncate": f.architecture != "gpt-oss"}  # fmt: skip
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if f.arch_key("rope.scaling." + key) is not None:
            s[name] = float(f.arch_key("rope.scaling." + key))
    return s
