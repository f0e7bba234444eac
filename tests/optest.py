"""One helper that checks a luminal op against PyTorch on every backend present.

``check_op`` builds a graph from ``fn`` (luminal tensors in, tensor or tuple out), runs it on
every registered backend (the reference interpreter always; compiled plans where the runtime
is built) and compares with ``ref`` run by PyTorch on the same inputs. Inputs may be given
symbolic shapes so one graph is checked at several bindings. Every checked name is recorded in
``COVERED`` (the suite writes the list at the end of the run).

Gradient mode (``LUMINAL_TEST_GRAD=1``, or ``check_grad`` directly): every ``check_op`` also
checks the gradients of its float inputs, from ``luminal.compiler.autograd``, against
``torch.autograd`` (a random cotangent per float output), on the reference interpreter; the
value checks then run on the interpreter only.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

import luminal as lm
from luminal.codegen.cuda import nvrtc
from luminal.compiler import autograd
from luminal.graph import dtypes as dt
from luminal.graph import interp

COVERED: set[str] = set()

# name -> fn(graph, inputs, dims) -> {output: array}; the interpreter is always present.
BACKENDS: dict[
    str, Callable[[lm.Graph, dict[str, np.ndarray], dict[str, int]], dict[str, np.ndarray]]
] = {
    "interp": lambda g, inputs, dims: g.run(inputs, **dims),
}

RNG = np.random.default_rng(0)
GRAD_MODE = os.environ.get("LUMINAL_TEST_GRAD", "0") == "1"
GRAD_COVERED: set[str] = set()
# Where the composed gradient and torch's differ by definition, at points where the op is
# not differentiable: a mismatch there is recorded in GRAD_DIFFS, not raised.
KNOWN_GRAD_DIFFS = {
    "pow": "base 0 or negative base: torch defines the exponent's gradient there (0); the "
    "composition exp2(b log2|a|) gives nan or log|a|",
    "normalize": "a zero vector: torch defines the norm's gradient at 0 as 0; sqrt's is inf",
}
GRAD_DIFFS: list[str] = []

# Plans compiled by the "cpu" backend are saved here with their inputs and the interpreter's
# outputs; tests/test_plans_fresh_process.py reloads every one in a new process. Removed at
# exit (about 50 MB a full run).
PLAN_DIR = tempfile.mkdtemp(prefix="luminal-optest-")
atexit.register(shutil.rmtree, PLAN_DIR, ignore_errors=True)
MANIFEST: list[tuple[str, str, dict[str, int]]] = []  # (plan path, npz path, dims)
_COMPILED: dict[int, Any] = {}
# CUDA kernels of every op graph are compiled by NVRTC when it is installed (the test extras
# have it); LUMINAL_TEST_NVRTC=0 skips that
NVRTC_CHECK = os.environ.get("LUMINAL_TEST_NVRTC", "1") != "0" and nvrtc.available() is None


def _cpu_backend(
    g: lm.Graph, inputs: dict[str, np.ndarray], dims: dict[str, int]
) -> dict[str, np.ndarray]:
    cg = _COMPILED.get(id(g))
    if cg is None or cg[0] is not g:
        cg = (g, lm.compile(g))
        _COMPILED.clear()  # one graph at a time: check_op compiles once, runs every binding
        _COMPILED[id(g)] = cg
        if NVRTC_CHECK:
            # every op graph's CUDA kernels must compile to an sm_90a cubin, GPU or not (a
            # compile error raises here); the plan is not loaded
            lm.compile(g, backend="cuda")
    out = cg[1].run(inputs, **dims)
    k = len(MANIFEST)
    plan_path = os.path.join(PLAN_DIR, f"{k:05d}_{g.name}.lmp")
    data_path = os.path.join(PLAN_DIR, f"{k:05d}.npz")
    cg[1].save(plan_path)
    expect = g.run(inputs, **dims)
    np.savez(
        data_path,
        **{f"in.{n}": a for n, a in inputs.items()},
        **{f"out.{n}": a for n, a in expect.items()},
    )
    bound = interp.bind_dims(g, {**g.weights, **inputs}, dims)
    MANIFEST.append((plan_path, data_path, bound))
    return out


BACKENDS["cpu"] = _cpu_backend


def _device_backend(backend: str) -> Callable[..., dict[str, np.ndarray]]:
    """Runs a graph's plan for ``backend``, compiled once per graph (the latest one kept)."""
    compiled: dict[int, Any] = {}

    def run(g: lm.Graph, inputs: dict[str, np.ndarray], dims: dict[str, int]) -> dict[str, Any]:
        cg = compiled.get(id(g))
        if cg is None or cg[0] is not g:
            cg = (g, lm.compile(g, backend=backend))
            compiled.clear()
            compiled[id(g)] = cg
        return cg[1].run(inputs, **dims)

    return run


# Plans also run on a GPU or a Metal device where one is usable (LUMINAL_TEST_CUDA=0 /
# LUMINAL_TEST_METAL=0 turn that off).
if os.environ.get("LUMINAL_TEST_CUDA", "1") != "0":
    import luminal.cuda

    if luminal.cuda.available():
        BACKENDS["cuda"] = _device_backend("cuda")
if os.environ.get("LUMINAL_TEST_METAL", "1") != "0":
    import luminal.metal

    if luminal.metal.available():
        BACKENDS["metal"] = _device_backend("metal")


def rand(*shape: int, dtype: Any = np.float32, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    d = np.dtype(dtype)
    if d.kind == "f":
        return RNG.uniform(low, high, size=shape).astype(d)
    if d.kind == "b":
        return RNG.random(size=shape) < 0.5
    return RNG.integers(int(low), int(high), size=shape).astype(d)


def _to_torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_op(
    name: str,
    fn: Callable[..., Any],
    ref: Callable[..., Any],
    inputs: Sequence[np.ndarray],
    *,
    shapes: Sequence[Sequence[Any] | None] | None = None,
    more: Sequence[Sequence[np.ndarray]] = (),
    atol: float = 1e-5,
    rtol: float = 1e-4,
    check_dtype: bool = True,
    backends: Sequence[str] | None = None,
) -> lm.Graph:
    """Check ``fn`` against ``ref``; ``shapes`` (optional, per input) may hold dims, and
    ``more`` gives further input lists run through the same graph."""
    COVERED.add(name)
    if GRAD_MODE:
        backends = ["interp"]
    g = lm.Graph(name)
    tensors = []
    for i, a in enumerate(inputs):
        shp = shapes[i] if shapes is not None and shapes[i] is not None else a.shape
        tensors.append(g.input(f"x{i}", shp, dt.to_dtype(a.dtype)))
    outs = _as_tuple(fn(*tensors))
    for k, o in enumerate(outs):
        g.output(f"out{k}", o)
    g.verify()
    for arrays in [inputs, *more]:
        feed = {f"x{i}": a for i, a in enumerate(arrays)}
        with torch.no_grad():
            want = [w.detach().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
                    for w in _as_tuple(ref(*[_to_torch(a) for a in arrays]))]  # fmt: skip
        for bname in backends or list(BACKENDS):
            if bname not in BACKENDS:
                continue
            got = BACKENDS[bname](g, feed, {})
            for k, w in enumerate(want):
                compare(f"{name}[{bname}] out{k}", got[f"out{k}"], w, atol, rtol, check_dtype)
    if GRAD_MODE:
        for arrays in [inputs, *more]:
            check_grad(name, fn, ref, arrays, shapes=shapes, atol=atol, rtol=rtol)
    return g


def check_grad(
    name: str,
    fn: Callable[..., Any],
    ref: Callable[..., Any],
    inputs: Sequence[np.ndarray],
    *,
    shapes: Sequence[Sequence[Any] | None] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    compiled: bool = False,
) -> bool:
    """Gradients of sum(out_k * cotangent_k) over the float outputs w.r.t. the float inputs,
    luminal's against torch.autograd's. Returns False (nothing to check) where torch has no
    gradient: no float input, or no output that depends on one differentiably."""
    floats = [i for i, a in enumerate(inputs) if a.dtype.kind == "f"]
    # inf / nan inputs are value tests: derivatives there are conventions, not calculus
    if not floats or not all(np.isfinite(inputs[i]).all() for i in floats):
        return False
    ts = [_to_torch(a).requires_grad_(a.dtype.kind == "f") for a in inputs]
    try:
        outs = [o for o in _as_tuple(ref(*ts)) if isinstance(o, torch.Tensor)]
    except RuntimeError:
        return False  # an input torch refuses to differentiate (batch_norm's running stats)
    pairs = [(k, o) for k, o in enumerate(outs) if o.grad_fn is not None and o.is_floating_point()]
    if not pairs:
        return False
    cts = [RNG.uniform(-1, 1, tuple(o.shape)).astype(np.float64) for _, o in pairs]
    total = sum((o.double() * torch.from_numpy(c)).sum() for (_, o), c in zip(pairs, cts))
    try:
        tgrads = torch.autograd.grad(total, [ts[i] for i in floats], allow_unused=True)
    except RuntimeError:
        return False  # torch has no derivative here (floor_divide; scatter with a larger src)
    g = lm.Graph(f"{name}_grad")
    tensors = []
    for i, a in enumerate(inputs):
        shp = shapes[i] if shapes is not None and shapes[i] is not None else a.shape
        tensors.append(g.input(f"x{i}", shp, dt.to_dtype(a.dtype)))
    louts = _as_tuple(fn(*tensors))
    loss = None
    for j, (k, _) in enumerate(pairs):
        lo = louts[k]
        ct = g.input(f"ct{j}", lo.shape, lo.dtype)
        term = (lo * ct).sum()
        loss = term if loss is None else loss + term.cast(loss.dtype)
    assert loss is not None
    grads = autograd.gradients(g, loss.edge, [tensors[i].node for i in floats])
    for i, ge in zip(floats, grads):
        gt = lm.Tensor(*ge) if ge is not None else tensors[i] * 0.0
        g.output(f"grad{i}", gt)
    g.verify()
    feed = {f"x{i}": a for i, a in enumerate(inputs)}
    for j, ((k, _), c) in enumerate(zip(pairs, cts)):
        feed[f"ct{j}"] = c.astype(louts[k].dtype.np_type)
    got = lm.compile(g).run(feed) if compiled else g.run(feed)
    GRAD_COVERED.add(name)
    for i, tg in zip(floats, tgrads):
        want = np.zeros(inputs[i].shape) if tg is None else tg.detach().double().numpy()
        scale = max(1.0, float(np.abs(want).max(initial=0.0)))
        try:  # derivatives of approximations (erf, tanh fits) and long sums: looser bounds
            compare(f"{name} grad x{i}", got[f"grad{i}"].astype(np.float64), want,
                    max(10 * atol, 1e-5) * scale, max(10 * rtol, 1e-3), False)  # fmt: skip
        except (AssertionError, ValueError) as e:
            if name not in KNOWN_GRAD_DIFFS:
                raise
            GRAD_DIFFS.append(f"{name}: {e}")
            return False
    return True


def compare(
    what: str, got: np.ndarray, want: np.ndarray, atol: float, rtol: float, check_dtype: bool
) -> None:
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape} != torch {want.shape}")
    if check_dtype and np.dtype(got.dtype) != np.dtype(want.dtype):
        raise AssertionError(f"{what}: dtype {got.dtype} != torch {want.dtype}")
    if want.dtype.kind in "biu":
        if not np.array_equal(got.astype(want.dtype), want):
            bad = np.argwhere(got.astype(want.dtype) != want)[:5]
            raise AssertionError(f"{what}: values differ at {bad.tolist()}")
        return
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    if not np.allclose(g64, w64, atol=atol, rtol=rtol, equal_nan=True):
        if np.isnan(g64).sum() != np.isnan(w64).sum():
            raise AssertionError(f"{what}: {np.isnan(g64).sum()} NaNs, torch has "
                                 f"{np.isnan(w64).sum()}")  # fmt: skip
        err = np.abs(g64 - w64)
        err[np.isnan(err) & np.isnan(g64) & np.isnan(w64)] = 0
        i = np.unravel_index(np.nanargmax(err), err.shape) if err.size else ()
        raise AssertionError(
            f"{what}: max abs err {np.nanmax(err):.3g} at {i} (got {g64[i]!r}, torch {w64[i]!r}); "
            f"atol={atol} rtol={rtol}"
        )


def sym_shape(shape: Sequence[int], which: Mapping[int, Any]) -> tuple:
    """Replace entries of ``shape`` by dims: ``sym_shape((3, 50), {1: seq})``."""
    return tuple(which.get(k, s) for k, s in enumerate(shape))


def check_converts(
    fn: Callable[..., Any], *args: Any, atol: float = 1e-5, rtol: float = 1e-5
) -> None:
    """``fn`` through ``torch.compile`` with luminal's backend (one graph) equals eager, with
    no ATen op left to eager and no plan that failed."""
    import luminal.torch_backend as lt

    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend=lt.luminal_backend, fullgraph=True)(*args)
    assert lt.stats.eager_ops == {}, lt.stats.fallbacks
    assert not lt.stats.failed_plans
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)
