"""Every MSL kernel of the SmolLM2-135M (GGUF Q4_1, dequantized in the graph) and
all-MiniLM-L6-v2 plans type-checks (codegen/metal/check.py), through
``luminal.compile(backend="metal")``; matmuls become simdgroup-matrix gemm kernels. No Mac
needed; slow (a whole-model compile each)."""

from __future__ import annotations

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
    cg = lm.compile(Bert.from_dir(d).build(), backend="metal", load=False)
    gemms = _typecheck(cg, "all-MiniLM-L6-v2")
    assert gemms >= 6 * 4, "every layer's projections should be gemm kernels"
