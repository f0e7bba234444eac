"""What a warm start skips: a plan made of cached plans (a session's decode and prefill
variants) is cached itself and loaded by the runtime from its file, and depends on the entries
it refers to; a GGUF header is parsed once and checked by its bytes, not its timestamps."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import luminal
from luminal import plan_cache as pc
from luminal.plan import FileWeight, Plan, by_dim


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "plans"
    monkeypatch.setenv("LUMINAL_PLAN_CACHE_DIR", str(d))
    monkeypatch.delenv("LUMINAL_PLAN_CACHE", raising=False)
    return d


def _graph(w: np.ndarray, scale: float) -> luminal.Graph:
    g = luminal.Graph("t")
    x = g.input("x", (luminal.dim("seq", 1, 40), w.shape[0]))
    g.output("y", x.matmul(g.weight("w", data=w)).mul(scale))
    return g


def test_a_plan_of_cached_plans_depends_on_their_weights_files() -> None:
    """Variants merged from two cached plans keep referring to those plans' weights files
    (nothing copied); the merged entry lists those files, so rebuilding one of the parts
    drops the merged entry instead of running it on other bytes."""
    w = np.random.default_rng(0).standard_normal((9, 2000)).astype(np.float32)  # 72 KB
    cache = pc.PlanCache()
    parts = []
    for scale in (2.0, 3.0):
        g = _graph(w, scale)
        key = pc.make_key(pc.graph_fingerprint(g), "cpu", {"scale": scale})
        path, _ = cache.get_or_build(
            key, lambda g=g: luminal.compile(g, search=False, cache=False).plan
        )
        parts.append((key, path))
    assert all(p.with_suffix(".weights").exists() for _, p in parts)
    mkey = pc.make_key({"variants_of": [p.name for _, p in parts]}, "cpu")
    merged, _ = cache.get_or_build(mkey, lambda: by_dim([Plan.load(p) for _, p in parts],
                                                        "seq", [1, 8]))  # fmt: skip
    assert not merged.with_suffix(".weights").exists()
    refs = {w.path for w in Plan.load(merged).weights if isinstance(w, FileWeight)}
    assert refs == {p.with_suffix(".weights").name for _, p in parts}
    meta = json.loads(merged.with_suffix(".json").read_text())
    assert sorted(f["path"] for f in meta["files"]) == sorted(
        os.path.realpath(p.with_suffix(".weights")) for _, p in parts
    )
    ex = luminal.runtime.Executor(merged)
    x = np.random.default_rng(1).standard_normal((12, 9)).astype(np.float32)
    for n, scale in ((5, 2.0), (12, 3.0)):  # seq < 8: the first variant, else the second
        np.testing.assert_allclose(ex.run({"x": x[:n]})["y"], scale * x[:n] @ w, rtol=1e-4,
                                   atol=1e-4)  # fmt: skip
    del ex
    assert cache.lookup(mkey) == merged
    # the second part is rebuilt (its entry dropped and compiled again): new weights file
    key2, p2 = parts[1]
    cache._remove(key2.digest, "test")
    g = _graph(w, 3.0)
    cache.get_or_build(key2, lambda: luminal.compile(g, search=False, cache=False).plan)
    assert cache.lookup(mkey) is None and not merged.exists()


def test_warm_llama_session_parses_no_plan_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second session of the same model loads its decode+prefill plan from the plan cache
    straight into the runtime: no plan is parsed, merged or serialized in Python, and it
    computes what the first session computed."""
    from luminal.models.base import DictWeights
    from luminal.models.llama import Llama, LlamaConfig, LlamaSession

    monkeypatch.setenv("LUMINAL_SEARCH_BUDGET_S", "0")  # the default kernels: a quick compile
    rng = np.random.default_rng(0)
    cfg = LlamaConfig(vocab_size=53, hidden_size=16, intermediate_size=24, n_layers=1,
                      n_heads=2, n_kv_heads=1, head_dim=8, context_length=24)  # fmt: skip
    shapes = {"token_embd.weight": (53, 16), "output_norm.weight": (16,),
              "blk.0.attn_norm.weight": (16,), "blk.0.ffn_norm.weight": (16,),
              "blk.0.attn_q.weight": (16, 16), "blk.0.attn_k.weight": (8, 16),
              "blk.0.attn_v.weight": (8, 16), "blk.0.attn_output.weight": (16, 16),
              "blk.0.ffn_gate.weight": (24, 16), "blk.0.ffn_up.weight": (24, 16),
              "blk.0.ffn_down.weight": (16, 24)}  # fmt: skip
    ws = {k: (rng.standard_normal(s) * 0.3 + (len(s) == 1)).astype(np.float32)
          for k, s in shapes.items()}  # fmt: skip
    ids = [3, 9, 27, 1, 44, 8]

    def run() -> tuple[LlamaSession, list[np.ndarray]]:
        s = LlamaSession(Llama(cfg, DictWeights(ws)), "compiled", prefill_min=4)
        assert s.compile_prefill()
        return s, [s.forward(ids), s.forward([5]), s.forward([2, 7])]

    cold, want = run()
    assert cold.runner.compiles == 1 and cold.prefill_runner is not None
    assert cold.prefill_runner.compiles == 1

    def no_python_plans(*a: object, **k: object) -> None:
        raise AssertionError("a warm start parsed, merged or serialized a plan in Python")

    with monkeypatch.context() as m:
        for name in ("load", "from_bytes", "parts", "to_bytes"):
            m.setattr(Plan, name, no_python_plans)
        m.setattr("luminal.plan.by_dim", no_python_plans)
        warm, got = run()
    assert warm.runner.cached and warm.prefill_runner is not None
    assert warm.prefill_runner.cached
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the merged plan is still there to look at
    assert warm.plan.metadata["variants"] == "seq: [1, 4), [4, 25)"


def _write_gguf(path: Path, name: str) -> None:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", name)
    w.add_array("tokenizer.ggml.tokens", ["a", "bc", "déf", name])
    w.add_array("tokenizer.ggml.token_type", [1, 3, 1, 1])
    w.add_float32("llama.rope.freq_base", 10000.5)
    w.add_tensor("output_norm.weight", np.arange(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_header_is_parsed_once_and_checked_by_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from luminal.loaders.gguf import GGUFFile

    parsed: list[int] = []
    real = GGUFFile._parse_header

    def counting(self: GGUFFile, *a: object) -> object:
        parsed.append(1)
        return real(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(GGUFFile, "_parse_header", counting)
    p = tmp_path / "m.gguf"
    _write_gguf(p, "one")
    first = GGUFFile(p)
    again = GGUFFile(p)
    assert len(parsed) == 1  # the second open read the header cache
    assert again.metadata_types == first.metadata_types
    for k, v in first.metadata.items():
        got = again.metadata[k]
        if isinstance(v, np.ndarray):
            assert got.dtype == v.dtype and np.array_equal(got, v), k
        else:
            assert got == v and type(got) is type(v), k
    assert again.get("tokenizer.ggml.tokens")[2] == "déf"
    np.testing.assert_array_equal(again.array("output_norm.weight"), np.arange(32))
    del first, again
    # rewritten in place at once: same size, maybe the same timestamps, other header bytes
    st = p.stat()
    _write_gguf(p, "two")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size
    f = GGUFFile(p)
    assert f.get("general.name") == "two" and len(parsed) == 2
    # a damaged cache entry is not used
    (entry,) = (Path(os.environ["LUMINAL_PLAN_CACHE_DIR"]) / "headers").iterdir()
    entry.write_text("{broken")
    assert GGUFFile(p).get("tokenizer.ggml.tokens")[3] == "two" and len(parsed) == 3
    assert entry.exists()
    pc.PlanCache().clear()  # `luminal cache clear` empties it too
    assert not entry.exists()
    monkeypatch.setenv("LUMINAL_PLAN_CACHE", "0")
    GGUFFile(p)
    assert len(parsed) == 4 and not entry.exists()


def test_graphs_built_from_a_gguf_file_are_freed(tmp_path: Path) -> None:
    """The weight source remembers the tensor it built per graph without keeping the graph
    (and the weights a compile folded into it) alive."""
    import gc
    import weakref

    from luminal.loaders.gguf import GGUFFile, GGUFWeights

    p = tmp_path / "m.gguf"
    _write_gguf(p, "one")
    ws = GGUFWeights(GGUFFile(p))
    g = luminal.Graph("g")
    a, b = ws.get(g, "output_norm.weight"), ws.get(g, "output_norm.weight")
    assert a.node is b.node and a.layout == b.layout  # built once per graph
    g.output("y", a.mul(2.0))
    np.testing.assert_allclose(g.run({})["y"], 2 * np.arange(32, dtype=np.float32))
    dead = weakref.ref(g)
    del g, a, b
    gc.collect()
    assert dead() is None


def _write_llama_gguf(path: Path) -> None:
    """A 1-layer Llama in GGUF: Q8_0 projections, an MXFP4 one (no exact numpy fold here),
    F32 norms, a tied Q8_0 embedding."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(3)
    hidden, ffn, vocab = 64, 96, 40
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(32)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    q8, mx = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4

    def mat(name: str, rows: int, cols: int, qtype: Any = q8) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    mat("token_embd.weight", vocab, hidden)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    p = "blk.0."
    for n, r, c in (("attn_q", hidden, hidden), ("attn_k", 32, hidden), ("attn_v", 32, hidden),
                    ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden),
                    ("ffn_down", hidden, ffn)):  # fmt: skip
        mat(p + n + ".weight", r, c)
    mat(p + "ffn_up.weight", ffn, hidden, mx)
    for n in ("attn_norm", "ffn_norm"):
        w.add_tensor(p + n + ".weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_prefill_weights_are_folded_by_numpy_where_exact(tmp_path: Path) -> None:
    """``build_prefill`` takes GGUF weights of formats whose numpy dequantization is the
    graph's, bit for bit, as f32 arrays instead of interpreting their expressions at fold time:
    the same graph values, so the same logits as folding every expression."""
    from luminal.compiler.fold import fold_weights
    from luminal.loaders.gguf import GGUFFile, GGUFWeights
    from luminal.models.llama import Llama, config_from_gguf

    p = tmp_path / "tiny.gguf"
    _write_llama_gguf(p)
    f = GGUFFile(p)
    ws = GGUFWeights(f)
    q = ws.f32("blk.0.attn_q.weight")
    g = luminal.Graph("w")
    g.output("w", ws.get(g, "blk.0.attn_q.weight"))
    assert q is not None and np.array_equal(q, g.run({})["w"])
    assert ws.f32("blk.0.ffn_up.weight") is None  # MXFP4: folded from its expression
    norm = ws.f32("output_norm.weight")
    assert norm is not None and np.shares_memory(norm, f.data)  # f32 in the file: mapped
    model = Llama(config_from_gguf(f), ws, 32)
    real, taken = ws.f32, []

    def counting(name: str) -> np.ndarray | None:
        out = real(name)
        if out is not None:
            taken.append(name)
        return out

    ws.f32 = counting  # type: ignore[method-assign]
    fast = model.build_prefill(4)
    assert "blk.0.attn_q.weight" in taken and "blk.0.ffn_up.weight" not in taken
    assert "token_embd.weight" not in taken  # the tied head stays packed
    slow = fold_weights(model.build(name="llama_prefill", min_seq=4), None,
                        keep=["token_embd.weight"])  # fmt: skip
    ids = np.array([3, 17, 5, 22, 9, 1], np.int32)
    feeds = {"tokens": ids, **model.new_cache()}
    a, b = fast.run(feeds, pos=0), slow.run(feeds, pos=0)
    np.testing.assert_array_equal(a["logits"], b["logits"])
