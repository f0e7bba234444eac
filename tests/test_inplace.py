"""Outputs that update an input in place (``g.output(name, t, updates=input)``): the graph
API's checks, the lowering (no copy kernel; a copy again when the old value is read after the
write), the plan's alias field in both readers, the runtime writing the caller's array, and
the KV caches of the Llama graph."""

from __future__ import annotations

import os
import struct
import subprocess
import zlib

import numpy as np
import pytest

import luminal as lm
import optest
from luminal import runtime
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym
from luminal.graph.ops import Op
from luminal.graph.view import idx_vars
from luminal.plan import KernelFormat, Launch, Plan, PlanError, Role
from luminal.tensor import Tensor

CTX, WIDTH = 37, 13


def _rows(g: lm.Graph, seq, pos) -> Tensor:
    return Tensor(
        g.add_op(Op.IOTA, [], arg=sym.add(pos, idx_vars((seq,))[0]), shape=(seq,), dtype=dt.i32)
    )


def cache_graph(old_read: str | None = None) -> lm.Graph:
    """cache[pos:pos+seq] = 2x + 1 in place; ``s`` sums the updated rows 0..pos+seq-1.
    ``old_read``: also output exp(old cache).sum(0), declared "before" or "after" the update."""
    g = lm.Graph("inplace")
    seq, pos = sym.dim("seq", 1, CTX), sym.dim("pos", 0, CTX - 1)
    x = g.input("x", (seq, WIDTH))
    cache = g.input("cache", (CTX, WIDTH))
    new = x.mul(2.0).add(1.0)
    upd = Tensor(g.add_op(Op.SCATTER, [cache.edge, _rows(g, seq, pos).edge, new.edge]))
    if old_read == "before":
        g.output("old", cache.exp().sum(0))
    g.output("cache_new", upd, updates="cache")
    if old_read == "after":
        g.output("old", cache.exp().sum(0))
    g.output("s", upd.slice(0, 0, sym.add(pos, seq)).sum(0))
    return g


def _kernel_names(plan: Plan) -> list[str]:
    return [k.name for k in plan.kernels]


def _alias_of(plan: Plan, name: str) -> int | None:
    return plan.buffers[plan.buffer_id(name)].alias


@pytest.fixture(scope="module")
def compiled() -> tuple[lm.Graph, object]:
    g = cache_graph()
    return g, lm.compile(g)


def test_scatter_updates_the_callers_array(compiled) -> None:
    g, cg = compiled
    plan = cg.plan
    assert not any("copy" in n or n.endswith("_out") for n in _kernel_names(plan))
    assert _alias_of(plan, "cache_new") == plan.buffer_id("cache")
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((CTX, WIDTH)).astype(np.float32)
    want = cache.copy()
    # one plan, every (seq, pos): a prefill then single-row steps
    for seq, pos in ((5, 0), (1, 5), (3, 6), (1, 9)):
        x = rng.standard_normal((seq, WIDTH)).astype(np.float32)
        ref = g.run({"x": x, "cache": want}, pos=pos)
        out = cg.run({"x": x, "cache": cache}, pos=pos)
        assert out["cache_new"] is cache  # no new array: the input was written
        np.testing.assert_array_equal(cache, ref["cache_new"])
        np.testing.assert_allclose(out["s"], ref["s"], rtol=1e-5, atol=1e-5)
        want = ref["cache_new"]
    # the reload test (test_plans_fresh_process) runs this plan again in a new process
    k = len(optest.MANIFEST)
    plan_path = os.path.join(optest.PLAN_DIR, f"{k:05d}_inplace.lmp")
    data_path = os.path.join(optest.PLAN_DIR, f"{k:05d}.npz")
    cg.save(plan_path)
    x = rng.standard_normal((4, WIDTH)).astype(np.float32)
    ref = g.run({"x": x, "cache": want}, pos=11)
    np.savez(data_path, **{"in.x": x, "in.cache": want},
             **{f"out.{n}": a for n, a in ref.items()})  # fmt: skip
    optest.MANIFEST.append((plan_path, data_path, {"seq": 4, "pos": 11}))


def test_staged_backend_writes_back_in_place(compiled) -> None:
    g, cg = compiled
    ex = runtime.load(cg.plan, "cpu-staged")
    cache = np.arange(CTX * WIDTH, dtype=np.float32).reshape(CTX, WIDTH) / 100
    x = np.full((2, WIDTH), 0.5, np.float32)
    ref = g.run({"x": x, "cache": cache.copy()}, pos=30)
    out = ex.run({"x": x, "cache": cache}, pos=30)
    assert out["cache_new"] is cache
    np.testing.assert_array_equal(cache, ref["cache_new"])
    np.testing.assert_allclose(out["s"], ref["s"], rtol=1e-5)


def test_old_value_read_after_the_write_falls_back_to_a_copy() -> None:
    rng = np.random.default_rng(1)
    for order in ("before", "after"):
        g = cache_graph(order)
        cg = lm.compile(g)
        aliased = _alias_of(cg.plan, "cache_new") is not None
        # in place only where every read of the old cache runs before the scatter
        k = _kernel_names(cg.plan)
        assert aliased != any(n.endswith("_scatter_copy") for n in k), (order, k)
        cache = rng.standard_normal((CTX, WIDTH)).astype(np.float32)
        x = rng.standard_normal((3, WIDTH)).astype(np.float32)
        ref = g.run({"x": x, "cache": cache.copy()}, pos=7)
        out = cg.run({"x": x, "cache": cache}, pos=7)
        assert (out["cache_new"] is cache) == aliased
        for n in ref:
            np.testing.assert_allclose(out[n], ref[n], rtol=1e-5, atol=1e-5, err_msg=n)
        if not aliased:
            assert not np.array_equal(cache, ref["cache_new"])  # the input was left alone


def test_output_updates_is_checked() -> None:
    g = lm.Graph("bad")
    seq, pos = sym.dim("seq", 1, CTX), sym.dim("pos", 0, CTX - 1)
    x = g.input("x", (seq, WIDTH))
    cache = g.input("cache", (CTX, WIDTH))
    g.input("half", (CTX, WIDTH), dt.f16)
    g.weight("w", data=np.zeros((CTX, WIDTH), np.float32))
    rows = _rows(g, seq, pos)
    upd = Tensor(g.add_op(Op.SCATTER, [cache.edge, rows.edge, x.edge]))
    via_view = Tensor(g.add_op(Op.SCATTER, [cache.mul(1.0).edge, rows.edge, x.edge]))
    cases = [
        ("a", upd, "nope", "has no input 'nope'"),
        ("b", upd, "w", "has no input 'w'"),  # a weight is not an input the caller owns
        ("c", upd, "half", "f32.* but the input is f16"),
        ("d", upd, "x", r"but the input is f32\(seq, 13\)"),
        ("e", cache.mul(2.0), "cache", "must be a SCATTER into the input"),
        ("f", upd.mul(1.0), "cache", "must be a SCATTER into the input"),
        ("g", via_view, "cache", "must write into input 'cache' itself"),
    ]
    for name, t, target, msg in cases:
        with pytest.raises(ValueError, match=rf"output '{name}' \(updates='{target}'\): .*{msg}"):
            g.output(name, t, updates=target)
    assert not g.outputs and not g.state
    g.output("ok", upd, updates="cache")
    with pytest.raises(ValueError, match="another output already updates 'cache'"):
        g.output("again", upd, updates="cache")
    assert g.state == {"ok": "cache"}


def test_in_place_input_must_be_a_writable_contiguous_array(compiled) -> None:
    _, cg = compiled
    x = np.ones((2, WIDTH), np.float32)
    ro = np.zeros((CTX, WIDTH), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="'cache' is updated in place .* read-only"):
        cg.run({"x": x, "cache": ro}, pos=0)
    with pytest.raises(ValueError, match="not a non-contiguous array"):
        cg.run({"x": x, "cache": np.zeros((WIDTH, CTX), np.float32).T}, pos=0)
    with pytest.raises(ValueError, match="not list"):
        cg.run({"x": x, "cache": np.zeros((CTX, WIDTH), np.float32).tolist()}, pos=0)
    assert cg.executor.updates == {"cache_new": "cache"}


def test_alias_survives_save_load_and_luminal_run(compiled, tmp_path) -> None:
    g, cg = compiled
    path = tmp_path / "p.lmp"
    cg.save(path)
    q = Plan.load(path)
    assert _alias_of(q, "cache_new") == q.buffer_id("cache")
    assert "cache_new [37, 13] 1924 bytes in place of input cache" in q.describe()
    assert q.to_bytes() == cg.plan.to_bytes()
    ex = runtime.load(path)  # the C++ reader
    assert ex.updates == {"cache_new": "cache"}
    cache = np.zeros((CTX, WIDTH), np.float32)
    x = np.ones((3, WIDTH), np.float32)
    ref = g.run({"x": x, "cache": cache.copy()}, pos=2)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "cache.npy", cache)
    proc = subprocess.run(
        [str(runtime.luminal_run_path()), str(path), "--input", f"x={tmp_path / 'x.npy'}",
         "--input", f"cache={tmp_path / 'cache.npy'}", "--dim", "pos=2", "--out",
         str(tmp_path / "o")], capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "cache_new.npy"), ref["cache_new"])
    np.testing.assert_allclose(np.load(tmp_path / "o" / "s.npy"), ref["s"], rtol=1e-5)


SCALE_INTO = r"""
#include <stdint.h>
void scale_into(void *const *args, const int64_t *dims, int64_t begin, int64_t end) {
  float *y = args[0];
  for (int64_t i = begin; i < end; ++i) y[i] *= 3.0f;
}
"""


def _alias_plan(alias_of_y: int | None = 0, y_shape: tuple = (6,), y_dtype: str = "f32") -> Plan:
    """y (output) = 3 * x in place of input x (buffer 0)."""
    p = Plan()
    p.add_buffer("x", "f32", Role.input, (6,))
    p.add_buffer("w", "f32", Role.weight, (6,))
    y = p.add_buffer("y", y_dtype, Role.output, y_shape, alias=alias_of_y)
    k = p.add_kernel("scale_into", KernelFormat.c_source, "scale_into", SCALE_INTO)
    p.steps.append(Launch(k, [y], grid=(6, 1, 1)))
    from luminal.plan import InlineWeight

    p.weights.append(InlineWeight(1, np.zeros(6, np.float32)))
    return p


def _patch_alias(data: bytes, old: int, new: int) -> bytes:
    """Rewrites buffer y's alias field (the last u32 of its record) and reseals the file."""
    rec = b"\x01\x00\x00\x00y"
    at = data.index(rec)
    # name, dtype, role, rank 1, shape id, nbytes id, offset NONE, then alias
    pos = at + len(rec) + 3 + 4 + 4 + 4
    assert struct.unpack("<I", data[pos : pos + 4])[0] == old
    b = bytearray(data)
    b[pos : pos + 4] = struct.pack("<I", new)
    b[24:28] = struct.pack("<I", zlib.crc32(bytes(b[32:])))
    return bytes(b)


def test_plan_alias_validation_in_both_readers() -> None:
    good = _alias_plan().to_bytes()
    ex = runtime.load(good)
    x = np.arange(6, dtype=np.float32)
    assert ex.run({"x": x})["y"] is x and x.tolist() == [0, 3, 6, 9, 12, 15]
    for new, msg in ((1, "not an input buffer"), (2, "not an input buffer"),
                     (9, "not an input buffer")):  # fmt: skip
        bad = _patch_alias(good, 0, new)
        with pytest.raises(PlanError, match=msg):
            Plan.from_bytes(bad)
        with pytest.raises(PlanError, match=msg):
            runtime.load(bad)
    for kw in ({"y_shape": (7,)}, {"y_dtype": "i32"}):
        with pytest.raises(PlanError, match="different dtype/shape/size"):
            _alias_plan(**kw).to_bytes()
        bad = _patch_alias(_alias_plan(None, **kw).to_bytes(), 0xFFFFFFFF, 0)
        with pytest.raises(PlanError, match="different dtype/shape/size"):
            Plan.from_bytes(bad)
        with pytest.raises(PlanError, match="different dtype/shape/size"):
            runtime.load(bad)


def _as_version_1(data: bytes) -> bytes:
    """A version 2 plan without aliases rewritten in the version 1 layout (no alias field)."""
    p = Plan.from_bytes(data)
    assert all(b.alias is None for b in p.buffers)
    b = bytearray(data)
    for buf in p.buffers:  # drop each record's trailing NONE alias field
        rec = struct.pack("<I", len(buf.name.encode())) + buf.name.encode()
        at = b.index(rec)
        pos = at + len(rec) + 3 + 4 * len(buf.shape) + 8
        assert b[pos : pos + 4] == b"\xff\xff\xff\xff"
        del b[pos : pos + 4]
    body_end = len(b) - (len(data) - int(struct.unpack("<Q", data[16:24])[0]))
    # keep the blob where it was: pad the body back to blob_offset
    b[body_end:body_end] = bytes(4 * len(p.buffers))
    b[4:8] = struct.pack("<I", 1)
    b[24:28] = struct.pack("<I", zlib.crc32(bytes(b[32:])))
    return bytes(b)


def test_version_1_plans_still_load() -> None:
    v2 = _alias_plan(None).to_bytes()
    v1 = _as_version_1(v2)
    assert struct.unpack("<I", v1[4:8])[0] == 1 and len(v1) == len(v2)
    p = Plan.from_bytes(v1)
    assert [b.name for b in p.buffers] == ["x", "w", "y"] and p.buffers[2].alias is None
    x = np.arange(6, dtype=np.float32)
    out = runtime.load(v1).run({"x": x})
    assert out["y"] is not x  # no alias: y is its own (uninitialized, then scaled) array


# ----------------------------------------------------------------------------- Llama KV cache
def _cache_kernels(plan: Plan) -> list[str]:
    """Kernels that copy a whole cache: scatter copies, and copies of a cache into an output."""
    cache_outs = {i for i, b in enumerate(plan.buffers) if "_cache_" in b.name}
    names = []
    for s in plan.steps:
        if isinstance(s, Launch):
            name = plan.kernels[s.kernel].name
            if name.endswith("_scatter_copy") or (
                name.endswith("_out") and s.args[0] in cache_outs
            ):
                names.append(name)
    return names


def _check_llama_plan(model, plan: Plan) -> None:
    assert _cache_kernels(plan) == []
    # one scatter step per cache (identical layers' scatters share one kernel's code)
    launches = [s for s in plan.steps if isinstance(s, Launch)]
    scatters = [s for s in launches if plan.kernels[s.kernel].name.endswith("_scatter")]
    assert len(scatters) == len(model.cache_names())
    assert {plan.buffers[s.args[0]].name for s in scatters} >= set(model.state)
    for out, inp in model.state.items():
        assert _alias_of(plan, out) == plan.buffer_id(inp), out


def test_llama_decode_updates_caches_in_place() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from luminal.models import LlamaSession  # noqa: I001 (test helpers first, as in conftest)
    from test_models_llama import _hf_logits, _tiny

    hf, model = _tiny(ctx=40)
    s = LlamaSession(model, "compiled")
    _check_llama_plan(model, s.runner._plan.plan)
    ids = [5, 17, 3, 42, 8, 60, 1]
    arrays = {n: id(a) for n, a in s.cache.items()}
    got = [s.forward(ids[:4])] + [s.forward([t]) for t in ids[4:]]
    # the session's cache arrays are the ones it made: written in place, never replaced
    assert {n: id(a) for n, a in s.cache.items()} == arrays
    np.testing.assert_allclose(np.stack(got), _hf_logits(hf, ids)[3:], atol=1e-3, rtol=1e-3)


@pytest.mark.slow
def test_smollm2_plan_has_no_cache_copies() -> None:
    pytest.importorskip("gguf")
    from luminal.models import load_gguf, smollm2_path

    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model, _ = load_gguf(path, max_context=64)
    g = model.build()
    assert g.state == model.state
    cg = lm.compile(g)
    _check_llama_plan(model, cg.plan)
    cache = model.new_cache()
    toks = np.array([1, 2, 3], np.int32)
    out = cg.run({"tokens": toks, **cache}, pos=0)
    assert all(out[n + "_new"] is cache[n] for n in cache)
    assert any(np.any(cache[n][:3]) for n in cache) and not any(np.any(cache[n][3:]) for n in cache)
