"""The CUDA backend without a GPU: every kernel generated for a representative set of graphs
compiles with NVRTC to an sm_90a cubin, and luminal imports and says why CUDA is unavailable.

Needs ``nvidia-cuda-nvrtc==13.0.*`` and ``cuda-pathfinder`` (the ``cuda`` extra); skipped with
the reason otherwise. Runs on a GPU machine too (then CUDA is available, not unavailable).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import luminal as lm
import luminal.functional as F
from luminal.codegen import cuda
from luminal.codegen.cuda import nvrtc
from luminal.compiler.lower import lower
from luminal.graph import dtypes as dt

NVRTC_MISSING = nvrtc.available()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=str(NVRTC_MISSING))

ALL_DTYPES = [dt.f32, dt.f16, dt.bf16, dt.f64, dt.i32, dt.i64, dt.bool_, dt.i8, dt.u8,
              dt.f8e4m3, dt.f8e5m2, dt.e8m0, dt.fp4e2m1, dt.i4, dt.u4]  # fmt: skip


def _graphs() -> list[lm.Graph]:
    gs = []

    def graph(name: str) -> lm.Graph:
        g = lm.Graph(name)
        gs.append(g)
        return g

    seq = lm.dim("seq", 1, 4096)
    g = graph("elementwise_chain")
    x = g.input("x", (seq, 50))
    g.output("y", ((x.sin() * 2.0 + 1.0).exp() / (x * x + 1.0).sqrt()).log())
    g = graph("broadcast_where")
    a, b = g.input("a", (3, 1, 783)), g.input("b", (50, 1))
    g.output("y", F.where(a < b, a, b * 2.0))
    for axis in (0, 1, 2):
        g = graph(f"sum_axis{axis}")
        x = g.input("x", (7, 300, 33))
        g.output("y", x.sum(axis))
        g.output("m", x.amax(axis))
    g = graph("reduce_all_symbolic")
    x = g.input("x", (seq, 4096), dt.f16)
    g.output("y", x.float().sum())
    g = graph("softmax")
    x = g.input("x", (seq, 1000), dt.bf16)
    g.output("y", F.softmax(x, dim=-1))
    g = graph("layer_norm")
    x, w, b = g.input("x", (seq, 768)), g.input("w", (768,)), g.input("b", (768,))
    g.output("y", F.layer_norm(x, (768,), w, b))
    g = graph("rms_norm_bf16")
    x = g.input("x", (seq, 2048), dt.bf16)
    g.output("y", F.rms_norm(x, (2048,)))
    g = graph("matmul")  # broadcast-mul + sum until the search adds GEMM kernels
    a, b = g.input("a", (seq, 256)), g.input("b", (256, 64))
    g.output("y", F.matmul(a, b))
    g = graph("batched_matmul_f16")
    a, b = g.input("a", (4, 50, 64), dt.f16), g.input("b", (4, 64, 50), dt.f16)
    g.output("y", F.matmul(a, b))
    g = graph("attention")
    q, k, v = (g.input(n, (2, 4, seq, 64), dt.bf16) for n in "qkv")
    g.output("y", F.scaled_dot_product_attention(q, k, v, is_causal=True))
    g = graph("embedding")
    idx, table = g.input("idx", (seq,), dt.i64), g.input("table", (1000, 64), dt.bf16)
    g.output("y", F.embedding(idx, table))
    g = graph("scatter")
    d, i, s = g.input("d", (50, 6)), g.input("i", (3, 6), dt.i64), g.input("s", (3, 6))
    g.output("y", d.scatter(0, i, s))
    g = graph("argmax")
    x = g.input("x", (33, 1000))
    g.output("y", x.argmax(-1))
    for d in ALL_DTYPES:
        g = graph(f"dtype_{d.name}")
        x = g.input("x", (3, 50), d)
        y = x.float() * 0.5
        g.output("y", y.to(d))
        g.output("s", x.sum(-1) if d is not dt.bool_ else x.to(dt.i32).sum(-1))
        g.output("m", x.amax(-1))
    return gs


GRAPHS = _graphs()


@needs_nvrtc
@pytest.mark.parametrize("g", GRAPHS, ids=[g.name for g in GRAPHS])
def test_kernels_compile_to_sm90a_cubins(g: lm.Graph) -> None:
    low = lower(g)
    compiled = cuda.compile_kernels(low.kernels, sorted(low.dims), "sm_90a")
    assert compiled
    for ck, cubin in compiled:
        assert cubin[:4] == b"\x7fELF", f"{ck.name}: not an ELF cubin"
        assert ck.block[0] in (1, 256)


@needs_nvrtc
def test_compile_gives_a_cuda_plan_that_saves_and_reloads(tmp_path: Path) -> None:
    g = GRAPHS[[x.name for x in GRAPHS].index("softmax")]
    cg = lm.compile(g, backend="cuda")
    assert cg.plan.backend == "cuda" and cg.plan.arch.startswith("sm_")
    assert all(k.format.name == "cubin" for k in cg.plan.kernels)
    assert {s.block for s in cg.plan.steps} == {(256, 1, 1)}
    path = tmp_path / "softmax.lmp"
    cg.save(path)
    from luminal.plan import Plan

    again = Plan.load(path)
    assert [bytes(k.code) for k in again.kernels] == [bytes(k.code) for k in cg.plan.kernels]


@needs_nvrtc
def test_nvrtc_errors_name_the_kernel_and_show_the_log() -> None:
    with pytest.raises(nvrtc.NvrtcError, match=r"(?s)'broken'.*undefined"):
        nvrtc.compile_source('extern "C" __global__ void broken() { undefined_fn(); }', "broken",
                             cache=False)  # fmt: skip


@needs_nvrtc
def test_ptx_targets_the_virtual_arch() -> None:
    ptx = nvrtc.compile_source('extern "C" __global__ void k(float *p) { p[0] = 1.0f; }', "k",
                               ptx=True, cache=False)  # fmt: skip
    assert b".target sm_90a" in ptx and b".entry k" in ptx


def _sass(cubin: bytes, tmp_path: Path) -> str:
    tool = nvrtc_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install 'nvidia-cuda-cuobjdump>=13.2')")
    f = tmp_path / "k.cubin"
    f.write_bytes(cubin)
    r = subprocess.run([tool, "-sass", str(f)], capture_output=True, text=True, check=True)
    return r.stdout


def nvrtc_tool(name: str) -> str | None:
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        p = find_nvidia_binary_utility(name)
        if p:
            return str(p)
    except Exception:
        pass
    return shutil.which(name)


@needs_nvrtc
def test_sass_uses_shuffles_for_block_reductions_and_32bit_indexing(tmp_path: Path) -> None:
    g = GRAPHS[[x.name for x in GRAPHS].index("softmax")]
    low = lower(g)
    compiled = cuda.compile_kernels(low.kernels, sorted(low.dims), "sm_90a")
    # the kernel that normalizes a row reduces it per block (the row max may be its own kernel)
    ck, cubin = next((c, b) for c, b in compiled if c.schedule == "row")
    assert "int32_t t = " in ck.source
    sass = _sass(cubin, tmp_path)
    assert "SHFL.BFLY" in sass and "BAR.SYNC" in sass


def test_no_driver_is_reported_not_fatal() -> None:
    import luminal.cuda as lcuda
    import luminal.runtime as rt

    why = lcuda.unavailable_reason()
    status = lm.cuda_status()
    if why is None:
        assert "cuda" in rt.backends() and status.startswith("CUDA available")
        return
    assert "cuda" not in rt.backends()
    assert status.startswith("CUDA unavailable: ") and why in status
    g = lm.Graph("t")
    x = g.input("x", (3,))
    g.output("y", x + 1.0)
    plan = lm.compile(g).plan
    plan.backend = "cuda"
    with pytest.raises(RuntimeError, match="CUDA unavailable: "):
        rt.Executor(plan, "cuda")


def test_import_without_nvrtc_or_driver_in_a_fresh_process() -> None:
    code = ("import luminal, luminal.cuda, luminal.codegen.cuda; import numpy as np; "
            "g = luminal.Graph('t'); x = g.input('x', (3,)); g.output('y', x * 2.0); "
            "print(luminal.compile(g).run({'x': np.ones(3, 'float32')})['y'])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert np.allclose(eval(out.stdout.strip().replace(" ", ",")), 2.0)
