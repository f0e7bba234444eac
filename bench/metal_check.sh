#!/usr/bin/env bash
# The Metal checks, as one script for an Apple-silicon Mac (never run yet: no Mac has been
# available). Builds luminal (CMake builds csrc/metal when it sees APPLE), prints
# metal_status, runs the Metal tests that need no device (MSL type check, runtime syntax
# check), the op tests with Metal added to the cross-backend harness (every op against
# PyTorch on the GPU), and benchmarks a gemm and a softmax on Metal against luminal on the
# CPU and PyTorch's MPS backend (when torch is installed). Everything lands in OUTDIR; a short
# table is printed last. Each step has a timeout; a failing step does not stop the others.
#
#   bench/metal_check.sh OUTDIR
#
# Environment: PYTHON (default python3); LUMINAL_METAL_CHECK_SKIP_BUILD=1 uses the luminal
# that PYTHON already imports. The Metal runtime needs the Xcode command line tools (clang
# with the Metal, Foundation and MetalPerformanceShaders frameworks).
set -euo pipefail

OUT=${1:?usage: bench/metal_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
SUMMARY="$OUT/steps.tsv"
printf 'step\trc\tseconds\n' >"$SUMMARY"
export LUMINAL_CACHE_DIR="$OUT/cache" PYTHONUNBUFFERED=1

log() { echo "[metal_check $(date +%T)] $*" >&2; }

# step NAME SECONDS CMD...: runs CMD with at most SECONDS, output to OUT/NAME.log; records
# the exit status and never stops the script. (macOS has no `timeout`: perl's alarm is one.)
step() {
  local name=$1 limit=$2 rc start
  shift 2
  log "$name (up to ${limit}s) ..."
  start=$SECONDS
  rc=0
  perl -e 'alarm shift; exec @ARGV' "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >>"$SUMMARY"
  ((rc == 0)) || log "$name: exit $rc (see $OUT/$name.log)"
  return 0
}

build() {
  set -euo pipefail
  if [[ ${LUMINAL_METAL_CHECK_SKIP_BUILD:-0} == 1 ]]; then
    "$PY" -c "import luminal._rt, luminal; print(luminal.__file__)"
    return
  fi
  local venv="$OUT/venv"
  "$PY" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -v "$ROOT[test]"
  "$venv/bin/python" -c "import luminal; print(luminal.__file__)"
}

export OUT PY ROOT
export -f build
step build 900 bash -c build
if [[ ${LUMINAL_METAL_CHECK_SKIP_BUILD:-0} != 1 && -x "$OUT/venv/bin/python" ]]; then
  PY="$OUT/venv/bin/python"
fi
mkdir -p "$OUT/run"
cd "$OUT/run" # so `import luminal` finds the installed package, not ./python
step status 60 "$PY" -c "import luminal, luminal.runtime as r; print(luminal.metal_status()); print(r.backends())"
step metal-tests 300 "$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" \
  --junitxml="$OUT/metal-tests.xml" "$ROOT/tests/test_metal.py" "$ROOT/tests/test_metal_runtime.py"
# the harness's checks with Metal added: every op against PyTorch on the GPU
step op-tests 900 env LUMINAL_TEST_METAL_RUN=1 PYTHONPATH="$ROOT/tests" "$PY" -m pytest -q \
  -p no:cacheprovider -p test_metal_ops --rootdir "$ROOT" --junitxml="$OUT/op-tests.xml" \
  "$ROOT"/tests/test_ops_*.py "$ROOT/tests/test_linalg.py" "$ROOT"/tests/test_nn_*.py
step bench 600 "$PY" - <<'EOF'
"""gemm and softmax: luminal on Metal vs luminal on the CPU vs torch on MPS (median ms)."""
import json
import time

import numpy as np

import luminal as lm


def median_ms(fn, repeats=20):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


rng = np.random.default_rng(0)
rows = []
for name, shape in [("gemm 1024^3 f32", (1024, 1024, 1024)), ("gemm 1x4096x4096 f32", (1, 4096, 4096)),
                    ("softmax 4096x4096 f32", (4096, 4096))]:
    g = lm.Graph(name.split()[0])
    if name.startswith("gemm"):
        m, k, n = shape
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
        g.output("y", g.input("a", a.shape, lm.f32) @ g.input("b", b.shape, lm.f32))
        feed, ref = {"a": a, "b": b}, a @ b
        flops = 2 * m * n * k
    else:
        a = rng.standard_normal(shape, np.float32)
        g.output("y", g.input("a", a.shape, lm.f32).softmax(-1))
        e = np.exp(a - a.max(-1, keepdims=True))
        feed, ref, flops = {"a": a}, e / e.sum(-1, keepdims=True), 0
    row = {"case": name}
    for backend in ("metal", "cpu"):
        try:
            cg = lm.compile(g, backend=backend)
            out = cg.run(feed)["y"]
        except Exception as e:  # the other cases and backends still run
            row[f"{backend}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        row[f"{backend}_err"] = float(np.abs(out - ref).max() / max(1e-6, np.abs(ref).max()))
        row[f"{backend}_ms"] = median_ms(lambda: cg.run(feed))
    try:
        import torch

        if torch.backends.mps.is_available():
            t = {k: torch.from_numpy(v).to("mps") for k, v in feed.items()}
            fn = (lambda: (t["a"] @ t["b"]).cpu()) if "b" in t else (lambda: t["a"].softmax(-1).cpu())
            row["torch_mps_ms"] = median_ms(fn)
    except ImportError:
        pass
    if flops and "metal_ms" in row:
        row["metal_gflops"] = flops / row["metal_ms"] / 1e6
    rows.append(row)
    print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
print(json.dumps({"metal_bench": rows}))
EOF

{
  echo
  echo "== luminal metal_check: $OUT"
  head -n 2 "$OUT/status.log" 2>/dev/null || true
  for f in metal-tests op-tests; do
    printf '%-12s %s\n' "$f:" "$(grep -E '[0-9]+ (passed|failed)' "$OUT/$f.log" | tail -n 1 || echo 'no result')"
  done
  echo
  column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
  echo
  grep -v '^{"metal_bench"' "$OUT/bench.log" 2>/dev/null || true
} | tee "$OUT/table.txt"
