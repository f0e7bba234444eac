"""RoPE scalings from transformers configs (``models/rope.py``): linear, llama3, yarn,
longrope (Phi-3's, and as ``su``) and dynamic NTK, each on a tiny random model loaded with
``luminal.models.load``: logits of a prompt longer than the original context against
transformers (rel err <= 1e-4), and 16 greedy tokens equal, which cross the length where
longrope and dynamic NTK switch frequencies."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from luminal.models import load  # noqa: E402
from luminal.models.rope import resolve_scaling  # noqa: E402
from test_zoo_decoders import (  # noqa: E402
    PROMPT,
    VOCAB,
    _rel,
    hf_greedy,
    hf_logits,
    make_hf,
    needs_compiled,
)

LONG = [int(t) for t in np.random.default_rng(1).integers(3, VOCAB, 20)]
ORIG = 16  # the "pretrained" context the scalings extend

# name -> (architecture of test_zoo_decoders, config overrides)
CASES: dict[str, tuple[str, dict]] = {
    "linear": ("qwen2", dict(rope_scaling=dict(rope_type="linear", factor=3.0))),
    "llama3": ("qwen2", dict(rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=ORIG))),
    "yarn": ("qwen3", dict(rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIG, beta_fast=8.0))),
    "longrope": ("phi3", dict(original_max_position_embeddings=ORIG, rope_scaling=dict(
        type="longrope", short_factor=[1.0, 1.3, 1.9, 2.2], long_factor=[1.0, 2.5, 4.0, 7.5]))),
    "su": ("phi3", dict(original_max_position_embeddings=ORIG, partial_rotary_factor=1.0,
                        rope_scaling=dict(type="su", original_max_position_embeddings=ORIG,
                                          short_factor=[1.1 + 0.1 * i for i in range(8)],
                                          long_factor=[1.0 + 0.9 * i for i in range(8)]))),
    "dynamic": ("qwen2", dict(max_position_embeddings=ORIG,
                              rope_scaling=dict(rope_type="dynamic", factor=2.0))),
    # Gemma 3's real configs: linear scaling on the global layers only, local layers plain
    "gemma3_linear": ("gemma3", dict(rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    "llama_yarn": ("llama", dict(rope_scaling=dict(
        rope_type="yarn", factor=2.0, original_max_position_embeddings=ORIG))),
}  # fmt: skip


def _make(case: str, tmp_path):
    arch, over = CASES[case]
    if arch == "llama":
        from test_zoo_decoders import ARCHS

        ARCHS.setdefault("llama", ("LlamaConfig", "LlamaForCausalLM", {}))
    return make_hf(arch, tmp_path, **over)


FAST = ("longrope", "dynamic")  # the two whose tables are expressions of the step's length


@pytest.mark.parametrize(
    "case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
def test_scaled_rope_matches_transformers(case: str, tmp_path) -> None:
    hf = _make(case, tmp_path)
    s = load(tmp_path, backend="interp")
    g = s.model.build(logits="all")
    out = g.run({"tokens": np.asarray(LONG, np.int32), **s.model.new_cache()}, pos=0)
    assert _rel(out["logits"], hf_logits(hf, LONG)) <= 1e-4
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)


@needs_compiled
@pytest.mark.slow
@pytest.mark.parametrize("case", ["longrope", "dynamic"])
def test_length_dependent_rope_compiled(case: str, tmp_path, monkeypatch) -> None:
    """One plan on both sides of the switch: a step's frequencies follow pos + seq."""
    for flag in ("LUMINAL_SEARCH_SCHEDULES", "LUMINAL_SEARCH_LIBRARY", "LUMINAL_EGRAPH",
                 "LUMINAL_SEARCH_BUDGET_S"):  # fmt: skip
        monkeypatch.setenv(flag, "0")
    hf = _make(case, tmp_path)
    s = load(tmp_path, backend="compiled", max_context=32)
    assert _rel(s.forward(PROMPT), hf_logits(hf, PROMPT)[-1]) <= 1e-4
    s.reset()
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)


def test_bad_scalings_are_named() -> None:
    with pytest.raises(NotImplementedError, match="'mrope'.*supported"):
        resolve_scaling({"rope_type": "mrope"}, 64)
    with pytest.raises(ValueError, match="'longrope' needs long_factor"):
        resolve_scaling({"type": "longrope", "short_factor": [1.0],
                         "original_max_position_embeddings": 8}, 64)  # fmt: skip
    s = resolve_scaling({"type": "su", "short_factor": [1.0], "long_factor": [2.0],
                         "original_max_position_embeddings": 8}, 64)  # fmt: skip
    assert s is not None and s["rope_type"] == "longrope" and s["factor"] == 8.0
    assert resolve_scaling({"rope_type": "default", "rope_theta": 1e4}, 64) is None
    from luminal.models.rope import inv_freq

    with pytest.raises(ValueError, match="longrope: 1 long factors for 8 rotated dims"):
        inv_freq(8, 1e4, s, long=True)


@pytest.mark.slow
def test_phi3_longrope_gguf(tmp_path) -> None:
    """Phi-3 LongRoPE from GGUF (factors as ``rope_factors_long`` / ``_short`` tensors, the
    attention factor in ``rope.scaling.attn_factor``), as transformers on both sides of the
    switch."""
    from test_zoo_gguf import write_gguf

    hf = _make("longrope", tmp_path / "hf")
    write_gguf(hf, "phi3", str(tmp_path / "m.gguf"))
    s = load(tmp_path / "m.gguf", backend="interp")
    assert s.config.rope_scaling["rope_type"] == "longrope"
    g = s.model.build(logits="all")
    out = g.run({"tokens": np.asarray(LONG, np.int32), **s.model.new_cache()}, pos=0)
    assert _rel(out["logits"], hf_logits(hf, LONG)) <= 1e-4
    assert s.generate(PROMPT, 16, stop=[]) == hf_greedy(hf, PROMPT, 16)
