"""The generated Metal kernels give the right numbers, run in the host emulation of their
Metal subset (targets/metal_emu.py) since no Mac is at hand: the simdgroup-matrix gemm
for every tile, operand dtype and transpose at odd and symbolic sizes, with a batch, offsets,
alpha and beta; and whole plans against the reference interpreter. (Every op test's plan is
emulated by the slow test in test_metal_ops.py.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import luminal as lm
from luminal.codegen.metal.gemm import render_gemm
from luminal.codegen.metal.schedule import TILES
from luminal.compiler import kernel_ir as K
from luminal.graph import dtypes as dt
from luminal.plan import KernelFormat, Launch, Plan, Role
from luminal.targets import metal_emu as emulate

pytestmark = pytest.mark.skipif(emulate.compiler() is None, reason="no C++ compiler")
RNG = np.random.default_rng(7)
_NP = {dt.f32: np.float32, dt.f16: np.float16, dt.bf16: ml_dtypes.bfloat16}


def _gemm_plan(lc: K.LibCall, dtypes: dict[int, dt.DType], sizes: dict[int, int], tile) -> Plan:
    """A plan of the one gemm kernel. Buffers: 0 C (input), 1 A, 2 B, 3 C updated in place
    (the output, aliased to 0: beta reads it)."""
    plan = Plan(backend="metal")
    plan.add_dim("s", 1, 64)
    for name, i in (("C", 0), ("A", 1), ("B", 2)):
        plan.add_buffer(name, dtypes[i].name, Role.input, (sizes[i],), None, None)
    plan.add_buffer("Cout", dtypes[0].name, Role.output, (sizes[0],), None, None, alias=0)
    g = render_gemm(lc, {**dtypes, 3: dtypes[0]}, ["s"], tile)
    kid = plan.add_kernel(g.name, KernelFormat.msl, g.name, g.source)
    plan.steps.append(Launch(kid, g.args, g.grid, g.block))
    return plan


def _ref(a, b, c, m, n, k, f) -> np.ndarray:
    out = c.astype(np.float64).copy()
    for z in range(f.get("batch", 1)):
        oa, ob, oc = (f.get(f"{x}_offset", 0) + z * f.get(f"stride_{x}", 0) for x in "abc")
        lda, ldb, ldc = f["lda"], f["ldb"], f["ldc"]
        A = np.lib.stride_tricks.as_strided(a[oa:], (k, m) if f["trans_a"] else (m, k),
                                            (lda * a.itemsize, a.itemsize))  # fmt: skip
        B = np.lib.stride_tricks.as_strided(b[ob:], (n, k) if f["trans_b"] else (k, n),
                                            (ldb * b.itemsize, b.itemsize))  # fmt: skip
        A = A.T if f["trans_a"] else A
        B = B.T if f["trans_b"] else B
        Cv = np.lib.stride_tricks.as_strided(out[oc:], (m, n), (ldc * 8, 8))
        Cv[...] = f.get("alpha", 1.0) * (A.astype(np.float64) @ B.astype(np.float64)) \
            + f.get("beta", 0.0) * Cv  # fmt: skip
    return out


# every dtype x transpose, the tiles in turn (each tile meets two or three dtypes)
_DTYPES = (dt.f32, dt.f16, dt.bf16)
CASES = [(a, ta, tb, TILES[(3 * i + 2 * ta + tb) % len(TILES)])
         for i, a in enumerate(_DTYPES) for ta in (0, 1) for tb in (0, 1)]  # fmt: skip


@pytest.fixture(scope="module")
def gemm_plans():
    """Every case's plan, compiled in one batch."""
    built = []
    s = lm.dim("s", 1, 64)
    m, n, k = 37, 50, 19
    for a_dt, ta, tb, tile in CASES:
        batch = 2
        lda, ldb, ldc = (m if ta else k) + 3, (k if tb else n) + 1, n + 2
        sa, sb, sc = (k if ta else m) * lda + 5, (n if tb else k) * ldb, m * ldc + 1
        f = {"m": s, "n": n, "k": k, "lda": lda, "ldb": ldb, "ldc": ldc, "batch": batch,
             "stride_a": sa, "stride_b": sb, "stride_c": sc, "a_offset": 2, "b_offset": 0,
             "c_offset": 1, "trans_a": ta, "trans_b": tb, "alpha": 0.5, "beta": 0.25}  # fmt: skip
        lc = K.LibCall("g0", "gemm", f, [1, 2, 3], 3)
        sizes = {1: 2 + batch * sa, 2: batch * sb, 0: 1 + batch * sc}
        dtypes = {1: a_dt, 2: a_dt, 0: dt.f32 if a_dt is dt.f32 else a_dt}
        plan = _gemm_plan(lc, dtypes, sizes, tile)
        built.append((plan, f, sizes, dtypes))
    emulate.prepare([bytes(p.kernels[0].code).decode() for p, *_ in built])
    return built


_IDS = [f"{a.name}-t{ta}{tb}-{t.bm}x{t.bn}" for a, ta, tb, t in CASES]


@pytest.mark.parametrize("case", range(len(CASES)), ids=_IDS)
def test_gemm_kernel_emulated(gemm_plans, case: int) -> None:
    plan, f, sizes, dtypes = gemm_plans[case]
    m, n, k = 37, 50, 19
    a = RNG.uniform(-1, 1, sizes[1]).astype(_NP[dtypes[1]])
    b = RNG.uniform(-1, 1, sizes[2]).astype(_NP[dtypes[2]])
    c = RNG.uniform(-1, 1, sizes[0]).astype(_NP[dtypes[0]])
    got = emulate.run(plan, {"A": a, "B": b, "C": c}, s=m)["Cout"]
    fields = {**f, "m": m}
    want = _ref(a.astype(np.float64), b.astype(np.float64), c, m, n, k, fields)
    # compare what the gemm wrote (the rest of C is the input, untouched)
    wrote = np.zeros(sizes[0], bool)
    for z in range(2):
        base = f["c_offset"] + z * f["stride_c"]
        for r in range(m):
            wrote[base + r * f["ldc"] : base + r * f["ldc"] + n] = True
    tol = 1e-5 if dtypes[0] is dt.f32 else 2e-2
    np.testing.assert_allclose(got.astype(np.float64)[wrote], want[wrote], atol=tol, rtol=tol)


def test_plans_emulated_match_the_reference() -> None:
    g = lm.Graph("mix")
    s = lm.dim("s", 1, 64)
    x = g.input("x", (s, 37), lm.f32)
    w = g.input("w", (37, 50), lm.f32)
    h = g.input("h", (s, 50), lm.f16)
    y = (x @ w).softmax(-1) + x.sum(-1, keepdim=True)
    g.output("y", y)
    g.output("n", (y.cast(lm.f16) * h).cast(lm.f32).amax(-1))  # f16 storage, f32 compute
    g.output("i", (x > 0).cast(lm.i64).sum(-1))  # 64-bit sum: the threadgroup tree
    g.output("a", x.argmax(-1))
    plan = lm.compile(g, backend="metal", cache=False).plan
    for rows in (1, 5, 33):
        feed = {"x": RNG.standard_normal((rows, 37)).astype(np.float32),
                "w": RNG.standard_normal((37, 50)).astype(np.float32),
                "h": RNG.standard_normal((rows, 50)).astype(np.float16)}  # fmt: skip
        feed["x"][0, 3] = np.nan if rows == 5 else feed["x"][0, 3]  # a max keeps NaN
        got, want = emulate.run(plan, feed, s=rows), g.run(feed, s=rows)
        for name, w_ in want.items():
            # "n" rounds its f16 product once, at the store; the interpreter after the multiply
            tol = 2e-3 if name == "n" else 1e-5
            np.testing.assert_allclose(got[name].astype(np.float64), w_.astype(np.float64),
                                       rtol=tol, atol=tol, err_msg=name)  # fmt: skip


@pytest.mark.parametrize("causal,head", [(False, 40), (True, 100)])
def test_attention_softmax_rows_emulated(causal: bool, head: int) -> None:
    """Attention's rows (a threadgroup per query row, each key scored once, tiles of 64 keys
    with the online rescaling) against torch, across tile edges and with two column strides."""
    import torch

    import luminal.functional as F

    g = lm.Graph("attention")
    s = lm.dim("s", 1, 128)
    q, k, v = (g.input(n, (1, 2, s, head), lm.f32) for n in "qkv")
    g.output("o", F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    plan = lm.compile(g, backend="metal", cache=False).plan
    assert any(b"lm_ps" in bytes(kk.code) for kk in plan.kernels)  # the softmax-row schedule
    for rows in (1, 70):
        feed = {n: RNG.standard_normal((1, 2, rows, head)).astype(np.float32) for n in "qkv"}
        got = emulate.run(plan, feed, s=rows)["o"]
        ts = [torch.from_numpy(feed[n]) for n in "qkv"]
        want = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=causal).numpy()
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
