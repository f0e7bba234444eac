"""Every MSL kernel of the SmolLM2-135M (GGUF Q4_1, dequantized in the graph) and
all-MiniLM-L6-v2 plans type-checks (codegen/metal/check.py), through
``luminal.compile(backend="metal")``; matmuls become simdgroup-matrix gemm kernels; the MiniLM
plan run in the host emulation (targets/metal_emu.py) gives the CPU plan's outputs. No Mac
needed; slow (a whole-model compile each)."""

from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
from luminal.codegen.metal import check
from luminal.plan import KernelFormat
from luminal.targets.metal import plan_kernels

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(check.clang() is None, reason=f"{check.CLANG} not installed"),
]


def _typecheck(cg: lm.CompiledGraph, name: str) -> int:
    plan = cg.plan
    assert plan.backend == "metal" and plan.kernels
    assert all(k.format == KernelFormat.msl for k in plan.kernels)
    n, failures = check.typecheck(plan_kernels(plan))
    print(f"\n{name}: {n} MSL kernels type-checked")
    assert n == len(plan.kernels)
    # the runtime compiles a plan's kernels as one library: their names must differ
    assert len({k.name for k in plan.kernels}) == len(plan.kernels)
    assert not failures, "\n".join(f"{f.kernel}: {f.message}" for f in failures[:20])
    return sum("simdgroup_multiply_accumulate" in bytes(k.code).decode() for k in plan.kernels)


def test_smollm2_plan_typechecks() -> None:
    pytest.importorskip("gguf")
    from luminal.models import load_gguf, smollm2_path

    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model, _ = load_gguf(path, max_context=128)
    cg = lm.compile(model.build(), backend="metal", load=False)
    _typecheck(cg, "SmolLM2-135M")
    assert len(cg.plan.kernels) > 100


def test_minilm_plan_typechecks_with_simdgroup_gemms() -> None:
    from luminal.models import minilm_dir
    from luminal.models.bert import Bert

    try:
        d = minilm_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    g = Bert.from_dir(d).build()
    cg = lm.compile(g, backend="metal", load=False)
    gemms = _typecheck(cg, "all-MiniLM-L6-v2")
    assert gemms >= 6 * 4, "every layer's projections should be gemm kernels"
    # the whole plan run in the host emulation of its Metal kernels gives the CPU plan's
    # outputs (a padded batch: masked attention rows included)
    from luminal.targets import metal_emu

    if metal_emu.compiler() is None:
        return
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30000, (2, 9)).astype(np.int32)
    mask = np.ones((2, 9), np.int32)
    mask[1, 6:] = 0
    feed = {"input_ids": ids, "attention_mask": mask}
    got = metal_emu.run(cg.plan, feed, batch=2, seq=9)
    want = lm.compile(g).run(feed)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, atol=2e-5, rtol=1e-4, err_msg=name)
