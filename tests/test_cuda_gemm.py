"""The generated tensor-core GEMM (codegen/cuda_gemm.py) without a GPU.

1. The kernel text runs on the CPU emulation of the CUDA execution model of
   test_cuda_emulated.py, with the mma.sync / cvt.rna.tf32 helpers replaced by a host
   emulation that exchanges fragments between the lanes of a warp exactly as the PTX ISA lays
   them out (m16n8k8 tf32, m16n8k16 f16/bf16). This checks tiling, bounds, strides, batch,
   transposes, the epilogue and the three-pass TF32 split against numpy.
2. NVRTC compiles the real kernel to an sm_90a cubin whose SASS holds HMMA instructions.
3. A CUDA plan turns a matmul into the gemm kernel (no LibCall step is left for the runtime).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from luminal.codegen import cstyle as cgen
from luminal.codegen import cuda
from luminal.codegen.cuda import gemm as cuda_gemm
from luminal.codegen.cuda import nvrtc
from luminal.codegen.prelude import SHARED_HELPERS
from luminal.compiler import kernel_ir as K
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym
from luminal.runtime import numpy_dtype
from test_cuda_compile import NVRTC_MISSING, nvrtc_tool
from test_cuda_emulated import CXX, EMU_HEAD, EMU_TAIL

needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=str(NVRTC_MISSING))
needs_cxx = pytest.mark.skipif(
    subprocess.run(["which", CXX], capture_output=True).returncode != 0,
    reason=f"no C++ compiler ({CXX})",
)

# Host versions of MMA_HELPERS. Lane l holds fragment registers; groupID = l >> 2,
# threadID_in_group = l & 3. tf32 A (16x8): reg r of lane l is A[g + 8*(r&1)][t + 4*(r>>1)];
# B (8x8): reg r is B[t + 4r][g]. f16/bf16 A (16x16): reg r holds the pair
# A[g + 8*(r&1)][2t + 8*(r>>1) + {0,1}] (low half first); B (16x8): reg r holds
# B[2t + 8r + {0,1}][g]. C (16x8, f32): element q is C[g + 8*(q>>1)][2t + (q&1)].
EMU_MMA = r"""
#define __align__(n) __attribute__((aligned(n)))
static uint32_t lm_mma_a[1024][4], lm_mma_b[1024][2];
static inline uint32_t lm_tf32(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u; /* nearest, ties away */
  return u;
}
static inline float lm_half_bits(uint32_t reg, int hi, int bf) {
  uint16_t h = (uint16_t)(hi ? reg >> 16 : reg & 0xffffu);
  return bf ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}
/* kind 0: tf32 m16n8k8; 1: f16 m16n8k16; 2: bf16 m16n8k16 */
static void lm_mma_emu(float *d, const uint32_t *a, const uint32_t *b, int kind) {
  const unsigned tid = threadIdx.x, w = tid / 32, base = tid & ~31u, l = tid & 31u;
  for (int r = 0; r < 4; ++r) lm_mma_a[tid][r] = a[r];
  for (int r = 0; r < 2; ++r) lm_mma_b[tid][r] = b[r];
  lm_warp_bar[w]->arrive_and_wait();
  const int g = (int)(l >> 2), t = (int)(l & 3);
  for (int q = 0; q < 4; ++q) {
    const int row = g + 8 * (q >> 1), col = 2 * t + (q & 1);
    float s = 0.0f;
    if (kind == 0) {
      for (int k = 0; k < 8; ++k) {
        const unsigned la = base + (row & 7) * 4 + (k & 3), lb = base + col * 4 + (k & 3);
        float x = __uint_as_float(lm_mma_a[la][(row >> 3) + 2 * (k >> 2)]);
        float y = __uint_as_float(lm_mma_b[lb][k >> 2]);
        s += x * y;
      }
    } else {
      for (int k = 0; k < 16; ++k) {
        const unsigned la = base + (row & 7) * 4 + ((k & 7) >> 1);
        const unsigned lb = base + col * 4 + ((k & 7) >> 1);
        uint32_t ra = lm_mma_a[la][(row >> 3) + 2 * (k >> 3)], rb = lm_mma_b[lb][k >> 3];
        s += lm_half_bits(ra, k & 1, kind == 2) * lm_half_bits(rb, k & 1, kind == 2);
      }
    }
    d[q] += s;
  }
  lm_warp_bar[w]->arrive_and_wait();
}
#define LM_MMA_EMU(name, kind) \
  static inline void name(float *d, const uint32_t *a, const uint32_t *b) { \
    lm_mma_emu(d, a, b, kind); \
  }
LM_MMA_EMU(lm_mma_tf32, 0)
LM_MMA_EMU(lm_mma_f16, 1)
LM_MMA_EMU(lm_mma_bf16, 2)
"""


def _emulate(gk: cuda_gemm.GemmKernel, bufs: dict[int, np.ndarray], dims: dict[str, int],
             dim_names: list[str], dtypes: dict[int, dt.DType]) -> None:  # fmt: skip
    """Runs ``gk`` on the emulator; ``bufs`` (by buffer id) are updated in place."""
    body = gk.source.split(cuda_gemm.MMA_HELPERS, 1)[1].replace('extern "C" ', "")
    call_args = [f"({'' if i == 0 else 'const '}{cgen.storage_ctype(dtypes[b])} *)args[{i}]"
                 for i, b in enumerate(gk.args)]  # fmt: skip
    call_args += [f"dims[{j}]" for j in range(len(dim_names))]
    src = "\n".join([
        EMU_HEAD, SHARED_HELPERS, EMU_TAIL, EMU_MMA, body,
        f'extern "C" void launch(void **args, const int64_t *dims, const int64_t *grid, '
        f"int64_t block) {{ lm_run3([&] {{ {gk.name}({', '.join(call_args)}); }}, grid, block); }}",
    ])  # fmt: skip
    key = hashlib.sha256(src.encode()).hexdigest()[:24]
    d = os.path.join(tempfile.gettempdir(), "luminal-cuda-emu")
    os.makedirs(d, exist_ok=True)
    so = os.path.join(d, f"gemm-{key}.so")
    if not os.path.exists(so):
        cpp = so[:-3] + ".cpp"
        Path(cpp).write_text(src)
        cmd = [
            CXX,
            "-std=c++20",
            "-O1",
            "-fPIC",
            "-shared",
            "-pthread",
            "-w",
            cpp,
            "-o",
            so + ".tmp",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[:4000]
        os.replace(so + ".tmp", so)
    lib = ctypes.CDLL(so)
    env = {n: dims[n] for n in dim_names}
    grid = [int(sym.evaluate(x, env)) for x in gk.grid]
    if min(grid) == 0:
        return
    args = (ctypes.c_void_p * 3)(*[bufs[b].ctypes.data for b in gk.args])
    dvals = (ctypes.c_int64 * max(len(dim_names), 1))(*[env[n] for n in dim_names])
    lib.launch(args, dvals, (ctypes.c_int64 * 3)(*grid), ctypes.c_int64(gk.block[0]))


def _reference(a: np.ndarray, b: np.ndarray, c: np.ndarray, f: dict, env: dict) -> np.ndarray:
    ev = {k: (float(v) if k in ("alpha", "beta") else int(sym.evaluate(v, env)))
          for k, v in f.items()}  # fmt: skip
    m, n, k = ev["m"], ev["n"], ev["k"]
    out = c.astype(np.float64).copy()
    for i in range(ev["batch"]):
        oa = ev["a_offset"] + i * ev["stride_a"]
        ob = ev["b_offset"] + i * ev["stride_b"]
        oc = ev["c_offset"] + i * ev["stride_c"]
        ar, ac = (k, m) if ev["trans_a"] else (m, k)
        br, bc = (n, k) if ev["trans_b"] else (k, n)
        A = np.lib.stride_tricks.as_strided(a[oa:], (ar, ac), (ev["lda"] * a.itemsize, a.itemsize))
        B = np.lib.stride_tricks.as_strided(b[ob:], (br, bc), (ev["ldb"] * b.itemsize, b.itemsize))
        A = A.astype(np.float64).T if ev["trans_a"] else A.astype(np.float64)
        B = B.astype(np.float64).T if ev["trans_b"] else B.astype(np.float64)
        C = np.lib.stride_tricks.as_strided(out[oc:], (m, n), (ev["ldc"] * 8, 8))
        C[...] = ev["alpha"] * (A @ B) + ev["beta"] * C
    return out


def _check(fields: dict, op: dt.DType = dt.f32, out: dt.DType = dt.f32, rtol: float = 2e-6,
           dims: dict[str, int] | None = None, config: cuda_gemm.GemmConfig | None = None,
           seed: int = 0) -> cuda_gemm.GemmKernel:  # fmt: skip
    dims = dims or {}
    names = sorted(dims)
    lc = K.LibCall("gemm_t", "gemm", fields, [0, 1, 2], 2)
    dtypes = {0: op, 1: op, 2: out}
    gk = cuda_gemm.render_gemm(lc, dtypes, names, cuda.PRELUDE, config)
    f = cuda_gemm.gemm_fields(lc)
    env = dict(dims)
    ev = {k: int(sym.evaluate(v, env)) for k, v in f.items() if k not in ("alpha", "beta")}

    def span(ld: str, s: str, o: str, rows: int) -> int:
        return ev[o] + max(ev["batch"] - 1, 0) * ev[s] + rows * ev[ld] + 8

    rng = np.random.default_rng(seed)
    na = span("lda", "stride_a", "a_offset", ev["k"] if ev["trans_a"] else ev["m"])
    nb = span("ldb", "stride_b", "b_offset", ev["n"] if ev["trans_b"] else ev["k"])
    nc = span("ldc", "stride_c", "c_offset", ev["m"])
    npo, npc = numpy_dtype(op.name), numpy_dtype(out.name)
    a = rng.standard_normal(na).astype(np.float32).astype(npo)
    b = rng.standard_normal(nb).astype(np.float32).astype(npo)
    c = rng.standard_normal(nc).astype(np.float32).astype(npc)
    want = _reference(a, b, c, f, env)
    got = c.copy()
    _emulate(gk, {0: a, 1: b, 2: got}, dims, names, dtypes)
    got64 = got.astype(np.float64)
    # untouched elements stay bit-identical; written ones match to rtol of the row's scale
    scale = np.sqrt(max(ev["k"], 1)) * (abs(float(f["alpha"])) + 1) + abs(float(f["beta"]))
    err = np.abs(got64 - want)
    bad = np.nonzero(err > rtol * scale + 1e-30)[0]
    assert bad.size == 0, (f"{bad.size} wrong of {nc}; first at {bad[:5]}: got {got64[bad[:5]]}"
                           f" want {want[bad[:5]]}")  # fmt: skip
    return gk


@needs_cxx
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_f32_odd_sizes_every_transpose(ta: int, tb: int) -> None:
    m, n, k = 33, 50, 37
    f = {"m": m, "n": n, "k": k, "trans_a": ta, "trans_b": tb,
         "lda": (m if ta else k) + 3, "ldb": (k if tb else n) + 1, "ldc": n + 2,
         "a_offset": 5, "b_offset": 1, "c_offset": 7}  # fmt: skip
    # three-pass TF32 is f32-accurate: single-pass TF32 would miss this by ~1000x
    _check(f, rtol=2e-6)


@needs_cxx
def test_f32_several_tiles_batch_alpha_beta() -> None:
    m, n, k = 131, 140, 70  # 2 x 2 blocks of 128 x 128, 5 k tiles (the last partial)
    f = {"m": m, "n": n, "k": k, "batch": 2, "stride_a": m * k + 11, "stride_b": k * n + 3,
         "stride_c": m * n + 5, "alpha": 0.5, "beta": -2.0}  # fmt: skip
    _check(f)


@needs_cxx
def test_symbolic_m_small_config_and_empty() -> None:
    seq = sym.dim("seq", 1, 48)
    f = {"m": seq, "n": 67, "k": 29, "lda": 29, "batch": 3, "stride_a": sym.mul(seq, 29),
         "stride_b": 0, "stride_c": sym.mul(seq, 67)}  # fmt: skip
    gk = _check(f, dims={"seq": 5})
    # m <= 48: one warp row of three 16-row tiles
    assert gk.schedule == "mma-f32-48x64x16" and gk.block == (128, 1, 1)
    _check(f, dims={"seq": 1})
    # K = 0: C = alpha * 0 + beta * C
    _check({"m": 9, "n": 10, "k": 0, "beta": 0.25})


@needs_cxx
@pytest.mark.parametrize("op,out", [(dt.f16, dt.f32), (dt.bf16, dt.f32), (dt.bf16, dt.bf16),
                                    (dt.f16, dt.f16)], ids=lambda d: d.name)  # fmt: skip
def test_half_operands_f32_accumulate(op: dt.DType, out: dt.DType) -> None:
    m, n, k = 37, 45, 83  # k spans 6 mma k-steps, the last partial
    rtol = 2e-6 if out is dt.f32 else 8e-3  # products of 16-bit values are exact in f32
    for ta, tb in ((0, 0), (1, 1)):
        f = {"m": m, "n": n, "k": k, "trans_a": ta, "trans_b": tb, "a_offset": 3}
        _check(f, op=op, out=out, rtol=rtol)


@needs_cxx
def test_other_tile_configs() -> None:
    f = {"m": 70, "n": 90, "k": 50, "trans_b": 1}
    _check(f, config=cuda_gemm.GemmConfig(2, 2, 2, 4, 16))
    _check(f, op=dt.bf16, config=cuda_gemm.GemmConfig(1, 2, 3, 2, 32))


def test_refuses_what_it_cannot_run() -> None:
    lc = K.LibCall("g", "gemm", {"m": 4, "n": 4, "k": 4}, [0, 1, 2], 2)
    assert cuda_gemm.supports(lc, {0: dt.f64, 1: dt.f64, 2: dt.f64}) is not None
    assert cuda_gemm.supports(lc, {0: dt.f16, 1: dt.f32, 2: dt.f32}) is not None
    assert cuda_gemm.supports(lc, {0: dt.f32, 1: dt.f32, 2: dt.f32}) is None
    bad = K.LibCall("g", "gemm", {"m": 4, "n": 4, "k": 4, "trans_a": 2}, [0, 1, 2], 2)
    with pytest.raises(ValueError, match="trans_a"):
        cuda_gemm.render_gemm(bad, {0: dt.f32, 1: dt.f32, 2: dt.f32}, [], cuda.PRELUDE)


def _sass(cubin: bytes, tmp_path: Path) -> str:
    tool = nvrtc_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install 'nvidia-cuda-cuobjdump>=13,<14', "
                    "part of the test extras)")  # fmt: skip
    f = tmp_path / "k.cubin"
    f.write_bytes(cubin)
    r = subprocess.run([tool, "-sass", "-res-usage", str(f)], capture_output=True, text=True,
                       check=True)  # fmt: skip
    return r.stdout


@needs_nvrtc
@pytest.mark.parametrize("op", [dt.f32, dt.f16, dt.bf16], ids=lambda d: d.name)
def test_sm90a_cubin_uses_tensor_cores_without_spills(op: dt.DType, tmp_path: Path) -> None:
    seq = sym.dim("seq", 1, 4096)
    lc = K.LibCall("gemm_t", "gemm", {"m": seq, "n": 576, "k": 1536, "trans_b": 1}, [0, 1, 2], 2)
    gk = cuda_gemm.render_gemm(lc, {0: op, 1: op, 2: dt.f32}, ["seq"], cuda.PRELUDE)
    cubin = nvrtc.compile_source(gk.source, gk.name, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    sass = _sass(cubin, tmp_path)
    assert "HMMA" in sass, "no tensor-core instruction in the gemm kernel"
    assert "STACK:0" in sass and "LOCAL:0" in sass, "the gemm kernel spills registers"


@needs_nvrtc
def test_cuda_plan_renders_matmul_as_tensor_core_kernel(tmp_path: Path) -> None:
    g = lm.Graph("mm_plan")
    seq = lm.dim("seq", 1, 512)
    a, w, bias = g.input("a", (seq, 192)), g.input("w", (192, 320)), g.input("bias", (320,))
    g.output("y", (F.matmul(a, w) + bias).relu())
    cg = lm.compile(g, backend="cuda")
    steps = cg.plan.steps
    assert all(type(s).__name__ == "Launch" for s in steps), "a LibCall step was left"
    names = [cg.plan.kernels[s.kernel].name for s in steps]  # type: ignore[union-attr]
    assert any(n.endswith("_gemm") for n in names), names
    gemm = next(s for s in steps if cg.plan.kernels[s.kernel].name.endswith("_gemm"))  # type: ignore[union-attr]
    assert gemm.block[0] == 256 and "HMMA" in _sass(
        bytes(cg.plan.kernels[gemm.kernel].code), tmp_path
    )  # type: ignore[union-attr]


def test_cublaslt_loads_with_every_entry_point_or_says_why() -> None:
    import luminal._rt as rt
    import luminal.cuda as lcuda

    path = lcuda.cublaslt_path()
    if path is None:
        with pytest.raises(RuntimeError, match="cuBLASLt unavailable: "):
            rt.cuda_cublaslt_version()
        pytest.skip("libcublasLt.so.13 not installed (pip install nvidia-cublas)")
    rt.cuda_set_cublaslt_path(path)
    assert rt.cuda_cublaslt_version() >= 130000  # every declared symbol bound


@needs_nvrtc
def test_cuda_plan_can_keep_gemm_for_cublaslt(tmp_path: Path) -> None:
    from luminal.compile import build_plan
    from luminal.compiler.lower import lower
    from luminal.compiler.search.select import choose_library_calls
    from luminal.compiler.search.tuner import Tuner
    from luminal.plan import LibCall, Plan
    from luminal.targets.cuda import CudaTarget

    g = lm.Graph("mm_lt")
    a, w = g.input("a", (300, 256)), g.input("w", (256, 320))
    g.output("y", F.matmul(a, w))
    t = CudaTarget()
    low = choose_library_calls(lower(g), Tuner(t.measure, t.cache_id(), cost=t.cost))
    assert any(isinstance(k, K.LibCall) for k in low.kernels)
    plan = build_plan(low, "mm_lt", "cuda", gemm_impl="cublaslt")
    lcs = [s for s in plan.steps if isinstance(s, LibCall)]
    assert [s.func for s in lcs] == ["gemm"] and not plan.kernels
    plan.save(tmp_path / "p.lmp")
    again = Plan.load(tmp_path / "p.lmp")
    assert [s.func for s in again.steps if isinstance(s, LibCall)] == ["gemm"]
    with pytest.raises(ValueError, match="gemm_impl"):
        build_plan(low, "mm_lt", "cuda", gemm_impl="magic")
