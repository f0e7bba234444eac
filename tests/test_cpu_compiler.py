"""The C compiler behind the cpu backend: the precompiled prelude, one cached library per
kernel (compiled in parallel, shared by every plan that holds the kernel), and
``luminal.compile.prepare`` (many plans' kernels at once)."""

from __future__ import annotations

import glob
import os
import re
import time

import numpy as np
import pytest

from kernel_cache import use_kernel_cache
from luminal import runtime
from luminal.codegen.cpu.kernel import PRELUDE
from luminal.compile import prepare
from luminal.plan import KernelFormat, Launch, Plan, Role


def _chain(n: int, scale: float) -> tuple[Plan, np.ndarray, np.ndarray]:
    """A plan of n generated-style kernels (each starts with the CPU prelude), applied one
    after another to x, with its input and expected output."""
    p = Plan()
    bufs = [p.add_buffer("x", "f32", Role.input, (37,))]
    bufs += [p.add_buffer(f"t{i}", "f32", Role.output, (37,)) for i in range(1, n)]
    bufs.append(p.add_buffer("y", "f32", Role.output, (37,)))
    for i in range(n):
        code = PRELUDE + (
            f"void step{i}(void *const *args, const int64_t *dims, int64_t begin, int64_t end) {{\n"
            "  const float *x = args[0]; float *y = args[1];\n"
            f"  for (int64_t j = begin; j < end; ++j) y[j] = lm_maxf(x[j], 0.0f) * {scale}f"
            f" + lm_exp2f(x[j] * 0.125f) - {i}.0f;\n}}\n"
        )
        k = p.add_kernel(f"step{i}", KernelFormat.c_source, f"step{i}", code.encode())
        p.steps.append(Launch(k, [bufs[i], bufs[i + 1]], grid=(37, 1, 1), block=(8, 1, 1)))
    xv = np.random.default_rng(n).standard_normal(37).astype(np.float32)
    want = xv.astype(np.float64)
    for i in range(n):
        want = np.maximum(want, 0) * scale + np.exp2(want * 0.125) - i
    return p, xv, want


def _libs(cache: str) -> set[str]:
    """The kernels in the cache: each has its own library or a ``.ref`` to a group's."""
    names = (os.path.basename(p) for p in glob.glob(os.path.join(cache, "cpu-*")))
    return {n for n in names if re.fullmatch(r"cpu-[0-9a-f]{16}\.(so|ref)", n)}


def _groups(cache: str) -> list[str]:
    return glob.glob(os.path.join(cache, "cpu-group-*.so"))


def _check(plan: Plan, xv: np.ndarray, want: np.ndarray) -> None:
    got = runtime.Executor(plan).run({"x": xv})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_prelude_is_precompiled_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(tmp_path))
    for n, scale in [(1, 0.5), (2, 0.75), (3, 1.25)]:
        _check(*_chain(n, scale))
    assert len(_libs(str(tmp_path))) == 6  # one per kernel
    assert len(glob.glob(str(tmp_path / "pch-*.h.gch"))) == 1  # one prelude, one header


def test_the_prelude_can_be_precompiled_ahead(tmp_path, monkeypatch) -> None:
    from luminal import _rt

    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(tmp_path))
    header = _rt.precompile_prelude(PRELUDE)
    assert os.path.dirname(header) == str(tmp_path) and os.path.exists(header + ".gch")
    _check(*_chain(2, 0.5))  # the kernels' prelude is that one: no second header
    assert glob.glob(str(tmp_path / "pch-*.h.gch")) == [header + ".gch"]
    assert _rt.precompile_prelude("int no_prelude;\n") == ""


def test_only_the_most_recent_preludes_are_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(tmp_path))
    for i in range(5):  # preludes of earlier versions, used 1..5 days ago
        for ext in (".h", ".h.gch"):
            p = tmp_path / f"pch-old{i}{ext}"
            p.write_bytes(b"x")
            os.utime(p, (time.time() - 86400 * (i + 1),) * 2)
    _check(*_chain(1, 0.7))
    kept = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "pch-*.h.gch")))
    assert len(kept) == 4 and [k for k in kept if k.startswith("pch-old")] == [
        "pch-old0.h.gch", "pch-old1.h.gch", "pch-old2.h.gch"
    ]  # fmt: skip
    assert not (tmp_path / "pch-old3.h").exists() and not (tmp_path / "pch-old4.h").exists()


def test_a_missing_or_corrupt_precompiled_header_is_not_fatal(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(tmp_path))
    _check(*_chain(1, 0.3))
    (gch,) = glob.glob(str(tmp_path / "pch-*.h.gch"))
    with open(gch, "r+b") as f:  # damaged: the compiler must not trust it
        f.seek(64)
        f.write(b"\xff" * 4096)
    _check(*_chain(2, 0.3))
    for p in glob.glob(str(tmp_path / "pch-*")):  # gone (cache cleared by another process)
        os.remove(p)
    _check(*_chain(3, 0.3))
    _check(*_chain(4, 0.3))


def test_a_kernel_is_compiled_once_for_every_plan_that_holds_it(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    plan, xv, want = _chain(12, 0.9)  # twelve kernels, compiled in parallel
    _check(plan, xv, want)
    made = _libs(str(tmp_path))
    assert len(made) == 12
    shorter = _chain(5, 0.9)  # its kernels are the first five of the longer chain
    _check(*shorter)
    assert _libs(str(tmp_path)) == made


def test_kernels_that_differ_only_in_their_names_share_a_library(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    plan, xv, want = _chain(2, 0.8)
    _check(plan, xv, want)
    made = _libs(str(tmp_path))
    for k in plan.kernels:  # as a merged plan renames a later variant's kernels
        k.code = bytes(k.code).replace(f"void {k.entry}(".encode(), f"void v1_{k.entry}(".encode())
        k.entry = k.name = f"v1_{k.entry}"
    _check(plan, xv, want)
    assert _libs(str(tmp_path)) == made


def test_prepare_compiles_what_executors_load(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    cases = [_chain(n, s) for n, s in [(1, 0.4), (2, 0.6), (1, 0.4), (3, 1.1)]]
    prepare([c[0] for c in cases], jobs=2)
    made = _libs(str(tmp_path))
    assert len(made) == 6  # one per kernel: the repeated plan's kernel is compiled once
    for c in cases:
        _check(*c)
    assert _libs(str(tmp_path)) == made  # every executor found its kernels compiled
    prepare([])


def test_a_plans_missing_kernels_compile_in_groups(tmp_path, monkeypatch) -> None:
    """Twelve missing kernels compile as at most one group per core, not twelve compiler runs;
    each is then found by its own text: a plan holding some of them compiles nothing."""
    use_kernel_cache(monkeypatch, tmp_path)
    _check(*_chain(12, 1.3))
    groups = _groups(str(tmp_path))
    assert 1 <= len(groups) <= max(2, os.cpu_count() or 1)
    made = _libs(str(tmp_path))
    assert len(made) == 12 and all(n.endswith(".ref") for n in made)
    before = sorted(os.listdir(tmp_path))
    _check(*_chain(5, 1.3))
    assert sorted(os.listdir(tmp_path)) == before


def test_kernels_of_one_prelude_compile_as_one_group_per_job(tmp_path, monkeypatch) -> None:
    """Small kernels after a long shared prelude (a search's candidates) are split over the
    jobs: the prelude is compiled once per group, so it does not count as the class's work."""
    use_kernel_cache(monkeypatch, tmp_path)
    plan, xv, want = _chain(12, 1.7)
    prepare([plan], jobs=2)
    assert len(_groups(str(tmp_path))) == 2
    assert len(_libs(str(tmp_path))) == 12
    _check(plan, xv, want)


def test_a_group_that_fails_compiles_its_kernels_alone(tmp_path, monkeypatch) -> None:
    """One broken kernel among good ones: the error is its own, and the good ones are cached."""
    use_kernel_cache(monkeypatch, tmp_path)
    plan = _chain(4, 0.2)[0]
    k = plan.kernels[2]
    k.code = bytes(k.code).replace(b"y[j] = ", b"y[j] = not C;")
    with pytest.raises(RuntimeError, match=r"C compiler failed(.|\n)*kernel:\d+:\d+: error.*not"):
        runtime.Executor(plan)
    # the good ones: alone after the failed group, or in a group without the broken one
    assert len(_libs(str(tmp_path))) == 3


def test_a_kernel_with_its_own_macros_is_not_grouped(tmp_path, monkeypatch) -> None:
    """A #define after the prelude would reach the next kernel of a group: that kernel gets a
    library of its own."""
    use_kernel_cache(monkeypatch, tmp_path)
    plan = _chain(3, 0.6)[0]
    k = plan.kernels[1]
    k.code = bytes(k.code).replace(b"void step1(", b"#define lm_maxf(a, b) 0.0f\nvoid step1(")
    ex = runtime.Executor(plan)
    assert len(_groups(str(tmp_path))) <= 1
    own = [n for n in _libs(str(tmp_path)) if n.endswith(".so")]
    assert len(own) == 1  # the kernel with the macro
    x = np.random.default_rng(3).standard_normal(37).astype(np.float32)
    y = x.astype(np.float64)
    for i in range(3):  # kernel 1 reads 0 for lm_maxf, the others are unchanged
        y = (np.maximum(y, 0) if i != 1 else 0.0) * 0.6 + np.exp2(y * 0.125) - i
    np.testing.assert_allclose(ex.run({"x": x})["y"], y, rtol=2e-4, atol=2e-4)


def test_a_reference_to_a_missing_group_is_a_miss(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    plan, xv, want = _chain(4, 0.45)
    _check(plan, xv, want)
    for g in _groups(str(tmp_path)):  # removed by hand, or by another process
        os.remove(g)
    _check(plan, xv, want)
    assert _groups(str(tmp_path))


def test_prepare_reports_bad_input(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    plan = _chain(1, 0.5)[0]
    with pytest.raises(ValueError, match="jobs must be >= 0"):
        prepare([plan], jobs=-1)
    with pytest.raises(RuntimeError, match="nosuch"):
        prepare([plan], backend="nosuch")
    bad = _chain(2, 0.5)[0]
    bad.kernels[0].code = b"void broken(void) { this is not C; }"
    with pytest.raises(RuntimeError, match="C compiler failed(.|\n)*error"):
        prepare([plan, bad])


@pytest.mark.skipif(
    not any(os.access(os.path.join(d, c), os.X_OK) for d in os.environ.get("PATH", "").split(":")
            for c in ("clang", "clang-19")),
    reason="no clang on PATH",
)  # fmt: skip
def test_clang_compiles_the_kernels(tmp_path):
    # GCC-only flags (-fno-tree-*) are errors to Clang: CC=clang must still work
    import subprocess
    import sys

    cc = next(c for c in ("clang-19", "clang") if any(
        os.access(os.path.join(d, c), os.X_OK) for d in os.environ["PATH"].split(":")))  # fmt: skip
    code = (
        "import numpy as np, luminal as lm\n"
        "g = lm.Graph('t'); x = g.input('x', (5, 37)); g.output('y', (x * 2.0).exp().sum(-1))\n"
        "a = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)\n"
        "y = lm.compile(g).run({'x': a})['y']\n"
        "assert np.allclose(y, np.exp(a * 2).sum(-1), rtol=1e-4), y\n"
    )
    env = {**os.environ, "CC": cc, "LUMINAL_CACHE_DIR": str(tmp_path), "LUMINAL_PLAN_CACHE": "0"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
