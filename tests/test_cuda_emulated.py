"""Generated CUDA kernels, run without a GPU: the kernel text (frame, schedules, block
reductions with warp shuffles, scatter order) is compiled as C++ against a small emulation of
the CUDA execution model (one OS thread per CUDA thread, barriers for ``__syncthreads`` and
shuffles) and checked against the reference interpreter. The CUDA prelude's inline PTX
(f16 conversions) is replaced by host code here; NVRTC checks the real one
(tests/test_cuda_compile.py). Needs a C++20 compiler (``$CXX``, default g++).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from luminal.codegen import cstyle as cgen
from luminal.codegen import cuda
from luminal.codegen.prelude import SHARED_HELPERS
from luminal.compiler.lower import lower
from luminal.graph import dtypes as dt
from luminal.graph import symbolic as sym
from luminal.runtime import numpy_dtype
from optest import compare, rand

CXX = os.environ.get("CXX", "g++")
pytestmark = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})")

EMU_HEAD = r"""
#include <barrier>
#include <cstring>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <thread>
#include <vector>
struct lm_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local lm_dim3 threadIdx, blockIdx;
static lm_dim3 blockDim, gridDim;
static std::barrier<> *lm_block_bar;
static std::barrier<> *lm_warp_bar[32];
static uint64_t lm_slots[1024];
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __shared__ static
#define __syncthreads() lm_block_bar->arrive_and_wait()
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
  unsigned t = threadIdx.x, w = t / 32;
  memcpy(&lm_slots[t], &v, sizeof(T));
  lm_warp_bar[w]->arrive_and_wait();
  T r;
  memcpy(&r, &lm_slots[(t & ~31u) | ((t & 31u) ^ unsigned(o))], sizeof(T));
  lm_warp_bar[w]->arrive_and_wait();
  return r;
}
#define LM_FN static inline
static inline float lm_bits_f32(uint32_t u) { return __uint_as_float(u); }
static inline uint32_t lm_f32_bits(float f) { return __float_as_uint(f); }
static inline float lm_f16_to_f32(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return v; }
static inline uint16_t lm_f32_to_f16(float f) {
  _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h;
}
"""

EMU_TAIL = r"""
template <typename T> static inline T lm_shfl(T v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
template <typename F> static void lm_run3(F kernel, const int64_t *grid, int64_t block) {
  std::barrier<> bar((std::ptrdiff_t)block);
  std::vector<std::barrier<> *> warps;
  for (int64_t w = 0; w < (block + 31) / 32; ++w)
    warps.push_back(new std::barrier<>((std::ptrdiff_t)std::min<int64_t>(32, block - 32 * w)));
  lm_block_bar = &bar;
  for (size_t w = 0; w < warps.size(); ++w) lm_warp_bar[w] = warps[w];
  blockDim.x = (unsigned)block;
  gridDim.x = (unsigned)grid[0]; gridDim.y = (unsigned)grid[1]; gridDim.z = (unsigned)grid[2];
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < block; ++t)
    threads.emplace_back([&, t] {
      threadIdx.x = (unsigned)t;
      for (int64_t z = 0; z < grid[2]; ++z)
        for (int64_t y = 0; y < grid[1]; ++y)
          for (int64_t x = 0; x < grid[0]; ++x) {
            blockIdx.x = (unsigned)x; blockIdx.y = (unsigned)y; blockIdx.z = (unsigned)z;
            kernel();
            bar.arrive_and_wait(); /* the next block reuses __shared__ memory */
          }
    });
  for (auto &th : threads) th.join();
  for (auto *w : warps) delete w;
}
template <typename F> static void lm_run(F kernel, int64_t grid, int64_t block) {
  const int64_t g3[3] = {grid, 1, 1};
  lm_run3(kernel, g3, block);
}
"""


def _build(rendered: Sequence[cuda.CudaKernel], dtypes: dict[int, dt.DType], n_dims: int):  # type: ignore[no-untyped-def]
    parts = [EMU_HEAD, SHARED_HELPERS, EMU_TAIL]
    for ck in rendered:
        parts.append(ck.source.split("#endif\n", 1)[1].replace('extern "C" ', ""))
        call_args = []
        for i, b in enumerate(ck.args):
            t = cgen.storage_ctype(dtypes[b])
            call_args.append(f"({'' if i == 0 else 'const '}{t} *)args[{i}]")
        call_args += [f"dims[{j}]" for j in range(n_dims)]
        call = f"{ck.name}({', '.join(call_args)});"
        parts.append(
            f'extern "C" void launch_{ck.name}(void **args, const int64_t *dims, int64_t grid, '
            f"int64_t block) {{ lm_run([&] {{ {call} }}, grid, block); }}"
        )
    src = "\n".join(parts)
    key = hashlib.sha256(src.encode()).hexdigest()[:24]
    d = os.path.join(tempfile.gettempdir(), "luminal-cuda-emu")
    os.makedirs(d, exist_ok=True)
    so = os.path.join(d, f"{key}.so")
    if not os.path.exists(so):
        cpp = os.path.join(d, f"{key}.cpp")
        with open(cpp, "w") as f:
            f.write(src)
        cmd = [CXX, "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-w", cpp]
        r = subprocess.run([*cmd, "-o", so + ".tmp"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[:4000]
        os.replace(so + ".tmp", so)
    return ctypes.CDLL(so)


def run_emulated(g: lm.Graph, inputs: dict[str, np.ndarray], **dims: int) -> dict[str, np.ndarray]:
    """Runs ``g``'s generated CUDA kernels on the emulator; returns the outputs."""
    low = lower(g)
    names = sorted(low.dims)
    rendered = [cuda.render_kernel(k, names) for k in low.kernels]
    dtypes = {b.id: b.dtype for b in low.buffers}
    lib = _build(rendered, dtypes, len(names))
    env = {n: dims[n] for n in names}
    for n in names:
        if n not in dims:
            raise ValueError(f"give dim {n}")
    mem: dict[int, np.ndarray] = {}
    for b in low.buffers:
        nbytes = int(sym.evaluate(b.nbytes(), env))
        buf = np.zeros(max(nbytes, 1), np.uint8)
        if b.role in ("input", "weight"):
            src = inputs[b.name] if b.role == "input" else np.asarray(low.weights[b.name])
            raw = np.ascontiguousarray(src.astype(numpy_dtype(b.dtype.name)))
            if b.dtype.packed:
                from luminal.plan import pack_nibbles

                raw = pack_nibbles(raw)
            buf[:nbytes] = raw.reshape(-1).view(np.uint8)
        mem[b.id] = buf
    dim_vals = (ctypes.c_int64 * max(len(names), 1))(*[env[n] for n in names])
    for ck in rendered:
        args = (ctypes.c_void_p * len(ck.args))(*[mem[b].ctypes.data for b in ck.args])
        grid = int(sym.evaluate(ck.grid[0], env))
        if grid > 0:
            getattr(lib, f"launch_{ck.name}")(args, dim_vals, ctypes.c_int64(grid),
                                              ctypes.c_int64(ck.block[0]))  # fmt: skip
    out = {}
    for b in low.buffers:
        if b.role != "output":
            continue
        shape = tuple(int(sym.evaluate(s, env)) for s in b.shape)
        npd = numpy_dtype(b.dtype.name)
        count = int(np.prod(shape))
        if b.dtype.packed:
            from luminal.plan import unpack_nibbles

            a = unpack_nibbles(mem[b.id], count, b.dtype is dt.i4).view(npd)
        else:
            a = mem[b.id][: count * npd.itemsize].view(npd)
        out[b.name] = a.reshape(shape)
    return out


def check(g: lm.Graph, inputs: dict[str, np.ndarray], atol: float = 1e-4, rtol: float = 1e-4,
          **dims: int) -> None:  # fmt: skip
    want = g.run(inputs, **dims)
    got = run_emulated(g, inputs, **dims)
    for name, w in want.items():
        compare(f"{g.name}[cuda-emulated] {name}", got[name], w, atol, rtol, check_dtype=True)


def test_elementwise_broadcast_symbolic() -> None:
    g = lm.Graph("ew")
    n = lm.dim("n", 1, 4096)
    x, y = g.input("x", (n, 50)), g.input("y", (50,))
    g.output("z", ((x.sin() * y + 1.0).exp() / (x * x + 1.0).sqrt()))
    check(g, {"x": rand(7, 50), "y": rand(50)}, n=7)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_reductions_every_axis_and_schedule(axis: int) -> None:
    g = lm.Graph("red")
    x = g.input("x", (7, 300, 33))
    g.output("s", x.sum(axis))
    g.output("m", x.amax(axis))
    check(g, {"x": rand(7, 300, 33)})


def test_softmax_and_layer_norm_row_schedule() -> None:
    g = lm.Graph("rows")
    s = lm.dim("s", 1, 64)
    x, w = g.input("x", (s, 1000)), g.input("w", (1000,))
    g.output("p", F.softmax(x, dim=-1))
    g.output("n", F.layer_norm(x, (1000,), w))
    g.output("r", F.rms_norm(x.to(dt.bf16), (1000,)).float())
    kinds = {cuda.choose_schedule(k) for k in lower(g).kernels}
    assert "row" in kinds
    check(g, {"x": rand(5, 1000, low=-8, high=8), "w": rand(1000)}, atol=2e-2, rtol=2e-2, s=5)


def test_long_reduction_element_schedule_and_argmax() -> None:
    g = lm.Graph("long")
    x = g.input("x", (3, 5000), dt.f16)
    g.output("s", x.float().sum(-1))
    g.output("a", x.argmax(-1))
    assert "element" in {cuda.choose_schedule(k) for k in lower(g).kernels}
    check(g, {"x": rand(3, 5000, dtype=np.float16)}, atol=1e-2, rtol=1e-3)


def test_matmul_and_attention() -> None:
    g = lm.Graph("mm")
    a, b = g.input("a", (33, 64)), g.input("b", (64, 17))
    q, k, v = (g.input(n, (1, 2, 9, 16)) for n in "qkv")
    g.output("y", F.matmul(a, b))
    g.output("o", F.scaled_dot_product_attention(q, k, v, is_causal=True))
    check(g, {"a": rand(33, 64), "b": rand(64, 17), **{n: rand(1, 2, 9, 16) for n in "qkv"}},
          atol=1e-3, rtol=1e-3)  # fmt: skip


def test_gather_and_scatter_in_order() -> None:
    g = lm.Graph("idx")
    idx, table = g.input("idx", (11,), dt.i64), g.input("table", (40, 6), dt.bf16)
    d, i, s = g.input("d", (50, 6)), g.input("i", (3, 6), dt.i64), g.input("s", (3, 6))
    g.output("e", F.embedding(idx, table))
    g.output("y", d.scatter(0, i, s))
    ii = np.array([[1, 2, 3, 4, 5, 6], [1, 9, 9, 9, 9, 9], [7, 2, 0, 49, 3, 1]], np.int64)
    check(g, {"idx": rand(11, dtype=np.int64, low=0, high=40), "table": rand(40, 6).astype(
        numpy_dtype("bf16")), "d": rand(50, 6), "i": ii, "s": rand(3, 6)})  # fmt: skip


@pytest.mark.parametrize("d", [dt.f16, dt.bf16, dt.f64, dt.i32, dt.i64, dt.bool_, dt.i8, dt.u8,
                               dt.f8e4m3, dt.f8e5m2, dt.fp4e2m1, dt.i4, dt.u4],
                         ids=lambda d: d.name)  # fmt: skip
def test_dtypes_store_and_reduce(d: dt.DType) -> None:
    g = lm.Graph("dt")
    x = g.input("x", (3, 51), d)
    # (x * 0.5 would do, but the interpreter cannot broadcast an f8e5m2 constant yet)
    g.output("y", (x.float() + x.float()).to(d))
    g.output("s", x.to(dt.f32).sum(-1))
    g.output("m", x.amax(-1))
    npd = numpy_dtype(d.name)
    if d.is_float:
        a = rand(3, 51, low=-4, high=4).astype(npd)
    elif d is dt.bool_:
        a = rand(3, 51, dtype=np.bool_)
    else:
        # x + x stays in range: an out-of-range float -> int4 cast is undefined (numpy
        # versions differ)
        lo, hi = (0, 8) if d is dt.u4 else (-4, 4) if d is dt.i4 else (0, 50)
        a = rand(3, 51, dtype=np.int64, low=lo, high=hi).astype(npd)
    check(g, {"x": a}, atol=1e-3, rtol=1e-3)


def test_decode_projections_take_a_group_per_output() -> None:
    """A decode step's products by weight rows with what the graph fuses around them (the
    residual add, the gated MLP's silu(gate) * up): each output's reduction streams a weight
    row, so a group shares it; a thread per output would run the whole row alone."""
    g = lm.Graph("decode_proj")
    s = lm.dim("seq", 1, 256)
    x, h = g.input("x", (s, 96)), g.input("h", (s, 300))
    w_down, w_gate, w_up = (g.input(n, (96 if n == "down" else 300, 300)) for n in
                            ("down", "gate", "up"))  # fmt: skip
    g.output("y", x + F.linear(h, w_down))
    g.output("m", F.silu(F.linear(h, w_gate)) * F.linear(h, w_up))
    kinds = [cuda.choose_schedule(k) for k in lower(g).kernels]
    assert kinds and set(kinds) == {"element"}, kinds
    ins = {"x": rand(1, 96), "h": rand(1, 300), "down": rand(96, 300), "gate": rand(300, 300),
           "up": rand(300, 300)}  # fmt: skip
    check(g, ins, atol=1e-3, rtol=1e-3, seq=1)
