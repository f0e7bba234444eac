"""Padded rows of a conv's patch copy (codegen/cpu/kernel.py). Rows shorter than a vector (a
conv's im2col rows of 3, 5 or 7 taps) whose next axis out has a few indices are copied a whole
group per step, that index a constant of an unrolled loop (_grouped_rows); a thread's range of
tasks may start and end inside a group: those rows are copied one by one. Padded rows of any
length run as vectors of lanes. Checked over arbitrary task ranges against the ungrouped
kernel, and end to end against PyTorch."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.functional as F
from luminal.codegen.cpu import kernel as ck
from luminal.codegen.cpu import render_kernel
from luminal.compile import build_plan
from luminal.compiler import kernel_ir as K
from luminal.compiler.lower import lower
from luminal.compiler.pipeline import graph_passes
from luminal.compiler.search import select
from luminal.compiler.stage import stage_strided_reads, summed_major_operands
from luminal.graph import symbolic as sym


def _patch_copy(monkeypatch, k: int, stride: int, pad: int) -> tuple[K.Kernel, list[str]]:
    """The staged patch copy of a conv in row order ((batch, oy, ox, c, ky, kx)), symbolic
    batch n and size h, and its dim names."""
    h, n = lm.dim("h", 4, 300), lm.dim("n", 1, 15)
    g = lm.Graph("conv")
    x = g.input("x", (n, 3, h, h))
    wv = np.random.default_rng(3).standard_normal((16, 3, k, k)).astype(np.float32)
    g.output("y", F.conv2d(x, g.weight("w", data=wv), stride=stride, padding=pad))
    monkeypatch.setenv("LUMINAL_STAGE", "0")
    low = lower(stage_strided_reads(graph_passes(g), frozenset()))
    copy = next(s for s in low.kernels if isinstance(s, K.Kernel))
    assert "cast" in copy.name
    return copy, sorted(low.dims)


def _compile(src: str, tmp_path, name: str) -> ctypes.CDLL:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    c, so = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    c.write_text(src)
    subprocess.run([cc, "-O2", "-march=native", "-fno-math-errno", "-shared", "-fPIC",
                    str(c), "-o", str(so)], check=True)  # fmt: skip
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("k,stride,pad", [(7, 2, 3), (3, 1, 1), (5, 2, 2), (3, 2, 1)])
def test_any_task_range_equals_the_ungrouped_copy(k, stride, pad, tmp_path, monkeypatch):
    copy, names = _patch_copy(monkeypatch, k, stride, pad)
    grouped = render_kernel(copy, names)
    assert "lm_g" in grouped.source, "the short rows were not grouped"
    monkeypatch.setattr(ck, "GROUP_ROWS_MAX", 0)
    plain = render_kernel(copy, names)
    assert "lm_g" not in plain.source
    env = {"h": 13, "n": 2}
    tasks = int(sym.evaluate(grouped.tasks, env))
    n_out = int(np.prod([sym.evaluate(s, env) for s in copy.shape]))
    dims = np.array([env[d] for d in names], np.int64)
    rng = np.random.default_rng(k * 10 + stride)
    x = rng.standard_normal(2 * 3 * 13 * 13).astype(np.float32)
    # ranges that start and end inside groups, as a thread's share of the tasks may
    cuts = sorted({0, 1, tasks - 1, tasks, *rng.integers(0, tasks, 9).tolist()})
    outs = []
    for name, kern in (("grouped", grouped), ("plain", plain)):
        fn = getattr(_compile(kern.source, tmp_path, name), kern.name)
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_int64,
                       ctypes.c_int64]  # fmt: skip
        y = np.full(n_out, np.nan, np.float32)
        args = (ctypes.c_void_p * 2)(y.ctypes.data, x.ctypes.data)
        for lo, hi in zip(cuts, cuts[1:]):
            fn(args, dims.ctypes.data, lo, hi)
        outs.append(y)
    assert not np.isnan(outs[0]).any()
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("k,stride,pad", [(7, 2, 3), (3, 1, 1), (5, 1, 2)])
def test_grouped_patches_match_torch(k, stride, pad, monkeypatch):
    """Through compile (the search keeps the staged copy and a GEMM, or the direct kernel:
    either way the result is PyTorch's), 2 threads, symbolic batch and size."""
    monkeypatch.setenv("LUMINAL_NUM_THREADS", "2")
    h, n = lm.dim("h", 4, 300), lm.dim("n", 1, 15)
    g = lm.Graph("conv")
    x = g.input("x", (n, 3, h, h))
    wv = np.random.default_rng(3).standard_normal((16, 3, k, k)).astype(np.float32)
    g.output("y", F.conv2d(x, g.weight("w", data=wv), stride=stride, padding=pad))
    cg = lm.compile(g)
    for b, size in ((1, 5), (2, 19), (3, 37)):
        xv = np.random.default_rng(size).standard_normal((b, 3, size, size)).astype(np.float32)
        ref = torch.nn.functional.conv2d(torch.from_numpy(xv), torch.from_numpy(wv),
                                         stride=stride, padding=pad)  # fmt: skip
        np.testing.assert_allclose(cg.run({"x": xv})["y"], ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,stride,pad", [(3, 1, 1), (5, 1, 2), (3, 2, 1)])
def test_padded_rows_of_any_length_as_lanes(k, stride, pad, monkeypatch):
    """Staged patches summed axis first ((taps, batch, oy, ox)): a padded row of any length
    runs as vectors of lanes (no window loop with scalar ends), through a GEMM, as PyTorch."""
    h, n = lm.dim("h", 4, 300), lm.dim("n", 1, 15)
    g = lm.Graph("conv")
    x = g.input("x", (n, 3, h, h))
    wv = np.random.default_rng(4).standard_normal((16, 3, k, k)).astype(np.float32)
    g.output("y", F.conv2d(x, g.weight("w", data=wv), stride=stride, padding=pad))
    monkeypatch.setenv("LUMINAL_STAGE", "0")
    unstaged = graph_passes(g)
    low = lower(stage_strided_reads(unstaged, summed_major_operands(unstaged)))
    copy = next(s for s in low.kernels if isinstance(s, K.Kernel))
    src = render_kernel(copy, sorted(low.dims)).source
    assert "lm_vload_f32" in src and "lm_wlo" not in src
    chosen = select.choose_library_calls(low, lambda sub, dims: 1.0 if any(
        isinstance(s, K.LibCall) for s in sub.kernels) else 2.0, "test")  # fmt: skip
    plan = lm.load(build_plan(chosen, "conv").to_bytes())
    for b, size in ((1, 5), (2, 30), (1, 61)):
        xv = np.random.default_rng(size).standard_normal((b, 3, size, size)).astype(np.float32)
        ref = torch.nn.functional.conv2d(torch.from_numpy(xv), torch.from_numpy(wv),
                                         stride=stride, padding=pad)  # fmt: skip
        np.testing.assert_allclose(plan.run({"x": xv})["y"], ref.numpy(), rtol=1e-4, atol=1e-4)
