"""Every MSL kernel generated for the op test suite type-checks (see codegen/metal/check.py).

The op tests run in a child pytest with this module as a plugin: it replaces the backends of
the cross-backend harness (tests/optest.py) by one that compiles each graph for Metal, keeps
its kernels and answers with the reference interpreter; the parent type-checks them all.

On a Mac with the Metal runtime, the same plugin adds Metal to the harness's backends, so
every op test also runs on the GPU against PyTorch (bench/metal_check.sh)::

    cd tests && LUMINAL_TEST_METAL_RUN=1 python -m pytest -p test_metal_ops test_ops_*.py
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_OUT = "LUMINAL_TEST_METAL_KERNELS"


# ---------------------------------------------------------------- the plugin (child pytest)


def pytest_configure(config: Any) -> None:
    if os.environ.get("LUMINAL_TEST_METAL_RUN") == "1":
        _run_on_metal()
    path = os.environ.get(_OUT)
    if not path:
        return
    import luminal as lm
    import optest
    from luminal.graph import interp
    from luminal.targets.metal import plan_kernels

    kernels: list[tuple[str, str]] = []
    refused: list[str] = []
    errors: list[str] = []
    # (plan file, inputs+outputs file, bound dims) of every check, for the emulation test
    cases: list[tuple[str, str, dict[str, int]]] = []
    done: dict[int, Any] = {}
    folder = os.path.dirname(path)

    def metal(g: Any, inputs: dict[str, np.ndarray], dims: dict[str, int]) -> Any:
        if id(g) not in done or done[id(g)][0] is not g:
            done.clear()
            plan_path = None
            try:
                cg = lm.compile(g, backend="metal", cache=False)
                kernels.extend(plan_kernels(cg.plan))
                names = [k.name for k in cg.plan.kernels]
                if len(set(names)) != len(names):  # the runtime compiles them as one library
                    errors.append(f"{g.name}: kernel names repeat: {names}")
                plan_path = os.path.join(folder, f"{len(cases):05d}_{g.name}.lmp")
                cg.plan.save(plan_path)
            except ValueError as e:
                (refused if "64-bit floats" in str(e) else errors).append(f"{g.name}: {e}")
            except Exception as e:  # any other failure to build a Metal plan is a bug
                errors.append(f"{g.name}: {type(e).__name__}: {e}")
            done[id(g)] = (g, plan_path)
        want = g.run(inputs, **dims)
        plan_path = done[id(g)][1]
        if plan_path is not None:
            io = os.path.join(folder, f"{len(cases):05d}.npz")
            np.savez(io, **{f"in.{n}": a for n, a in inputs.items()},
                     **{f"out.{n}": a for n, a in want.items()})  # fmt: skip
            cases.append((plan_path, io, interp.bind_dims(g, {**g.weights, **inputs}, dims)))
        return want

    optest.BACKENDS.clear()
    optest.BACKENDS["metal"] = metal

    def write() -> None:
        with open(path, "w") as f:
            json.dump({"kernels": kernels, "refused": refused, "errors": errors,
                       "cases": cases}, f)  # fmt: skip

    config.add_cleanup(write)


def _run_on_metal() -> None:
    """Every harness check also runs the graph's Metal plan on the device."""
    import luminal as lm
    import optest
    from luminal import metal as device

    why = device.unavailable_reason()
    if why is not None:
        raise RuntimeError(f"LUMINAL_TEST_METAL_RUN=1 but Metal is unavailable: {why}")
    done: dict[int, Any] = {}

    def metal(g: Any, inputs: dict[str, np.ndarray], dims: dict[str, int]) -> Any:
        if id(g) not in done or done[id(g)][0] is not g:
            done.clear()
            done[id(g)] = (g, lm.compile(g, backend="metal"))
        return done[id(g)][1].run(inputs, **dims)

    optest.BACKENDS["metal"] = metal


# ---------------------------------------------------------------- the test (parent pytest)

# the op test suite: every file whose checks go through the cross-backend harness
OP_TESTS = sorted(
    os.path.basename(p)
    for p in glob.glob(os.path.join(HERE, "test_ops_*.py"))
    + [
        os.path.join(HERE, f)
        for f in (
            "test_nn_functional.py",
            "test_linalg.py",
            "test_nn_conv.py",
            "test_nn_attention.py",
            "test_nn_modules.py",
        )
    ]  # fmt: skip
)


@pytest.fixture(scope="module")
def collected(tmp_path_factory: Any) -> dict[str, Any]:
    """The op test suite run once in a child pytest with the collector as its backend."""
    out = tmp_path_factory.mktemp("metal_ops") / "kernels.json"
    # the child's conftest gives each test its own plan cache, as in a plain run
    env = {k: v for k, v in os.environ.items() if k != "LUMINAL_PLAN_CACHE_DIR"}
    env = {**env, _OUT: str(out), "LUMINAL_TEST_NVRTC": "0", "LUMINAL_TEST_CUDA": "0",
           "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "test_metal_ops",
                        "-p", "no:cacheprovider", *OP_TESTS],
                       cwd=HERE, env=env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    got: dict[str, Any] = json.loads(out.read_text())
    assert not got["errors"], "graphs that did not build a Metal plan:\n" + "\n".join(
        got["errors"][:20]
    )
    # f64 graphs are refused by name; everything else has kernels
    assert all("64-bit floats" in x for x in got["refused"])
    return got


@pytest.mark.slow  # the op suite runs again in a child process (over a minute)
def test_op_suite_kernels_typecheck(collected: dict[str, Any]) -> None:
    from luminal.codegen.metal import check

    if check.clang() is None:
        pytest.skip(f"{check.CLANG} is not installed (CI installs it)")
    n, failures = check.typecheck([tuple(k) for k in collected["kernels"]])
    made, refused = len(collected["kernels"]), len(collected["refused"])
    print(f"\n{n} distinct MSL kernels of the op test suite type-checked "
          f"({made} generated, {refused} f64 graphs refused)")  # fmt: skip
    assert n > 500
    assert not failures, "\n".join(f"{f.kernel}: {f.message}" for f in failures[:20])


@pytest.mark.slow
def test_op_suite_emulated(collected: dict[str, Any]) -> None:
    """Every op test's Metal plan, run in the host emulation (targets/metal_emu.py),
    gives the reference interpreter's outputs on the op tests' own inputs."""
    from luminal.plan import Plan
    from luminal.targets import metal_emu as emulate
    from optest import compare

    if emulate.compiler() is None:
        pytest.skip("no C++ compiler")
    plans = {p: Plan.load(p) for p in dict.fromkeys(c[0] for c in collected["cases"])}
    emulate.prepare([bytes(k.code).decode() for p in plans.values() for k in p.kernels])
    ran, skipped, bad = 0, 0, []
    for plan_path, io_path, dims in collected["cases"]:
        data = np.load(io_path)
        inputs = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
        try:
            got = emulate.run(plans[plan_path], inputs, **dims)
        except NotImplementedError:  # 4-bit inputs or outputs, library calls
            skipped += 1
            continue
        ran += 1
        for k in data.files:
            if k.startswith("out."):
                try:
                    # f32 arithmetic in another order than the interpreter's: a few ulps,
                    # one of a 16-bit output
                    tol = 1e-2 if data[k].dtype.itemsize == 2 else 1e-4
                    compare(f"{os.path.basename(plan_path)} {k[4:]}", got[k[4:]], data[k],
                            tol, 10 * tol, True)  # fmt: skip
                except AssertionError as e:
                    bad.append(str(e))
    print(f"\n{ran} op checks run in the Metal emulation ({skipped} not emulated)")
    assert ran > 300
    assert not bad, "\n".join(bad[:20])
