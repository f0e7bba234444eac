"""The C++ runtime from Python: kernels, GEMM, copies, weights, dims, errors, luminal-run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest

from kernel_cache import use_kernel_cache
from luminal import runtime
from luminal.plan import Copy, FileWeight, InlineWeight, KernelFormat, Launch, LibCall, Plan, Role
from test_plan import Sym

ADD = r"""
#include <stdint.h>
void add_f32(void *const *args, const int64_t *dims, int64_t begin, int64_t end) {
  const float *a = args[0], *b = args[1];
  float *c = args[2];
  for (int64_t i = begin; i < end; ++i) c[i] = a[i] + b[i];
}
"""

# One task per row: y[r] = sum_c x[r, c]; the row length comes from dims[1].
ROWSUM = r"""
#include <stdint.h>
void rowsum(void *const *args, const int64_t *dims, int64_t begin, int64_t end) {
  const float *x = args[0];
  float *y = args[1];
  int64_t cols = dims[1];
  for (int64_t r = begin; r < end; ++r) {
    float s = 0.0f;
    for (int64_t c = 0; c < cols; ++c) s += x[r * cols + c];
    y[r] = s;
  }
}
"""

SCALE = r"""
#include <stdint.h>
void scale2(void *const *args, const int64_t *dims, int64_t begin, int64_t end) {
  const float *x = args[0];
  float *y = args[1];
  for (int64_t i = begin; i < end; ++i) y[i] = 2.0f * x[i];
}
"""

seq, rows, cols = Sym.dim("seq"), Sym.dim("rows"), Sym.dim("cols")


def add_plan(lo: int = 1, hi: int = 1 << 20) -> Plan:
    p = Plan()
    p.add_dim("seq", lo, hi)
    a = p.add_buffer("a", "f32", Role.input, (seq,))
    b = p.add_buffer("b", "f32", Role.input, (seq,))
    c = p.add_buffer("c", "f32", Role.output, (seq,))
    k = p.add_kernel("add", KernelFormat.c_source, "add_f32", ADD)
    p.steps.append(Launch(k, [a, b, c], grid=(seq, 1, 1), block=(256, 1, 1)))
    return p


@pytest.fixture(scope="module")
def add_ex() -> runtime.Executor:
    return runtime.load(add_plan())


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n", [1, 3, 50, 783, 4096, 100_003])
def test_elementwise_add_symbolic_dims(add_ex, n) -> None:
    a, b = rand(n, seed=1), rand(n, seed=2)
    out = add_ex.run({"a": a, "b": b})  # seq inferred from a
    np.testing.assert_array_equal(out["c"], a + b)
    assert add_ex({"a": a, "b": b}, seq=n)["c"].shape == (n,)


def test_native_run_is_run_without_the_checks(add_ex) -> None:
    io = add_ex.io
    assert [(e.name, e.role) for e in io] == [("a", Role.input), ("b", Role.input),
                                              ("c", Role.output)]  # fmt: skip
    assert all(e.updates is None and not e.raw and not e.packed for e in io)
    a, b = rand(37, seed=3), rand(37, seed=4)
    shapes = add_ex.native_shapes([37])
    assert shapes == [(37,), (37,), (37,)]
    c = np.empty(shapes[2], io[2].np_dtype)
    add_ex.native_run((37,), [a, b, c])
    np.testing.assert_array_equal(c, add_ex.run({"a": a, "b": b})["c"])
    with pytest.raises((ValueError, RuntimeError)):  # the runtime still checks sizes
        add_ex.native_run((37,), [a, b, np.empty(5, np.float32)])


def test_reduction_with_parallel_tasks() -> None:
    p = Plan()
    p.add_dim("rows", 1, 100_000)
    p.add_dim("cols", 1, 1000)
    x = p.add_buffer("x", "f32", Role.input, (rows, cols))
    y = p.add_buffer("y", "f32", Role.output, (rows,))
    k = p.add_kernel("rowsum", KernelFormat.c_source, "rowsum", ROWSUM)
    p.steps.append(Launch(k, [x, y], grid=(rows, 1, 1), block=(16, 1, 1)))
    ex = runtime.load(p)
    for r, c in [(1, 1), (7, 3), (5000, 33), (40_000, 10)]:
        xs = rand(r, c, seed=r)
        np.testing.assert_allclose(ex.run({"x": xs})["y"], xs.sum(1), rtol=1e-5, atol=1e-4)


def gemm_plan(dtype: str = "f32") -> Plan:
    """C = X @ W (W a weight) then D[b] = A[b] @ B[b]^T (batched, trans_b)."""
    p = Plan()
    p.add_dim("seq", 1, 512)
    x = p.add_buffer("x", dtype, Role.input, (seq, 8))
    w = p.add_buffer("w", dtype, Role.weight, (8, 5))
    c = p.add_buffer("c", dtype, Role.output, (seq, 5))
    a = p.add_buffer("a", dtype, Role.input, (3, seq, 4))
    b = p.add_buffer("b", dtype, Role.input, (3, 6, 4))
    d = p.add_buffer("d", dtype, Role.output, (3, seq, 6))
    wdata = np.arange(40, dtype=np.float64).reshape(8, 5) / 10
    p.weights.append(InlineWeight(w, wdata.astype(np.float32 if dtype == "f32" else np.float64)))
    p.steps.append(LibCall("gemm", {"m": seq, "n": 5, "k": 8}, [x, w, c]))
    p.steps.append(
        LibCall(
            "gemm",
            {
                "m": seq,
                "n": 6,
                "k": 4,
                "trans_b": 1,
                "batch": 3,
                "stride_a": seq * 4,
                "stride_b": 24,
                "stride_c": seq * 6,
                "alpha": 2.0,
                "beta": 0.0,
            },
            [a, b, d],
        )
    )
    return p


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_gemm_libcall(dtype) -> None:
    npt = np.float32 if dtype == "f32" else np.float64
    ex = runtime.load(gemm_plan(dtype))
    wdata = (np.arange(40, dtype=np.float64).reshape(8, 5) / 10).astype(npt)
    for n in (1, 17, 512):
        x, a, b = rand(n, 8).astype(npt), rand(3, n, 4).astype(npt), rand(3, 6, 4).astype(npt)
        out = ex.run({"x": x, "a": a, "b": b})
        np.testing.assert_allclose(out["c"], x @ wdata, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["d"], 2 * a @ b.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)


def test_gemm_descriptor_errors() -> None:
    p = gemm_plan()
    step = p.steps[0]
    assert isinstance(step, LibCall)
    step.fields["mm"] = 3
    with pytest.raises(runtime.PlanError, match="unknown descriptor field 'mm'"):
        runtime.load(p)
    p = gemm_plan()
    step = p.steps[0]
    assert isinstance(step, LibCall)
    step.fields["k"] = 9  # reads past the end of x
    ex = runtime.load(p)
    with pytest.raises(runtime.PlanError, match="step 0 \\(gemm\\).*operand A reaches outside"):
        ex.run({"x": rand(2, 8), "a": rand(3, 2, 4), "b": rand(3, 6, 4)})
    p = gemm_plan()
    p.steps.append(LibCall("conv", {}, []))
    with pytest.raises(runtime.PlanError, match="no library function 'conv'"):
        runtime.load(p)


def copy_plan() -> Plan:
    """y = [2 * x, x]: x -> scratch (Copy), kernel, then a Copy at a symbolic offset."""
    p = Plan()
    p.add_dim("seq", 1, 1000)
    x = p.add_buffer("x", "f32", Role.input, (seq,))
    t = p.add_buffer("t", "f32", Role.scratch, (seq,), offset=0)
    y = p.add_buffer("y", "f32", Role.output, (seq * 2,))
    k = p.add_kernel("scale2", KernelFormat.c_source, "scale2", SCALE)
    p.steps += [
        Copy(t, x, seq * 4),
        Launch(k, [t, y], grid=(seq, 1, 1)),
        Copy(y, x, seq * 4, dst_offset=seq * 4),
    ]
    return p


@pytest.mark.parametrize("backend", ["cpu", "cpu-staged"])
def test_copy_steps_and_scratch(backend) -> None:
    ex = runtime.load(copy_plan(), backend)
    for n in (1, 9, 1000):
        x = rand(n)
        np.testing.assert_array_equal(ex.run({"x": x})["y"], np.concatenate([2 * x, x]))
    assert ex.arena_bytes >= 4000


def test_copy_out_of_bounds_is_refused() -> None:
    p = copy_plan()
    p.steps[2] = Copy(2, 0, seq * 4, dst_offset=seq * 4 + 4)
    ex = runtime.load(p)
    with pytest.raises(runtime.PlanError, match="step 2: copy of 12 bytes .* out of bounds"):
        ex.run({"x": rand(3)})


def weight_plan(file_path: str) -> Plan:
    """y = x + wi + wf, wi inline in the blob, wf from an external file."""
    p = Plan()
    x = p.add_buffer("x", "f32", Role.input, (6,))
    wi = p.add_buffer("wi", "f32", Role.weight, (6,))
    wf = p.add_buffer("wf", "f32", Role.weight, (6,))
    t = p.add_buffer("t", "f32", Role.scratch, (6,), offset=64)
    y = p.add_buffer("y", "f32", Role.output, (6,))
    k = p.add_kernel("add", KernelFormat.c_source, "add_f32", ADD)
    p.steps += [Launch(k, [x, wi, t], grid=(6, 1, 1)), Launch(k, [t, wf, y], grid=(6, 1, 1))]
    p.weights += [
        InlineWeight(wi, np.arange(6, dtype=np.float32)),
        FileWeight(wf, file_path, 16, 24),
    ]
    return p


def write_weights(path) -> np.ndarray:
    wf = np.full(6, 100, np.float32)
    path.write_bytes(b"HEADER..PADDING." + wf.tobytes() + b"trailer")
    return wf


def test_weights_inline_and_external_file(tmp_path) -> None:
    (tmp_path / "data").mkdir()
    wf = write_weights(tmp_path / "data" / "w.bin")
    plan_path = tmp_path / "m.lmp"
    weight_plan("data/w.bin").save(plan_path)
    x = rand(6)
    expected = x + np.arange(6, dtype=np.float32) + wf
    ex = runtime.load(plan_path)  # relative path resolves against the plan's folder
    np.testing.assert_array_equal(ex.run({"x": x})["y"], expected)
    ex = runtime.load(plan_path.read_bytes(), base_dir=tmp_path)
    np.testing.assert_array_equal(ex.run({"x": x})["y"], expected)
    with pytest.raises(RuntimeError, match="weight 'wf': cannot open"):
        runtime.load(plan_path.read_bytes(), base_dir=tmp_path / "elsewhere")
    (tmp_path / "data" / "w.bin").write_bytes(b"short")
    with pytest.raises(RuntimeError, match="weight 'wf': bytes \\[16, \\+24\\) lie outside"):
        runtime.load(plan_path)


def test_a_plan_object_shares_its_inline_weights_with_the_runtime(tmp_path) -> None:
    """Loading a Plan object copies its bytes once into the runtime; the plan's inline weights
    then view that copy (held once), and the plan still serializes to the same bytes."""
    write_weights(tmp_path / "w.bin")
    p = weight_plan(str(tmp_path / "w.bin"))
    before = p.to_bytes()
    assert b"".join(p.parts()) == before
    ex = runtime.Executor(p)
    shared = p.weights[0]
    assert isinstance(shared, InlineWeight) and isinstance(shared.data, np.ndarray)
    assert not shared.data.flags.writeable and shared.data.dtype == np.uint8
    np.testing.assert_array_equal(shared.data.view(np.float32), np.arange(6, dtype=np.float32))
    assert isinstance(p.weights[1], FileWeight)  # file weights stay where they are
    assert p.to_bytes() == before
    x = rand(6)
    got = ex.run({"x": x})["y"]
    del ex  # the view keeps the runtime's bytes alive
    np.testing.assert_array_equal(shared.data.view(np.float32), np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(runtime.Executor(p).run({"x": x})["y"], got)


FRESH = textwrap.dedent(
    """
    import sys, numpy as np
    from luminal import runtime
    ex = runtime.load(sys.argv[1])
    x = np.load(sys.argv[2])
    np.save(sys.argv[3], ex.run({"x": x})["y"])
    """
)


def test_saved_plan_runs_in_a_fresh_process(tmp_path) -> None:
    (tmp_path / "data").mkdir()
    write_weights(tmp_path / "data" / "w.bin")
    plan = weight_plan("data/w.bin")
    plan.save(tmp_path / "m.lmp")
    x = rand(6, seed=5)
    np.save(tmp_path / "x.npy", x)
    here = runtime.load(tmp_path / "m.lmp").run({"x": x})["y"]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            FRESH,
            str(tmp_path / "m.lmp"),
            str(tmp_path / "x.npy"),
            str(tmp_path / "y.npy"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), here)


def luminal_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(runtime.luminal_run_path()), *args], capture_output=True, text=True)


def test_luminal_run_on_npy_inputs(tmp_path) -> None:
    copy_plan().save(tmp_path / "c.lmp")
    x = rand(7)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    proc = luminal_run(
        str(tmp_path / "c.lmp"), "--input", f"x={tmp_path / 'x.npy'}", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(out / "y.npy"), np.concatenate([2 * x, x]))
    # explicit --dim that agrees; the gemm plan with a weight and two outputs
    gemm_plan().save(tmp_path / "g.lmp")
    feeds = {"x": rand(5, 8), "a": rand(3, 5, 4), "b": rand(3, 6, 4)}
    for k, v in feeds.items():
        np.save(tmp_path / f"{k}.npy", v)
    args = [a for k in feeds for a in ("--input", f"{k}={tmp_path / (k + '.npy')}")]
    proc = luminal_run(str(tmp_path / "g.lmp"), *args, "--dim", "seq=5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    want = runtime.load(tmp_path / "g.lmp").run(feeds)
    np.testing.assert_array_equal(np.load(out / "c.npy"), want["c"])
    np.testing.assert_array_equal(np.load(out / "d.npy"), want["d"])


def test_luminal_run_errors(tmp_path) -> None:
    copy_plan().save(tmp_path / "c.lmp")
    np.save(tmp_path / "x.npy", rand(7))
    np.save(tmp_path / "x64.npy", rand(7).astype(np.float64))
    np.save(tmp_path / "big.npy", rand(2000))
    (tmp_path / "bad.lmp").write_bytes(b"LMPL" + bytes(40))
    x = f"x={tmp_path / 'x.npy'}"
    cases = [
        ([str(tmp_path / "c.lmp")], "missing input 'x'"),
        (
            [str(tmp_path / "c.lmp"), "--input", x, "--input", f"z={tmp_path / 'x.npy'}"],
            "no input 'z'",
        ),
        ([str(tmp_path / "c.lmp"), "--input", f"x={tmp_path / 'x64.npy'}"], "dtype '<f8'"),
        (
            [str(tmp_path / "c.lmp"), "--input", f"x={tmp_path / 'big.npy'}"],
            "'seq' = 2000 is outside",
        ),
        ([str(tmp_path / "c.lmp"), "--input", x, "--dim", "seq=8"], "input 'x' has shape"),
        ([str(tmp_path / "bad.lmp")], "plan format version 0"),
        ([str(tmp_path / "nope.lmp")], "cannot open plan"),
        ([str(tmp_path / "c.lmp"), "--input", "x"], "expects NAME=VALUE"),
    ]
    for args, msg in cases:
        proc = luminal_run(*args, "--out", str(tmp_path / "o"))
        assert proc.returncode != 0, args
        assert msg in proc.stderr, (args, proc.stderr)


def test_bad_inputs_raise_clear_errors(add_ex) -> None:
    a = rand(4)
    with pytest.raises(ValueError, match=r"missing input\(s\) \['b'\]"):
        add_ex.run({"a": a})
    with pytest.raises(ValueError, match=r"unknown input\(s\) \['z'\]"):
        add_ex.run({"a": a, "b": a, "z": a})
    with pytest.raises(TypeError, match="input 'b' has dtype float64, expected float32"):
        add_ex.run({"a": a, "b": a.astype(np.float64)})
    with pytest.raises(ValueError, match=r"input 'b' has shape \(5,\), expected \(4,\)"):
        add_ex.run({"a": a, "b": rand(5)})
    with pytest.raises(ValueError, match=r"input 'a' has shape \(4,\), expected \(3,\)"):
        add_ex.run({"a": a, "b": a}, seq=3)
    with pytest.raises(ValueError, match=r"dim 'seq' = 0 is outside its range \[1, 1048576\]"):
        add_ex.run({"a": rand(0), "b": rand(0)})
    with pytest.raises(ValueError, match="unknown dim 'sq'"):
        add_ex.run({"a": a, "b": a}, sq=4)
    with pytest.raises(TypeError, match="dim 'seq' must be an int"):
        add_ex.run({"a": a, "b": a}, seq=4.0)
    with pytest.raises(ValueError, match="dim 'seq' is not given"):
        add_ex.shapes()
    assert add_ex.shapes(seq=3) == {"a": (3,), "b": (3,), "c": (3,)}


def test_inputs_used_in_place_and_converted() -> None:
    ex = runtime.load(add_plan())
    a = rand(10)
    ro = a.copy()
    ro.flags.writeable = False
    strided = rand(20)[::2]
    out = ex.run({"a": ro, "b": strided})["c"]
    np.testing.assert_array_equal(out, a + strided)
    out = ex.run({"a": a.tolist(), "b": a})["c"]  # lists are converted to the plan dtype
    np.testing.assert_allclose(out, 2 * a)


def test_expression_overflow_names_the_expression() -> None:
    p = Plan()
    p.add_dim("seq", 1, 2**62)
    x = p.add_buffer("x", "f32", Role.input, (seq,))
    p.add_buffer("t", "f32", Role.scratch, (seq * 1024,), offset=0)
    y = p.add_buffer("y", "f32", Role.output, (seq,))
    p.steps.append(Copy(y, x, seq * 4))
    ex = runtime.load(p)
    with pytest.raises(
        ValueError, match=r"expression #\d+ = \(seq \* 1024\) \(shape of .t.\): int64 overflow"
    ):
        ex.shapes(seq=2**60)


def test_exotic_dtypes_cross_as_ml_dtypes() -> None:
    """bf16 and i4 pass through a byte copy unchanged (i4 packed two per byte in the plan)."""
    for dt, npt in [
        ("bf16", ml_dtypes.bfloat16),
        ("i4", ml_dtypes.int4),
        ("f8e4m3", ml_dtypes.float8_e4m3fn),
    ]:
        p = Plan()
        p.add_dim("seq", 1, 100)
        x = p.add_buffer("x", dt, Role.input, (seq, 3))
        y = p.add_buffer("y", dt, Role.output, (seq, 3))
        nbytes = (seq * 3 + 1) // 2 if dt == "i4" else seq * (3 * np.dtype(npt).itemsize)
        p.steps.append(Copy(y, x, nbytes))
        ex = runtime.load(p)
        xs = np.arange(-7, 8).astype(np.float32).reshape(5, 3).astype(npt)
        out = ex.run({"x": xs})["y"]
        assert out.dtype == np.dtype(npt) and out.shape == (5, 3)
        assert out.tolist() == xs.tolist(), dt


def test_compiler_errors_carry_the_log(tmp_path, monkeypatch) -> None:
    use_kernel_cache(monkeypatch, tmp_path)
    p = add_plan()
    p.kernels[0].code = b"void add_f32(void) { this is not C; }"
    with pytest.raises(RuntimeError, match="C compiler failed(.|\n)*error"):
        runtime.load(p)
    p = add_plan()
    p.kernels[0].entry = "missing_entry"
    with pytest.raises(RuntimeError, match="entry point 'missing_entry' not found"):
        runtime.load(p)


def test_backend_registry() -> None:
    assert runtime.backends()[0] == "cpu" and set(runtime.backends()) <= {"cpu", "cuda"}
    if "cuda" not in runtime.backends():
        with pytest.raises(RuntimeError, match="built without CUDA|CUDA unavailable: "):
            runtime.load(add_plan(), "cuda")
    with pytest.raises(RuntimeError, match="unknown backend 'tpu'"):
        runtime.load(add_plan(), "tpu")
    p = add_plan()
    p.backend = "cuda"
    with pytest.raises(RuntimeError, match="compiled for backend 'cuda'"):
        runtime.load(p)
    p = add_plan()
    p.kernels[0].format = KernelFormat.ptx
    with pytest.raises(RuntimeError, match="cannot run kernel 'add' of format ptx"):
        runtime.load(p)


def test_corrupt_plans_raise_plan_error(tmp_path) -> None:
    data = add_plan().to_bytes()
    path = tmp_path / "x.lmp"
    for bad, msg in [
        (data[:-3], "truncated"),
        (b"XXXX" + data[4:], "bad magic"),
        (data[:4] + b"\x07" + data[5:], "version 7 is not supported"),
        (data[:200] + bytes([data[200] ^ 0x10]) + data[201:], "checksum mismatch"),
        (b"", "shorter than"),
    ]:
        path.write_bytes(bad)
        with pytest.raises(runtime.PlanError, match=msg):
            runtime.load(path)
        with pytest.raises(runtime.PlanError, match=msg):
            runtime.load(bad)
    assert issubclass(runtime.PlanError, ValueError)


def test_concurrent_runs_share_one_executor() -> None:
    ex = runtime.load(add_plan())
    errors: list[str] = []

    def work(seed: int) -> None:
        for i in range(50):
            n = 1 + (seed * 131 + i * 977) % 5000
            a, b = rand(n, seed=seed), rand(n, seed=i)
            if not np.array_equal(ex.run({"a": a, "b": b})["c"], a + b):
                errors.append(f"thread {seed} iteration {i}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("shared_b", [False, True])
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_split_across_threads(trans_a: int, trans_b: int, shared_b: bool) -> None:
    """Sizes that the CPU backend splits over its threads, by rows of C (many rows) or by
    columns (few rows), with transposes, a batch and alpha: every part lands in its place.
    ``shared_b``: one B for the whole batch (a linear layer over batch x seq rows), which the
    backend runs as one gemm of batch*m rows when A's rows are contiguous."""
    n_, k_ = 300, 70
    nb = 1 if shared_b else 2
    p = Plan()
    p.add_dim("m", 1, 2000)
    m = Sym.dim("m")
    a = p.add_buffer("a", "f32", Role.input, (2, k_, m) if trans_a else (2, m, k_))
    b = p.add_buffer("b", "f32", Role.input, (nb, n_, k_) if trans_b else (nb, k_, n_))
    c = p.add_buffer("c", "f32", Role.output, (2, m, n_))
    fields = {"m": m, "n": n_, "k": k_, "trans_a": trans_a, "trans_b": trans_b, "batch": 2,
              "stride_a": m * k_, "stride_b": 0 if shared_b else n_ * k_, "stride_c": m * n_,
              "alpha": 0.5}  # fmt: skip
    if trans_a:
        fields["lda"] = m
    p.steps.append(LibCall("gemm", fields, [a, b, c]))
    ex = runtime.load(p)
    for rows in (5, 33, 300, 1001):
        av = rand(*((2, k_, rows) if trans_a else (2, rows, k_)), seed=rows)
        bv = rand(*((nb, n_, k_) if trans_b else (nb, k_, n_)), seed=rows + 1)
        opa = av.transpose(0, 2, 1) if trans_a else av
        opb = bv.transpose(0, 2, 1) if trans_b else bv
        out = ex.run({"a": av, "b": bv}, m=rows)["c"]
        np.testing.assert_allclose(out, 0.5 * opa @ opb, rtol=1e-4, atol=1e-4)
