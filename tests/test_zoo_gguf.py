"""The zoo's decoders from GGUF files: tiny random transformers models written with the
``gguf`` package the way llama.cpp's converter writes them (its tensor-name map, Gemma's
norms stored as 1 + w, experts stacked), loaded with ``luminal.models.load``. F32 files
match transformers (rel err <= 1e-4, 16 greedy tokens); Q8_0 files match the same file
dequantized at load by ``gguf.quants``, packed experts gathered by id included."""

from __future__ import annotations

import math

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from luminal.models import load  # noqa: E402
from test_zoo_decoders import (  # noqa: E402
    PROMPT,
    _rel,
    fast_compile,  # noqa: F401
    hf_greedy,
    hf_logits,
    make_hf,
    needs_compiled,
)

_ARCH = {"qwen3": "QWEN3", "gemma": "GEMMA", "gpt_neox": "GPTNEOX", "gemma2": "GEMMA2",
         "gemma3": "GEMMA3", "phi3": "PHI3", "qwen2_moe": "QWEN2MOE", "qwen3_moe": "QWEN3MOE",
         "mixtral": "LLAMA"}  # fmt: skip


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter reorders Llama-family q/k rows for adjacent-pair RoPE."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(hf, arch: str, path: str, quant: bool = False, f16: bool = False) -> None:
    """What convert_hf_to_gguf.py does for these architectures (F32; Q8_0 for matrices
    whose rows are whole blocks; or F16 matrices)."""
    c = hf.config
    garch = gguf.MODEL_ARCH[_ARCH[arch]]
    name = gguf.MODEL_ARCH_NAMES[garch]
    tmap = gguf.get_tensor_name_map(garch, c.num_hidden_layers)
    w = gguf.GGUFWriter(path, name)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    if arch != "gpt_neox":  # GPT-NeoX has no grouped heads (its converter writes none)
        w.add_head_count_kv(c.num_key_value_heads)
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(hd)
    w.add_value_length(hd)
    rp = c.rope_parameters if isinstance(c.rope_parameters, dict) else {}
    rp = rp.get("full_attention", rp)  # Gemma 3: the global layers' (GGUF keeps one base)
    w.add_rope_freq_base(float(rp.get("rope_theta", 10000.0)))
    if rp.get("partial_rotary_factor", 1.0) != 1.0:
        w.add_rope_dimension_count(int(hd * rp["partial_rotary_factor"]))
    if rp.get("rope_type") == "longrope":  # Phi-3: the factors as tensors
        orig = c.original_max_position_embeddings
        w.add_rope_scaling_orig_ctx_len(orig)
        scale = c.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
        for kind in ("long", "short"):
            w.add_tensor(
                f"rope_factors_{kind}.weight", np.asarray(rp[f"{kind}_factor"], np.float32)
            )
    if arch == "gpt_neox":
        w.add_layer_norm_eps(c.layer_norm_eps)
        w.add_parallel_residual(c.use_parallel_residual)
    else:
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch == "gemma2":
        w.add_sliding_window(c.sliding_window)
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    if arch == "gemma3":
        w.add_sliding_window(c.sliding_window)
    if arch == "mixtral":
        w.add_expert_count(c.num_local_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
    if arch == "qwen3_moe":
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if arch == "qwen2_moe":
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)

    def put(gname: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, np.float32)
        if quant and a.ndim >= 2 and a.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(gname, a.astype(np.float16) if f16 and a.ndim >= 2 else a)

    for k, v in hf.state_dict().items():
        a = v.detach().float().numpy()
        if k.endswith("mlp.experts.gate_up_proj"):  # the converter stacks separate gate / up
            blk = k.split(".")[2]
            half = a.shape[1] // 2
            put(f"blk.{blk}.ffn_gate_exps.weight", a[:, :half])
            put(f"blk.{blk}.ffn_up_exps.weight", a[:, half:])
            continue
        if k.endswith("mlp.experts.down_proj"):
            put(f"blk.{k.split('.')[2]}.ffn_down_exps.weight", a)
            continue
        if k == "lm_head.weight" and c.tie_word_embeddings:
            continue
        gname = tmap.get_name(k, try_suffixes=(".weight", ".bias"))
        assert gname is not None, k
        if arch == "mixtral" and k.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in k else c.num_key_value_heads
            a = _llama_permute(a, heads)
        if arch == "gpt_neox" and gname.endswith(("attn_qkv.weight", "attn_qkv.bias")):
            # per head [q | k | v] -> [all q | all k | all v], as the converter does
            hd = c.hidden_size // c.num_attention_heads
            a = a.reshape(c.num_attention_heads, 3, hd, *a.shape[1:]).swapaxes(0, 1)
            a = a.reshape(3 * c.hidden_size, *a.shape[3:])
        if arch.startswith("gemma") and k.endswith("norm.weight"):
            a = a + 1.0
        if gname.endswith("ffn_gate_inp_shexp.weight"):
            a = a.reshape(-1)  # llama.cpp stores the shared-expert gate as a vector
        put(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(
    "arch", ["qwen3", pytest.param("gemma", marks=pytest.mark.slow),
             pytest.param("gpt_neox", marks=pytest.mark.slow),
             pytest.param("gemma2", marks=pytest.mark.slow),
             pytest.param("gemma3", marks=pytest.mark.slow),
             pytest.param("phi3", marks=pytest.mark.slow),
             pytest.param("qwen2_moe", marks=pytest.mark.slow),
             pytest.param("qwen3_moe", marks=pytest.mark.slow),
             pytest.param("mixtral", marks=pytest.mark.slow)],
)  # fmt: skip
def test_gguf_f32_matches_transformers(arch: str, tmp_path) -> None:
    # what GGUF does not store, as llama.cpp assumes it: Gemma's attention scale head_dim^-0.5,
    # Gemma 3's five local layers per global one and local RoPE base 10000
    extra = {"gemma2": dict(query_pre_attn_scalar=16),
             "gemma3": dict(query_pre_attn_scalar=16, layer_types=None, num_hidden_layers=6,
                            rope_parameters={"full_attention": {"rope_type": "default",
                                                                "rope_theta": 5000.0},
                                             "sliding_attention": {"rope_type": "default",
                                                                   "rope_theta": 10000.0}})
             }.get(arch, {})  # fmt: skip
    # llama.cpp's Gemma always ties its output head
    hf = make_hf(arch, tmp_path / "hf", tied=arch.startswith("gemma"), **extra)
    path = str(tmp_path / "m.gguf")
    write_gguf(hf, arch, path)
    s = load(path, backend="interp")
    assert s.model.config.arch == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[_ARCH[arch]]]
    assert type(s.model).__name__ == "Decoder"  # a llama GGUF with experts included
    g = s.model.build(logits="all")
    out = g.run({"tokens": np.asarray(PROMPT, np.int32), **s.model.new_cache()}, pos=0)
    assert _rel(out["logits"], hf_logits(hf, PROMPT)) <= 1e-4
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)


@pytest.mark.parametrize(
    "backend", ["interp", pytest.param("compiled", marks=[needs_compiled, pytest.mark.slow])]
)
@pytest.mark.usefixtures("fast_compile")
def test_gguf_q8_moe_matches_reference_dequantization(backend: str, tmp_path) -> None:
    hf = make_hf("qwen2_moe", tmp_path / "hf")
    path = str(tmp_path / "q8.gguf")
    write_gguf(hf, "qwen2_moe", path, quant=True)
    ref = load(path, backend="interp", dequant="load")  # gguf.quants' f32 values
    s = load(path, backend=backend, max_context=32)
    want = [ref.forward(PROMPT[:5])] + [ref.forward([t]) for t in PROMPT[5:8]]
    got = [s.forward(PROMPT[:5])] + [s.forward([t]) for t in PROMPT[5:8]]
    assert _rel(np.stack(got), np.stack(want)) <= 1e-4
    # and close to the f32 model (Q8_0 keeps ~2-3 significant digits)
    assert _rel(got[0], hf_logits(hf, PROMPT[:5])[-1]) <= 5e-2


def test_gguf_f16_matches_transformers_on_rounded_weights(tmp_path) -> None:
    """F16 GGUF matrices are cast to f32 in the graph: equal to transformers in f32 on the
    same f16-rounded weights."""
    torch = pytest.importorskip("torch")
    hf = make_hf("qwen3", tmp_path / "hf")
    path = str(tmp_path / "f16.gguf")
    write_gguf(hf, "qwen3", path, f16=True)
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim >= 2:
                p.copy_(p.half().float())
    s = load(path, backend="interp")
    assert s.model.weights.file.type_name("blk.0.attn_q.weight") == "F16"
    assert _rel(s.forward(PROMPT), hf_logits(hf, PROMPT)[-1]) <= 1e-4


def write_gpt_oss_gguf(hf, path: str) -> None:
    """GPT-OSS as llama.cpp's converter writes it: separate gate / up expert matrices (the
    interleaved columns split, (out, in) layout) with biases, MXFP4 experts and Q8_0 attention
    projections (its MXFP4_MOE type), attention sinks, YaRN metadata. The model's quantized
    weights are set to their dequantized values (the reference)."""
    torch = pytest.importorskip("torch")
    c = hf.config
    mx = gguf.GGMLQuantizationType.MXFP4
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, c.num_hidden_layers)
    w = gguf.GGUFWriter(path, "gpt-oss")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.intermediate_size)
    rp = c.rope_parameters
    w.add_rope_freq_base(float(rp["rope_theta"]))
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(float(rp["factor"]))
    w.add_rope_scaling_orig_ctx_len(int(rp["original_max_position_embeddings"]))

    def mxfp4(name: str, a: np.ndarray) -> np.ndarray:
        q = gguf.quants.quantize(np.ascontiguousarray(a, np.float32), mx)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=mx)
        return gguf.quants.dequantize(q, mx).reshape(a.shape)

    for k, v in hf.state_dict().items():
        a = v.detach().float().numpy()
        blk = k.split(".")[2] if k.startswith("model.layers.") else ""
        if k.endswith("mlp.experts.gate_up_proj"):  # (E, in, 2 ff), gate/up interleaved
            t = a.swapaxes(1, 2)
            deq = np.empty_like(t)
            deq[:, 0::2] = mxfp4(f"blk.{blk}.ffn_gate_exps.weight", t[:, 0::2])
            deq[:, 1::2] = mxfp4(f"blk.{blk}.ffn_up_exps.weight", t[:, 1::2])
            v.copy_(torch.from_numpy(deq.swapaxes(1, 2)))
        elif k.endswith("mlp.experts.gate_up_proj_bias"):
            w.add_tensor(f"blk.{blk}.ffn_gate_exps.bias", np.ascontiguousarray(a[:, 0::2]))
            w.add_tensor(f"blk.{blk}.ffn_up_exps.bias", np.ascontiguousarray(a[:, 1::2]))
        elif k.endswith("mlp.experts.down_proj"):  # (E, ff, hidden)
            deq = mxfp4(f"blk.{blk}.ffn_down_exps.weight", a.swapaxes(1, 2))
            v.copy_(torch.from_numpy(deq.swapaxes(1, 2)))
        elif k.endswith("mlp.experts.down_proj_bias"):
            w.add_tensor(f"blk.{blk}.ffn_down_exps.bias", a)
        elif k.endswith("_proj.weight") and "self_attn" in k:  # Q8_0, as llama.cpp's MXFP4_MOE
            q8 = gguf.GGMLQuantizationType.Q8_0
            q = gguf.quants.quantize(np.ascontiguousarray(a), q8)
            w.add_tensor(tmap.get_name(k, try_suffixes=(".weight",)), q, raw_shape=q.shape,
                         raw_dtype=q8)  # fmt: skip
            v.copy_(torch.from_numpy(gguf.quants.dequantize(q, q8).reshape(a.shape)))
        else:
            gname = tmap.get_name(k, try_suffixes=(".weight", ".bias"))
            assert gname is not None, k
            w.add_tensor(gname if gname.endswith((".weight", ".bias")) else gname + ".weight", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(
    "backend", ["interp", pytest.param("compiled", marks=[needs_compiled, pytest.mark.slow])]
)
@pytest.mark.usefixtures("fast_compile")
def test_gguf_gpt_oss_mxfp4_experts(backend: str, tmp_path) -> None:
    """A GPT-OSS GGUF with MXFP4 experts (gathered by id as packed blocks): logits and 16
    greedy tokens equal transformers running the same MXFP4-rounded experts."""
    hf = make_hf("gpt_oss", tmp_path / "hf", intermediate_size=64)
    path = str(tmp_path / "oss.gguf")
    write_gpt_oss_gguf(hf, path)
    s = load(path, backend=backend, max_context=32)
    assert type(s.model).__name__ == "GptOss" and s.model.config.layer_types == ["sliding", "full"]
    assert s.model.weights.file.type_name("blk.0.ffn_down_exps.weight") == "MXFP4"
    assert s.model.weights.file.type_name("blk.1.attn_q.weight") == "Q8_0"
    ref = hf_logits(hf, PROMPT)
    if backend == "interp":
        g = s.model.build(logits="all")
        out = g.run({"tokens": np.asarray(PROMPT, np.int32), **s.model.new_cache()}, pos=0)
        assert _rel(out["logits"], ref) <= 1e-4
    else:
        assert _rel(s.forward(PROMPT), ref[-1]) <= 1e-4
        s.reset()
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)


@pytest.mark.parametrize(
    "backend", ["interp", pytest.param("compiled", marks=[needs_compiled, pytest.mark.slow])]
)
@pytest.mark.usefixtures("fast_compile")
def test_gguf_moe_step_reads_only_routed_packed_experts(backend: str, tmp_path) -> None:
    """Every byte of each expert a one-token step does not route to is 0xFF in the file
    (MXFP4 blocks of scale 2^127 and code -6: -inf when decoded): the logits still match, so
    the step gathered only its routed experts' packed blocks."""
    hf = make_hf("gpt_oss", tmp_path / "hf", intermediate_size=64)
    routed: dict[int, set[int]] = {}
    for i, layer in enumerate(hf.model.layers):
        layer.mlp.router.register_forward_hook(
            lambda m, a, out, i=i: routed.__setitem__(i, set(out[2].flatten().tolist()))
        )
    path = str(tmp_path / "oss.gguf")
    write_gpt_oss_gguf(hf, path)
    ref = hf_logits(hf, [7])[-1]
    reader = gguf.GGUFReader(path)
    spans = {t.name: (int(t.data_offset), int(t.n_bytes)) for t in reader.tensors}
    del reader
    with open(path, "r+b") as fh:
        for i, used in routed.items():
            unused = sorted(set(range(4)) - used)
            assert unused  # top-2 of 4 experts
            for kind in ("gate", "up", "down"):
                start, size = spans[f"blk.{i}.ffn_{kind}_exps.weight"]
                per = size // 4
                for e in unused:
                    fh.seek(start + e * per)
                    fh.write(b"\xff" * per)
    got = load(path, backend=backend, max_context=16).forward([7])
    assert np.isfinite(got).all() and _rel(got, ref) <= 1e-4


def test_gguf_gpt2_matches_transformers(tmp_path) -> None:
    """GPT-2 from GGUF as llama.cpp's converter writes it (Conv1D weights transposed to
    (out, in), the output head a copy of the token embedding; F16 matrices)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if ".ln_" in n:
                p.normal_(1.0 if n.endswith("weight") else 0.0, 0.3)
            elif n.endswith("bias"):
                p.normal_(0, 0.3)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, 2)
    path = str(tmp_path / "gpt2.gguf")
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(256)
    w.add_head_count(4)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    for k, v in hf.state_dict().items():
        if k.endswith((".attn.bias", ".attn.masked_bias")) or k == "lm_head.weight":
            continue
        a = v.numpy()
        if k.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            a = np.ascontiguousarray(a.T).astype(np.float16)
            v.copy_(torch.from_numpy(a.T.astype(np.float32)))  # the reference rounds too
        name = tmap.get_name(k, try_suffixes=(".weight", ".bias"))
        w.add_tensor(name, a)
        if name == "token_embd.weight":
            w.add_tensor("output.weight", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = load(path, backend="interp")
    assert type(s.model).__name__ == "GPT2"
    with pytest.raises(ValueError, match="gpt2: this model takes no images"):
        s.generate(PROMPT, 1, images=np.zeros((1, 3, 8, 8), np.float32))
    g = s.model.build(logits="all")
    out = g.run({"tokens": np.asarray(PROMPT, np.int32), **s.model.new_cache()}, pos=0)
    assert _rel(out["logits"], hf_logits(hf, PROMPT)) <= 1e-4
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)
