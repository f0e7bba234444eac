"""Every kernel of the SmolLM2-135M (GGUF Q4_1, dequantized in the graph) and all-MiniLM-L6-v2
plans compiles with NVRTC to an sm_90a cubin, through ``luminal.compile(backend="cuda")``
(search included: matmuls become tensor-core gemm kernels). No GPU needed; slow (NVRTC on
several hundred kernels the first time; the cubin cache makes later runs fast)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import luminal as lm
from test_cuda_compile import NVRTC_MISSING, nvrtc_tool

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NVRTC_MISSING is not None, reason=str(NVRTC_MISSING)),
]


def _check_plan(cg: lm.CompiledGraph) -> list[int]:
    """Asserts every kernel is an ELF cubin for sm_90a; returns the gemm kernels' ids."""
    plan = cg.plan
    assert plan.backend == "cuda" and plan.arch == "sm_90a"
    assert plan.kernels
    for k in plan.kernels:
        assert k.format.name == "cubin" and bytes(k.code)[:4] == b"\x7fELF", k.name
    assert all(type(s).__name__ == "Launch" for s in plan.steps)
    return [i for i, k in enumerate(plan.kernels) if k.name.endswith("_gemm")]


def test_smollm2_plan_compiles_to_sm90a(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    from luminal.models import load_gguf, smollm2_path

    monkeypatch.setenv("LUMINAL_CUDA_ARCH", "sm_90a")
    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model, _ = load_gguf(path, max_context=128)
    cg = lm.compile(model.build(), backend="cuda")
    _check_plan(cg)
    assert len(cg.plan.kernels) > 100


def test_minilm_plan_compiles_to_sm90a_with_tensor_core_gemms(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from luminal.models import minilm_dir
    from luminal.models.bert import Bert

    monkeypatch.setenv("LUMINAL_CUDA_ARCH", "sm_90a")
    try:
        d = minilm_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    cg = lm.compile(Bert.from_dir(d).build(), backend="cuda")
    gemms = _check_plan(cg)
    assert len(gemms) >= 6 * 4, "every layer's projections should be gemm kernels"
    tool = nvrtc_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not installed (nvidia-cuda-cuobjdump, in the test extras)")
    f = tmp_path / "g.cubin"
    f.write_bytes(bytes(cg.plan.kernels[gemms[0]].code))
    sass = subprocess.run([tool, "-sass", str(f)], capture_output=True, text=True, check=True)
    assert "HMMA" in sass.stdout
