"""bench/kernels.py runs end to end and ends with the JSON summary (no timing assertions)."""

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")

REQUIRED = (
    "gemm_vs_best_blas",
    "membound_frac_bw_min",
    "attention_vs_torch_sdpa",
    "linear_vs_best_blas_min",
    "block_compile_cold_s",
    "block_compile_warm_s",
    "kernels",
)


@pytest.mark.slow  # 15-50 s: a bench run with torch and luminal children
def test_quick_softmax_ends_with_json_summary():
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell")  # the bench must re-exec without it
    p = subprocess.run(
        [sys.executable, os.path.join(BENCH, "kernels.py"), "--quick", "--only", "softmax",
         "--skip-torch-compile"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    for key in REQUIRED:
        assert key in summary, key
    assert summary["blas_env_was_set"] == ["OPENBLAS_CORETYPE"]
    row = summary["kernels"]["softmax"]
    # every contender either has a time or says why not
    for name in ("luminal", "numpy", "torch_eager", "torch_compile"):
        assert row.get(f"{name}_s") or row["errors"].get(name), (name, row)
    assert "OPENBLAS_CORETYPE" in p.stdout
