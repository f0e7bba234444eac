"""luminal's own CPU GEMM (the ``pgemm`` library call, csrc/cpu/pgemm.cpp) against numpy, over
its schedule fields (micro-tile height, rows per task, depth per pass, packing once or per
run), transposes, batches, strides, alpha and beta, at odd sizes; its portable path; bf16 and
f16 operands (pgemm and the OpenBLAS gemm call); its errors; and the search offering it in
place of OpenBLAS."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import luminal as lm
from kernel_cache import use_kernel_cache
from luminal import runtime
from luminal.codegen.cpu.jam import vector_registers
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import BufferInfo, lower
from luminal.compiler.search import select
from luminal.compiler.search.tuner import Tuner
from luminal.plan import FileWeight, InlineWeight, LibCall, Plan, Role
from luminal.targets.cpu import PGEMM_MR, CpuTarget
from test_plan import Sym

NP_DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def rand(*shape: int, seed: int = 0, dtype: str = "f32") -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x.astype(NP_DTYPES[dtype])


def _plan(fields: dict, *, ta: int, tb: int, batch: int, shared_b: bool, weight: bool,
          n: int, k: int, dtype: str = "f32", func: str = "pgemm",
          ) -> tuple[Plan, np.ndarray | None]:  # fmt: skip
    p = Plan()
    p.add_dim("m", 1, 4000)
    m = Sym.dim("m")
    nb = 1 if shared_b else batch
    a = p.add_buffer("a", dtype, Role.input, (batch, k, m) if ta else (batch, m, k))
    bshape = (nb, n, k) if tb else (nb, k, n)
    b = p.add_buffer("b", dtype, Role.weight if weight else Role.input, bshape)
    c = p.add_buffer("c", "f32", Role.output, (batch, m, n))
    bval = None
    if weight:
        bval = rand(*bshape, seed=7, dtype=dtype)
        p.weights.append(InlineWeight(b, bval))
    desc = {"m": m, "n": n, "k": k, "trans_a": ta, "trans_b": tb, "batch": batch,
            "stride_a": m * k, "stride_b": 0 if shared_b else n * k, "stride_c": m * n,
            "alpha": 0.5, **fields}  # fmt: skip
    if ta:
        desc["lda"] = m
    p.steps.append(LibCall(func, desc, [a, b, c]))
    return p, bval


def assert_sum_close(out: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: float) -> None:
    """out = alpha * a @ b up to f32 summation order: against the f64 product of the widened
    operands, each element within 1e-5 * sqrt(k) of its sum of magnitudes."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want, scale = alpha * (a64 @ b64), abs(alpha) * (np.abs(a64) @ np.abs(b64))
    bound = 1e-5 * np.sqrt(a.shape[-1]) * scale + 1e-30
    err = np.abs(out.astype(np.float64) - want)
    assert out.dtype == np.float32 and np.all(err <= bound), float((err / bound).max())


def _check_rows(ex, row_counts, bval, *, ta, tb, batch, nb, n, k, dtype, runs=1) -> None:
    """Runs ``ex`` (c = 0.5 * op(a) @ op(b)) at each row count on random operands (``b`` the
    plan's weight ``bval`` when given), ``runs`` times each, against numpy."""
    for rows in row_counts:
        av = rand(*((batch, k, rows) if ta else (batch, rows, k)), seed=rows, dtype=dtype)
        bv = bval
        if bv is None:
            bv = rand(*((nb, n, k) if tb else (nb, k, n)), seed=rows + 1, dtype=dtype)
        inputs = {"a": av} if bval is not None else {"a": av, "b": bv}
        opa = av.transpose(0, 2, 1) if ta else av
        opb = bv.transpose(0, 2, 1) if tb else bv
        for _ in range(runs):
            assert_sum_close(ex.run(inputs, m=rows)["c"], opa, opb, 0.5)


CASES = [
    # mr, mc, kc, pack, pack_a, ta, tb, batch, shared_b, n, k
    (12, 0, 0, 1, 1, 0, 1, 1, True, 70, 45),
    (12, 0, 0, 1, 0, 0, 1, 1, True, 70, 45),
    (1, 0, 0, 0, 1, 0, 0, 2, False, 33, 17),
    (5, 7, 0, 0, 1, 1, 0, 3, False, 64, 40),
    (14, 30, 16, 1, 1, 0, 1, 2, True, 97, 130),
    (14, 30, 16, 1, 0, 0, 1, 2, False, 97, 130),
    (8, 0, 33, 1, 1, 1, 1, 2, False, 31, 65),
    (6, 12, 0, 0, 0, 0, 1, 1, True, 1, 8),
    (3, 0, 0, 1, 0, 0, 0, 2, True, 300, 3),
    (4, 9, 7, 0, 0, 0, 0, 1, True, 50, 21),
]


@pytest.mark.parametrize("isa", ["native", "portable"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_pgemm_matches_numpy(case: tuple, isa: str, monkeypatch) -> None:
    """Every schedule field and operand layout at row counts that leave short micro-tiles
    and tasks (1, 5, 29, 301), run twice each (a packed weight is reused, not packed again)."""
    monkeypatch.setenv("LUMINAL_PGEMM_ISA", isa)
    mr, mc, kc, pack, pack_a, ta, tb, batch, shared_b, n, k = case
    fields = {"mr": mr, "mc": mc, "kc": kc, "pack": pack, "pack_a": pack_a}
    p, bval = _plan(fields, ta=ta, tb=tb, batch=batch, shared_b=shared_b, weight=bool(pack),
                    n=n, k=k)  # fmt: skip
    ex = runtime.load(p)
    nb = 1 if shared_b else batch
    for rows in (1, 5, 29, 301, 5):
        av = rand(*((batch, k, rows) if ta else (batch, rows, k)), seed=rows)
        bv = bval if bval is not None else rand(*((nb, n, k) if tb else (nb, k, n)), seed=rows + 1)
        inputs = {"a": av} if pack else {"a": av, "b": bv}
        opa = av.transpose(0, 2, 1) if ta else av
        opb = bv.transpose(0, 2, 1) if tb else bv
        for _ in range(2):
            out = ex.run(inputs, m=rows)["c"]
            np.testing.assert_allclose(out, 0.5 * opa @ opb, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("isa", ["native", "portable"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_pgemm_half_matches_numpy(case: tuple, isa: str, dtype: str, monkeypatch) -> None:
    """The same with bf16 or f16 A and B (C f32): bf16 by vdpbf16ps over depth pairs where the
    CPU has it (odd K and kc leave a lone last depth), else widened to f32 while packing."""
    monkeypatch.setenv("LUMINAL_PGEMM_ISA", isa)
    mr, mc, kc, pack, pack_a, ta, tb, batch, shared_b, n, k = case
    fields = {"mr": mr, "mc": mc, "kc": kc, "pack": pack, "pack_a": pack_a}
    p, bval = _plan(fields, ta=ta, tb=tb, batch=batch, shared_b=shared_b, weight=bool(pack),
                    n=n, k=k, dtype=dtype)  # fmt: skip
    ex = runtime.load(p)
    nb = 1 if shared_b else batch
    _check_rows(ex, (1, 5, 29, 301, 5), bval, ta=ta, tb=tb, batch=batch, nb=nb, n=n, k=k,
                dtype=dtype, runs=2)  # fmt: skip


SWAP_CASES = [
    # mr, mc, kc, pack, pack_a, tb, batch, c_columns (C's matrices side by side: one product)
    (12, 0, 0, 1, 0, 1, 3, False),
    (12, 0, 0, 1, 1, 0, 3, False),
    (5, 7, 16, 1, 0, 1, 2, True),
    (4, 0, 33, 0, 1, 0, 2, True),
    (1, 0, 0, 0, 0, 1, 1, False),
    (14, 30, 0, 1, 1, 1, 2, False),
]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("isa", ["native", "portable"])
@pytest.mark.parametrize("case", SWAP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_pgemm_swap_matches_numpy(case: tuple, isa: str, dtype: str, monkeypatch) -> None:
    """``swap`` 1 (the product run as C^T = op(B)^T @ op(A)^T, C stored transposed) for a
    weight on the left shared by a batch (a convolution: W @ patches): C's matrices apart (one
    product per matrix) or side by side in its rows (one product of batch * n rows), with beta
    adding to C across depth passes, at pixel counts that leave short tiles."""
    monkeypatch.setenv("LUMINAL_PGEMM_ISA", isa)
    mr, mc, kc, pack, pack_a, tb, batch, c_columns = case
    m_, k_ = 37, 45
    p = Plan()
    p.add_dim("n", 1, 4000)
    n = Sym.dim("n")
    wv = rand(m_, k_, seed=3, dtype=dtype)
    w = p.add_buffer("w", dtype, Role.weight, (m_, k_))
    p.weights.append(InlineWeight(w, wv))
    b = p.add_buffer("b", dtype, Role.input, (batch, n, k_) if tb else (batch, k_, n))
    c = p.add_buffer("c", "f32", Role.input, (m_, batch, n) if c_columns else (batch, m_, n))
    layout = ({"ldc": n * batch, "stride_c": n} if c_columns
              else {"ldc": n, "stride_c": n * m_})  # fmt: skip
    desc = {"m": m_, "n": n, "k": k_, "trans_b": tb, "batch": batch, "stride_a": 0,
            "stride_b": n * k_, "alpha": 0.5, "beta": 0.25, "mr": mr, "mc": mc, "kc": kc,
            "pack": pack, "pack_a": pack_a, "swap": 1, **layout}  # fmt: skip
    p.steps.append(LibCall("pgemm", desc, [w, b, c]))
    ex = runtime.load(p)
    for cols in (1, 5, 29, 70, 5):
        bv = rand(*((batch, cols, k_) if tb else (batch, k_, cols)), seed=cols, dtype=dtype)
        c0 = rand(*((m_, batch, cols) if c_columns else (batch, m_, cols)), seed=cols + 9)
        for _ in range(2):
            cv = c0.copy()
            ex.run({"b": bv, "c": cv}, n=cols)
            got = cv.transpose(1, 0, 2) if c_columns else cv
            opb = (bv.transpose(0, 2, 1) if tb else bv).astype(np.float64)
            start = (c0.transpose(1, 0, 2) if c_columns else c0).astype(np.float64)
            want = 0.5 * (wv.astype(np.float64) @ opb) + 0.25 * start
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


GEMM_CASES = [
    # ta, tb, batch, shared_b, n, k
    (0, 1, 1, True, 70, 45),
    (0, 0, 2, False, 33, 17),
    (1, 0, 3, False, 64, 40),
    (1, 1, 2, False, 31, 65),
    (0, 1, 3, True, 97, 130),
]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_gemm_half_matches_numpy(case: tuple, dtype: str) -> None:
    """The OpenBLAS ``gemm`` call with bf16 or f16 A and B (widened to f32 on each run, its
    part of the rows or columns per thread), B an input and a weight."""
    ta, tb, batch, shared_b, n, k = case
    nb = 1 if shared_b else batch
    for weight in (False, True):
        p, bval = _plan({}, ta=ta, tb=tb, batch=batch, shared_b=shared_b, weight=weight, n=n,
                        k=k, dtype=dtype, func="gemm")  # fmt: skip
        ex = runtime.load(p)
        _check_rows(ex, (1, 29, 301), bval, ta=ta, tb=tb, batch=batch, nb=nb, n=n, k=k,
                    dtype=dtype)  # fmt: skip


@pytest.mark.parametrize("func", ["gemm", "pgemm"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_operands_inside_larger_buffers(func: str, dtype: str) -> None:
    """Offsets, padded leading dimensions and a batch stepping backwards through B: a widened
    operand covers exactly what its descriptor reads; a second call adds onto C (beta 2)."""
    m_, n_, k_, batch = 37, 45, 23, 3
    lda, ldb, ldc = k_ + 5, n_ + 3, n_ + 1
    av = rand(200 + batch * m_ * lda, dtype=dtype)
    bv = rand(batch * k_ * ldb + 9, seed=1, dtype=dtype)
    p = Plan()
    a = p.add_buffer("a", dtype, Role.input, av.shape)
    b = p.add_buffer("b", dtype, Role.input, bv.shape)
    c = p.add_buffer("c", "f32", Role.output, (batch * m_ * ldc + 4,))
    desc = {"m": m_, "n": n_, "k": k_, "lda": lda, "ldb": ldb, "ldc": ldc, "batch": batch,
            "stride_a": m_ * lda, "stride_b": -k_ * ldb, "stride_c": m_ * ldc, "a_offset": 200,
            "b_offset": (batch - 1) * k_ * ldb + 9, "c_offset": 4, "alpha": 2.0}  # fmt: skip
    if func == "pgemm":
        desc |= {"mr": 5, "kc": 7}
    p.steps.append(LibCall(func, desc, [a, b, c]))
    p.steps.append(LibCall(func, {**desc, "alpha": 1.0, "beta": 2.0}, [a, b, c]))
    got = runtime.load(p).run({"a": av, "b": bv})["c"]
    for i in range(batch):
        am = av[200 + i * m_ * lda :][: m_ * lda].reshape(m_, lda)[:, :k_]
        b0 = (batch - 1 - i) * k_ * ldb + 9
        bm = bv[b0 : b0 + k_ * ldb].reshape(k_, ldb)[:, :n_]
        gm = got[4 + i * m_ * ldc :][: m_ * ldc].reshape(m_, ldc)[:, :n_]
        assert_sum_close(gm, am, bm, 5.0)


def _has_avx512_bf16() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and " avx512_bf16" in cpuinfo.read_text()


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize(
    ("func", "isa"), [("gemm", ""), ("pgemm", "native"), ("pgemm", "portable")]
)
def test_every_finite_half_value_is_widened_exactly(
    func: str, dtype: str, isa: str, monkeypatch
) -> None:
    """A times the identity gives every finite value of the dtype back, subnormals included;
    except that pgemm's bf16 kernel (vdpbf16ps) reads subnormal bf16 inputs as zero."""
    monkeypatch.setenv("LUMINAL_PGEMM_ISA", isa)
    bits = np.arange(1 << 16, dtype=np.uint16)
    vals = bits.view(NP_DTYPES[dtype])
    vals = vals[np.isfinite(vals.astype(np.float32))]
    k_ = 64
    av = vals[: len(vals) // k_ * k_].reshape(-1, k_)
    m_ = av.shape[0]
    p = Plan()
    a = p.add_buffer("a", dtype, Role.input, av.shape)
    b = p.add_buffer("b", dtype, Role.input, (k_, k_))
    c = p.add_buffer("c", "f32", Role.output, (m_, k_))
    fields = {"mr": 7, "pack_a": 0} if func == "pgemm" else {}
    p.steps.append(LibCall(func, {"m": m_, "n": k_, "k": k_, **fields}, [a, b, c]))
    eye = np.eye(k_, dtype=np.float32).astype(NP_DTYPES[dtype])
    got = runtime.load(p).run({"a": av, "b": eye})["c"]
    want = av.astype(np.float32)
    if func == "pgemm" and dtype == "bf16" and isa == "native" and _has_avx512_bf16():
        want = np.where(np.abs(want) < np.finfo(np.float32).tiny, 0, want)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("func", ["gemm", "pgemm"])
@pytest.mark.parametrize(
    ("ta", "tb", "tc"),
    [("f32", "bf16", "f32"), ("bf16", "f16", "f32"), ("bf16", "bf16", "bf16"), ("f16",) * 3],
)
def test_mixed_or_half_output_dtypes_are_refused(func: str, ta: str, tb: str, tc: str) -> None:
    p = Plan()
    a = p.add_buffer("a", ta, Role.input, (4, 4))
    b = p.add_buffer("b", tb, Role.input, (4, 4))
    c = p.add_buffer("c", tc, Role.output, (4, 4))
    p.steps.append(LibCall(func, {"m": 4, "n": 4, "k": 4}, [a, b, c]))
    accepted = (
        "f32 x f32 -> f32, f64 x f64 -> f64 or " if func == "gemm" else "f32 x f32 -> f32 or "
    )
    message = (
        f"step 0 \\({func}\\): takes {accepted}bf16/f16 x the same -> f32, not {ta} x {tb} -> {tc}"
    )
    with pytest.raises(runtime.PlanError, match=message):
        runtime.load(p)


def test_pgemm_beta_adds_to_c() -> None:
    """A second product onto the first's output (beta 2, in passes of kc 7): C is read back."""
    p, bval = _plan({"mr": 4}, ta=0, tb=1, batch=1, shared_b=True, weight=True, n=40, k=20)
    assert bval is not None
    first = p.steps[0]
    p.steps.append(LibCall("pgemm", {**first.fields, "beta": 2.0, "kc": 7}, first.args))
    ex = runtime.load(p)
    av = rand(1, 9, 20)
    once = 0.5 * av @ bval.transpose(0, 2, 1)
    out = ex.run({"a": av}, m=9)["c"]
    np.testing.assert_allclose(out, once + 2 * once, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_pgemm_packed_weight_follows_its_buffer(dtype: str) -> None:
    """``pack`` 1 keeps one packed copy per source buffer: a B given as an input at another
    address (other values) is packed again, the first one's copy found again after it."""
    p, _ = _plan({"pack": 1}, ta=0, tb=0, batch=1, shared_b=True, weight=False, n=48, k=24,
                 dtype=dtype)  # fmt: skip
    ex = runtime.load(p)
    av = rand(1, 6, 24, dtype=dtype)
    b1, b2 = rand(1, 24, 48, seed=1, dtype=dtype), rand(1, 24, 48, seed=2, dtype=dtype)
    for bv in (b1, b2, b1):
        assert_sum_close(ex.run({"a": av, "b": bv}, m=6)["c"], av, bv, 0.5)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_pgemm_packed_copy_covers_a_batch_stepping_back(dtype: str) -> None:
    """With a negative batch stride, B's matrices lie before b_offset: two buffers equal only
    past it are different weights (their fingerprint covers both matrices)."""
    k_, n_ = 24, 40
    p = Plan()
    a = p.add_buffer("a", dtype, Role.input, (2, 5, k_))
    b = p.add_buffer("b", dtype, Role.input, (2, k_, n_))
    c = p.add_buffer("c", "f32", Role.output, (2, 5, n_))
    desc = {"m": 5, "n": n_, "k": k_, "batch": 2, "stride_a": 5 * k_, "stride_b": -k_ * n_,
            "b_offset": k_ * n_, "stride_c": 5 * n_, "pack": 1}  # fmt: skip
    p.steps.append(LibCall("pgemm", desc, [a, b, c]))
    ex = runtime.load(p)
    av = rand(2, 5, k_, dtype=dtype)
    b1 = rand(2, k_, n_, seed=1, dtype=dtype)
    b2 = b1.copy()
    b2[0] = rand(k_, n_, seed=2, dtype=dtype)
    for bv in (b1, b2):
        got = ex.run({"a": av, "b": bv})["c"]
        for i in range(2):
            assert_sum_close(got[i], av[i], bv[1 - i], 1.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"mr": 0}, "'mr' must be 1..14"), ({"mr": 15}, "'mr' must be 1..14"),
     ({"kc": -1}, "'mc' and 'kc' must be >= 0"), ({"pack": 2}, "'pack' must be 0 or 1"),
     ({"pack_a": 3}, "'pack_a' must be 0 or 1"),
     ({"pack_a": 0, "trans_a": 1, "lda": 3}, "'pack_a' 0 needs trans_a 0"),
     ({"swap": 2}, "'swap' must be 0 or 1"),
     ({"swap": 1, "pack_a": 0}, "'pack_a' 0 with 'swap' 1 needs trans_b 1")],
)  # fmt: skip
def test_pgemm_rejects_bad_schedule_fields(fields: dict, message: str) -> None:
    p, _ = _plan(fields, ta=0, tb=0, batch=1, shared_b=True, weight=False, n=8, k=8)
    ex = runtime.load(p)
    with pytest.raises(runtime.PlanError, match=f"step 0 \\(pgemm\\): {message}"):
        ex.run({"a": rand(1, 3, 8), "b": rand(1, 8, 8)}, m=3)


def test_pgemm_refuses_f64_and_unknown_fields() -> None:
    p = Plan()
    a = p.add_buffer("a", "f64", Role.input, (4, 4))
    b = p.add_buffer("b", "f64", Role.input, (4, 4))
    c = p.add_buffer("c", "f64", Role.output, (4, 4))
    p.steps.append(LibCall("pgemm", {"m": 4, "n": 4, "k": 4}, [a, b, c]))
    with pytest.raises(runtime.PlanError, match="pgemm.*not f64 x f64 -> f64"):
        runtime.load(p)
    p.steps[0] = LibCall("pgemm", {"m": 4, "n": 4, "k": 4, "tile": 2}, [a, b, c])
    with pytest.raises(runtime.PlanError, match="unknown descriptor field 'tile'"):
        runtime.load(p)


AVX512 = vector_registers() == 32


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
@pytest.mark.parametrize("weight", [True, False])
def test_search_offers_pgemm_and_packs_only_weights(weight: bool, tmp_path, monkeypatch) -> None:
    """A product by a weight gets pgemm variants packing B once; by an input, packing per run;
    the kept call runs in the plan as the graph computes."""
    use_kernel_cache(monkeypatch, tmp_path)
    g = lm.Graph("mm")
    seq = lm.dim("seq", 1, 4096)
    x = g.input("x", (seq, 64))
    w = g.weight("w", data=rand(48, 64)) if weight else g.input("w", (48, 64))
    g.output("y", ((x @ w.transpose(0, 1)) + 1.0).relu())
    low = lower(g)
    seen = []

    def measure(sub, dims):
        labels = [s.func for s in sub.kernels if isinstance(s, K.LibCall)]
        seen.append(labels)
        mr = next((s.fields["mr"] for s in sub.kernels if isinstance(s, K.LibCall)
                   and s.func == "pgemm"), None)  # fmt: skip
        return 1.0 if mr == PGEMM_MR[-1] else 2.0

    tuner = Tuner(measure, "test", variants=CpuTarget().library_variants)
    chosen = select.choose_library_calls(low, tuner)
    assert ["pgemm"] in seen and ["gemm"] in seen
    (call,) = [s for s in chosen.kernels if isinstance(s, K.LibCall)]
    assert call.func == "pgemm" and call.fields["mr"] == PGEMM_MR[-1]
    assert call.fields["pack"] == int(weight) and call.fields["pack_a"] == 0
    ex = lm.load(build_plan(chosen, "mm").to_bytes())
    for s in (1, 13, 300):
        inputs = {"x": rand(s, 64, seed=s)}
        if not weight:
            inputs["w"] = rand(48, 64, seed=s + 1)
        np.testing.assert_allclose(ex.run(inputs)["y"], g.run(inputs)["y"], rtol=1e-4, atol=1e-4)


def test_pgemm_is_not_offered_for_f64_or_other_calls() -> None:
    call = K.LibCall("k_gemm", "gemm", {"m": 4, "n": 4, "k": 4}, [0, 1, 2], 2)
    f64 = [BufferInfo(i, f"b{i}", lm.f64, (4, 4), "input") for i in range(3)]
    assert CpuTarget().library_variants(call, f64) == []
    f32 = [BufferInfo(i, f"b{i}", lm.f32, (4, 4), "input") for i in range(3)]
    qdot = K.LibCall("k_qdot", "qdot", {"m": 4, "n": 4, "k": 32}, [0, 1, 2], 2)
    assert CpuTarget().library_variants(qdot, f32) == []
    offered = CpuTarget().library_variants(call, f32)
    assert len(offered) == (len(PGEMM_MR) if AVX512 else 0)
    assert all(c.fields["pack"] == 0 for _, c in offered)


@pytest.mark.parametrize("file_weight", [True, False])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_pgemm_weight_read_again_after_it_is_packed(
    dtype: str, file_weight: bool, tmp_path
) -> None:
    """Packing a weight lets the kernel reclaim the source's pages (MADV_PAGEOUT): a mapped
    file's come back from the file, an inline weight's stay. A second product by the same
    weight (packed again by its own call) and a plain gemm reading it after both must see
    its values, on every run."""
    k_, n_ = 600, 300  # 720 KB (bf16: 360 KB): whole pages
    wv = rand(n_, k_, seed=5, dtype=dtype)
    p = Plan()
    a = p.add_buffer("a", dtype, Role.input, (7, k_))
    w = p.add_buffer("w", dtype, Role.weight, (n_, k_))
    outs = [p.add_buffer(f"c{i}", "f32", Role.output, (7, n_)) for i in range(3)]
    if file_weight:
        path = tmp_path / "w.bin"
        path.write_bytes(b"\0" * 64 + wv.tobytes())
        p.weights.append(FileWeight(w, str(path), 64, wv.nbytes))
    else:
        p.weights.append(InlineWeight(w, wv))
    desc = {"m": 7, "n": n_, "k": k_, "trans_b": 1}
    for c in outs[:2]:
        p.steps.append(LibCall("pgemm", {**desc, "pack": 1, "pack_a": 0}, [a, w, c]))
    p.steps.append(LibCall("gemm", desc, [a, w, outs[2]]))
    ex = runtime.load(p)
    for seed in (1, 2, 3):
        av = rand(7, k_, seed=seed, dtype=dtype)
        got = ex.run({"a": av})
        for i in range(3):
            assert_sum_close(got[f"c{i}"], av, wv.T, 1.0)


@pytest.mark.skipif(not AVX512, reason="pgemm is offered on AVX-512 machines")
def test_search_offers_swapped_pgemm_for_a_weight_on_the_left(tmp_path, monkeypatch) -> None:
    """A convolution multiplies its weight by the patches (W @ P): the swapped pgemm (the
    weight packed once as panels, C stored transposed) is offered first among the pgemm forms;
    kept, the plan computes what the graph does at every batch and size."""
    import luminal.functional as F

    use_kernel_cache(monkeypatch, tmp_path)
    # the copy's forms alone: an implicit convolution would take one of the measured slots
    monkeypatch.setattr(select, "implicit_conv", lambda *a, **k: None)
    g = lm.Graph("conv")
    b, h = lm.dim("b", 1, 8), lm.dim("h", 3, 64)
    x = g.input("x", (b, 5, h, h))
    g.output("y", F.conv2d(x, g.weight("w", data=rand(11, 5, 3, 3)), None, padding=1))
    low = lower(g)
    offered: list[list[str]] = []

    def variants(call, operands):
        out = CpuTarget().library_variants(call, operands)
        offered.append([label for label, _ in out])
        return out

    def measure(sub, dims):
        calls = [s for s in sub.kernels if isinstance(s, K.LibCall)]
        return 1.0 if any(s.fields.get("swap") == 1 for s in calls) else 2.0

    tuner = Tuner(measure, "test", variants=variants)
    chosen = select.choose_library_calls(low, tuner)
    assert offered and offered[0][0].endswith(",swap")
    (call,) = [s for s in chosen.kernels if isinstance(s, K.LibCall)]
    assert call.func == "pgemm" and call.fields["swap"] == 1 and call.fields["pack"] == 1
    ex = lm.load(build_plan(chosen, "conv").to_bytes())
    for bs, hs in ((1, 3), (2, 8), (3, 17)):
        inputs = {"x": rand(bs, 5, hs, hs, seed=hs)}
        np.testing.assert_allclose(ex.run(inputs)["y"], g.run(inputs)["y"], rtol=1e-4, atol=1e-4)
